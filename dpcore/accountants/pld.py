"""Tight accounting by composing privacy loss distributions, with certified two-sided bounds.

Every supported step is discretised twice on a common loss grid: pessimistically (a pair that
dominates the true one) and optimistically (a pair it dominates); see :mod:`dpcore.pld`. Both are
composed exactly by FFT (with a Chernoff-bounded truncation whose mass is accounted for), so

    lower <= true epsilon(delta) <= upper

holds for the composition, up to floating-point roundoff, which is estimated and added too.
Under add/remove-one neighbouring the "remove" and "add" dominating pairs are composed separately
and the larger answer is reported (Zhu, Dong, Wang 2022, Sec. 4). When no grid spacing is given,
the grid is refined until the interval is narrower than ``relative_tolerance`` (relative).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dpcore.accountants.base import PrivacyAccountant, handles
from dpcore.errors import InvalidParameterError
from dpcore.events import (
    DpEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
)
from dpcore.mechanisms.noise_range import SIGMA_HUGE, is_huge, is_noiseless
from dpcore.pld.loss_pmf import LossPmf, compose_many
from dpcore.pld.pairs import (
    LOSS_CAP,
    epsilon_delta_pair,
    laplace_pair,
    subsampled_gaussian_pairs,
)
from dpcore.validation import check_delta, check_epsilon, check_positive

__all__ = ["DeltaInterval", "EpsilonInterval", "PldAccountant"]

_INITIAL_SPACING = 1e-3
_MAX_REFINEMENTS = 4
#: Largest grid (points in one composed PLD) the adaptive refinement may request.
_MAX_GRID_POINTS = 2**24
#: Largest single-step grid: very small noise multipliers get a coarser grid (a wider, still
#: certified interval) rather than an unbounded amount of memory.
_MAX_STEP_POINTS = 2**21


@dataclasses.dataclass(frozen=True)
class EpsilonInterval:
    """A certified bracket ``lower <= epsilon <= upper`` at ``delta`` (grid ``grid_spacing``)."""

    lower: float
    upper: float
    delta: float
    grid_spacing: float

    @property
    def relative_width(self) -> float:
        """(upper - lower) / upper; 0 when both are 0, inf when upper is infinite."""
        if self.upper == 0:
            return 0.0
        if math.isinf(self.upper):
            return 0.0 if math.isinf(self.lower) else math.inf
        return (self.upper - self.lower) / self.upper


@dataclasses.dataclass(frozen=True)
class DeltaInterval:
    """A certified bracket ``lower <= delta <= upper`` at ``epsilon``."""

    lower: float
    upper: float
    epsilon: float
    grid_spacing: float

    @property
    def relative_width(self) -> float:
        """(upper - lower) / upper; 0 when upper is 0."""
        return 0.0 if self.upper == 0 else (self.upper - self.lower) / self.upper


# One composed direction: (pessimistic, optimistic) PLDs.
_Direction = tuple[LossPmf, LossPmf]


class PldAccountant(PrivacyAccountant):
    """Privacy-loss-distribution accountant with certified upper and lower bounds.

    Args:
        value_discretization_interval: fixed loss-grid spacing; ``None`` (default) refines the
            grid until the epsilon (or delta) interval is within ``relative_tolerance``.
        relative_tolerance: target relative width of the reported interval (default 0.5%).

    Example:
        >>> from dpcore.events import dpsgd_event
        >>> acc = PldAccountant().compose(
        ...     dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=1000))
        >>> interval = acc.get_epsilon_interval(1e-5)
        >>> interval.lower <= acc.get_epsilon(1e-5) == interval.upper
        True
        >>> interval.relative_width < 0.005
        True
    """

    name = "pld"

    def __init__(
        self,
        value_discretization_interval: float | None = None,
        relative_tolerance: float = 0.005,
    ) -> None:
        super().__init__()
        if value_discretization_interval is not None:
            value_discretization_interval = check_positive(
                "value_discretization_interval", value_discretization_interval
            )
        self._spacing = value_discretization_interval
        self._tolerance = check_positive("relative_tolerance", relative_tolerance)
        self._counts: dict[DpEvent, int] = {}
        self._non_private = False
        #: log P[no noiseless step touches the example] = sum of count * log(1 - q).
        self._log_untouched = 0.0
        #: Some sigma above SIGMA_HUGE was replaced by it (valid for upper bounds only).
        self._clamped = False
        self._cache: dict[float, list[_Direction]] = {}
        # The grid the last query settled on: later queries start there, so that
        # get_delta(get_epsilon(delta)) is answered on the same grid and returns <= delta.
        self._settled: float | None = None

    def config(self) -> dict[str, Any]:
        return {
            "value_discretization_interval": self._spacing,
            "relative_tolerance": self._tolerance,
        }

    # ----------------------------------------------------------------- events
    def _record(
        self, event: DpEvent, count: int, noiseless: bool, sampling_probability: float = 1.0
    ) -> None:
        if noiseless:
            # With probability 1 - (1 - q)^count such a step outputs the example's
            # contribution without noise: privacy loss +inf.
            self._non_private = True
            if count:
                self._log_untouched += (
                    -math.inf
                    if sampling_probability >= 1
                    else count * math.log1p(-sampling_probability)
                )
            return
        self._counts[event] = self._counts.get(event, 0) + count
        self._cache.clear()
        self._settled = None

    @handles((GaussianEvent,), (LaplaceEvent,))
    def _noise(self, event: GaussianEvent | LaplaceEvent, count: int) -> None:
        noiseless = (
            is_noiseless(event.noise_multiplier)
            if isinstance(event, GaussianEvent)
            else event.noise_multiplier == 0
        )
        self._clamped |= isinstance(event, GaussianEvent) and is_huge(event.noise_multiplier)
        self._record(event, count, noiseless)

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled_gaussian(self, event: PoissonSampledEvent, count: int) -> None:
        if event.sampling_probability == 0:
            return
        inner = event.event
        assert isinstance(inner, GaussianEvent)  # guaranteed by the registry signature
        self._clamped |= is_huge(inner.noise_multiplier)
        self._record(event, count, is_noiseless(inner.noise_multiplier), event.sampling_probability)

    @handles((EpsilonDeltaEvent,))
    def _epsilon_delta(self, event: EpsilonDeltaEvent, count: int) -> None:
        if event.epsilon == 0 and event.delta == 0:
            return
        self._record(event, count, False)

    # ----------------------------------------------------------------- discretisation
    def _step_pmfs(self, event: DpEvent, spacing: float) -> list[_Direction]:
        """[(pessimistic, optimistic)] for the remove and add directions of one step."""
        if isinstance(event, EpsilonDeltaEvent):
            pair = epsilon_delta_pair(
                epsilon=event.epsilon, delta=event.delta, grid_spacing=spacing
            )
            return [pair, pair]
        if isinstance(event, LaplaceEvent):
            laplace = laplace_pair(noise_multiplier=event.noise_multiplier)
            both = (laplace.pessimistic(spacing), laplace.optimistic(spacing))
            return [both, both]
        q, sigma = _gaussian_parameters(event)
        remove, add = subsampled_gaussian_pairs(sampling_probability=q, noise_multiplier=sigma)
        if q == 1.0:  # the plain Gaussian pair is symmetric
            both = (remove.pessimistic(spacing), remove.optimistic(spacing))
            return [both, both]
        return [
            (remove.pessimistic(spacing), remove.optimistic(spacing)),
            (add.pessimistic(spacing), add.optimistic(spacing)),
        ]

    def _loss_range(self) -> float:
        """Width of the widest single-step loss grid among the composed events."""
        return max([1.0, *(self._step_width(event) for event in self._counts)])

    def _step_width(self, event: DpEvent) -> float:
        """Width of one step's loss grid."""
        if isinstance(event, EpsilonDeltaEvent):
            return 2 * min(event.epsilon, LOSS_CAP)
        if isinstance(event, LaplaceEvent):
            return 2 * min(1 / event.noise_multiplier, LOSS_CAP)
        q, sigma = _gaussian_parameters(event)
        remove, _ = subsampled_gaussian_pairs(sampling_probability=q, noise_multiplier=sigma)
        return remove.high - remove.low

    def _start_spacing(self) -> float:
        if self._settled is not None:
            return self._settled
        spacing = max(self._spacing or _INITIAL_SPACING, self._loss_range() / _MAX_STEP_POINTS)
        # Keep the composed grid bounded: estimate its width from the composed mean and
        # variance of the loss (a Gaussian-tail guess; the Chernoff window may be a bit wider).
        mean = variance = 0.0
        for event, count in self._counts.items():
            for upper, _ in self._step_pmfs(event, spacing):
                weights = upper.pmf / max(upper.pmf.sum(), 1e-300)
                losses = upper.losses()
                step_mean = float(weights @ losses)
                mean = max(mean, count * step_mean)
                variance = max(variance, count * float(weights @ (losses - step_mean) ** 2))
        width = abs(mean) + 25 * math.sqrt(variance) + self._loss_range()
        return max(spacing, width / _MAX_GRID_POINTS)

    def _composed(self, spacing: float) -> list[_Direction]:
        if spacing not in self._cache:
            steps = [(self._step_pmfs(event, spacing), n) for event, n in self._counts.items()]
            directions = []
            for side in (0, 1):
                upper = compose_many([(pmfs[side][0], n) for pmfs, n in steps])
                lower = compose_many([(pmfs[side][1], n) for pmfs, n in steps])
                directions.append((upper, lower))
            self._cache = {spacing: directions}
        return self._cache[spacing]

    def composed_pmfs(self, grid_spacing: float) -> list[tuple[LossPmf, LossPmf]]:
        """(pessimistic, optimistic) composed PLDs of the remove and add pairs on one grid.

        For users who need more than epsilon or delta, e.g. the composed tradeoff curve
        (:meth:`LossPmf.tradeoff_vertices`). Raises if nothing private has been composed.
        """
        spacing = check_positive("grid_spacing", grid_spacing)
        if self._non_private or not self._counts:
            raise InvalidParameterError(
                "accountant", "to hold at least one noisy event", "nothing or a noiseless step"
            )
        return list(self._composed(spacing))

    def _grid_points(self, spacing: float) -> int:
        return max((d[0].pmf.size for d in self._cache.get(spacing, [])), default=1)

    def _next_spacing(self, spacing: float, width: float) -> float | None:
        """A finer spacing aiming at the tolerance (the gap scales as spacing^2), or None."""
        if self._spacing is not None or width <= self._tolerance:
            return None
        if spacing / 10 < self._loss_range() / _MAX_STEP_POINTS:
            return None
        factor = (
            min(0.5, max(0.1, math.sqrt(self._tolerance / width) / 1.5))
            if math.isfinite(width)
            else 0.25
        )
        if self._grid_points(spacing) / factor > _MAX_GRID_POINTS:
            return None
        return spacing * factor

    # ----------------------------------------------------------------- queries
    def _interval_at(self, delta: float, spacing: float) -> EpsilonInterval:
        uppers, lowers = [], []
        for upper, lower in self._composed(spacing):
            budget = delta - upper.error_mass
            uppers.append(upper.epsilon(budget) if budget > 0 else math.inf)
            lowers.append(lower.epsilon(min(delta + lower.error_mass, 1.0)))
        # A clamped (smaller) sigma gives a pair that dominates the true one: upper bounds only.
        return EpsilonInterval(0.0 if self._clamped else max(lowers), max(uppers), delta, spacing)

    def get_epsilon_interval(self, target_delta: float) -> EpsilonInterval:
        """Certified bracket of the epsilon of everything composed so far, at ``target_delta``."""
        target = check_delta("target_delta", target_delta)
        if self._non_private:
            # delta(eps) >= P[a noiseless step touches the example] for every finite eps.
            lower = math.inf if target < self._touched() else 0.0
            return EpsilonInterval(lower, math.inf, target, math.nan)
        if not self._counts:
            return EpsilonInterval(0.0, 0.0, target, math.nan)
        spacing = self._start_spacing()
        interval = self._interval_at(target, spacing)
        for _ in range(_MAX_REFINEMENTS):
            finer = self._next_spacing(spacing, interval.relative_width)
            if finer is None:
                break
            spacing = finer
            interval = self._interval_at(target, spacing)
        self._settled = spacing
        return interval

    def get_delta_interval(self, target_epsilon: float) -> DeltaInterval:
        """Certified bracket of the delta of everything composed so far, at ``target_epsilon``."""
        epsilon = check_epsilon("target_epsilon", target_epsilon)
        if self._non_private:
            return DeltaInterval(self._touched(), 1.0, epsilon, math.nan)
        if not self._counts:
            return DeltaInterval(0.0, 0.0, epsilon, math.nan)
        spacing = self._start_spacing()
        for attempt in range(_MAX_REFINEMENTS + 1):
            directions = self._composed(spacing)
            upper = max(min(1.0, u.delta(epsilon) + u.error_mass) for u, _ in directions)
            lower = max(max(0.0, o.delta(epsilon) - o.error_mass) for _, o in directions)
            lower = 0.0 if self._clamped else lower
            interval = DeltaInterval(lower, upper, epsilon, spacing)
            finer = self._next_spacing(spacing, interval.relative_width)
            if finer is None or attempt == _MAX_REFINEMENTS:
                break
            spacing = finer
        self._settled = spacing
        return interval

    def _touched(self) -> float:
        """P[some noiseless step includes the example]: 1 - prod (1 - q)^count."""
        return -math.expm1(self._log_untouched)

    def _epsilon(self, delta: float) -> float:
        return self.get_epsilon_interval(delta).upper

    def _delta(self, epsilon: float) -> float:
        return self.get_delta_interval(epsilon).upper


def _gaussian_parameters(event: DpEvent) -> tuple[float, float]:
    """(q, sigma) of a Gaussian or Poisson-sampled Gaussian event (q = 1 when not sampled).

    A sigma above :data:`~dpcore.mechanisms.noise_range.SIGMA_HUGE` becomes SIGMA_HUGE: less
    noise is less private (more noise is a post-processing), so the result still bounds epsilon
    from above; the accountant then reports 0 as the lower bound.
    """
    if isinstance(event, GaussianEvent):
        return 1.0, min(event.noise_multiplier, SIGMA_HUGE)
    assert isinstance(event, PoissonSampledEvent) and isinstance(event.event, GaussianEvent)
    return event.sampling_probability, min(event.event.noise_multiplier, SIGMA_HUGE)
