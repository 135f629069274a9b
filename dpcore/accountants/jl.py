"""The JL accountant: certified epsilon for DP-SGD-JL (Bu et al. 2021, Lemma 4.1 and Thm 4.1).

One DP-SGD-JL step adds Gaussian noise to a sum in which the worst example's contribution has the
*random* norm ``C sqrt(r / X)``, ``X ~ chi^2_r`` (its gradient norm estimated from r random
projections). The step's dominating pairs are built in :mod:`dpcore.pld.jl_pairs` (worst case
over the gradient norm, shift law discretised in both directions), subsampled with probability q
and composed T times by FFT like every PLD; the CLT does not apply. The answer is an interval
``[lower, upper]``: ``upper`` is certified (up to floating-point roundoff, as for the PLD
accountant), and its width is the numerical error, dominated by the discretisation of the shift
law (``bins``) rather than by the loss grid, so the grid is fixed (``grid_spacing``) instead of
refined.

Gaussian, Laplace and (epsilon, delta) events are accounted exactly as by the PLD accountant, so
a run mixing DP-SGD and DP-SGD-JL steps is composed in one place.
"""

from __future__ import annotations

from typing import Any

from dpcore.accountants.base import handles
from dpcore.accountants.pld import PldAccountant, _Direction
from dpcore.events import DpEvent, JLGaussianEvent, PoissonSampledEvent
from dpcore.mechanisms.noise_range import SIGMA_HUGE, is_huge, is_noiseless
from dpcore.pld.jl_pairs import JLStepPair, jl_step_pairs
from dpcore.validation import check_count, check_positive

__all__ = ["JlAccountant"]


def _jl_parameters(event: DpEvent) -> tuple[float, JLGaussianEvent] | None:
    if isinstance(event, JLGaussianEvent):
        return 1.0, event
    if isinstance(event, PoissonSampledEvent) and isinstance(event.event, JLGaussianEvent):
        return event.sampling_probability, event.event
    return None


class JlAccountant(PldAccountant):
    """PLD accounting that also analyses DP-SGD-JL steps (``JLGaussianEvent``).

    Args:
        grid_spacing: loss-grid spacing for JL steps (default 1e-3).
        bins: probability bins of the shift law (more: a narrower interval, slower).

    Example:
        >>> from dpcore.events import JLGaussianEvent, PoissonSampledEvent
        >>> step = PoissonSampledEvent(0.01, JLGaussianEvent(1.0, 1000))
        >>> interval = JlAccountant().compose(step, 1000).get_epsilon_interval(1e-5)
        >>> 1.7 < interval.lower <= interval.upper < 1.9  # DP-SGD alone: [1.824, 1.828]
        True
    """

    name = "jl"

    def __init__(self, grid_spacing: float = 1e-3, bins: int = 400) -> None:
        super().__init__()
        self._jl_spacing = check_positive("grid_spacing", grid_spacing)
        self._bins = check_count("bins", bins, minimum=8)
        self._pairs: dict[tuple[DpEvent, bool], tuple[JLStepPair, JLStepPair]] = {}

    def config(self) -> dict[str, Any]:
        return {"grid_spacing": self._jl_spacing, "bins": self._bins}

    @handles((JLGaussianEvent,), (PoissonSampledEvent, JLGaussianEvent))
    def _jl(self, event: DpEvent, count: int) -> None:
        parameters = _jl_parameters(event)
        if parameters is None or parameters[0] == 0:
            return
        q, sigma = parameters[0], parameters[1].noise_multiplier
        self._clamped |= is_huge(sigma)  # see PldAccountant: clamped to SIGMA_HUGE below
        self._record(event, count, is_noiseless(sigma), q)

    def _jl_pairs(self, event: DpEvent, pessimistic: bool) -> tuple[JLStepPair, JLStepPair]:
        key = (event, pessimistic)
        if key not in self._pairs:
            parameters = _jl_parameters(event)
            assert parameters is not None  # only called for JL events
            q, jl_event = parameters
            self._pairs[key] = jl_step_pairs(
                sampling_probability=q,
                noise_multiplier=min(jl_event.noise_multiplier, SIGMA_HUGE),
                jl_dimension=jl_event.jl_dimension,
                pessimistic=pessimistic,
                bins=self._bins,
            )
        return self._pairs[key]

    def _has_jl(self) -> bool:
        return any(_jl_parameters(event) is not None for event in self._counts)

    def _step_pmfs(self, event: DpEvent, spacing: float) -> list[_Direction]:
        if _jl_parameters(event) is None:
            return super()._step_pmfs(event, spacing)
        upper_remove, upper_add = self._jl_pairs(event, pessimistic=True)
        lower_remove, lower_add = self._jl_pairs(event, pessimistic=False)
        return [
            (upper_remove.pessimistic(spacing), lower_remove.optimistic(spacing)),
            (upper_add.pessimistic(spacing), lower_add.optimistic(spacing)),
        ]

    def _step_width(self, event: DpEvent) -> float:
        if _jl_parameters(event) is None:
            return super()._step_width(event)
        remove, _ = self._jl_pairs(event, pessimistic=True)
        return remove.high - remove.low

    def _start_spacing(self) -> float:
        if self._has_jl():
            return self._jl_spacing
        return super()._start_spacing()

    def _next_spacing(self, spacing: float, width: float) -> float | None:
        if self._has_jl():
            return None  # the width comes from the shift bins; a finer grid would not help
        return super()._next_spacing(spacing, width)
