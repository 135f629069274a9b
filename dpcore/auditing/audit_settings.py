"""The implementation audits' settings (:class:`AuditSettings`, the two defaults) and dpcore's
certified epsilon of a claim, which every audit row carries.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import warnings

from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.auditing.implementation import (
    Claim,
)
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.validation import check_count, check_delta, check_positive

#: Tasks the per-step audit runs on.
TASKS = ("mlp", "linear")


def _open_unit(name: str, value: object) -> float:
    """A real number in the open interval (0, 1) (NaN, inf and bool refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(name, "a real number in (0, 1)", value)
    result = float(value)
    if not 0 < result < 1:
        raise InvalidParameterError(name, "a real number in (0, 1)", value)
    return result


@dataclasses.dataclass(frozen=True)
class AuditSettings:
    """The audited training setting (sigma is calibrated so that the PLD epsilon is the target).

    ``max_grad_norm`` is not 1 so that noise scaled by sigma instead of sigma C shows. ``task``
    is the per-step audit's task: ``mlp`` (layers (1 + real_features, 1 + hidden, classes),
    ReLU, cross-entropy, ``rare_records`` real records of the rare class) or ``linear``.

    Raises:
        InvalidParameterError: naming the first field out of its range.
    """

    target_epsilon: float = 4.0
    delta: float = 1e-5
    real_records: int = 19
    real_features: int = 4
    sampling_probability: float = 0.2
    steps: int = 100
    max_grad_norm: float = 2.0
    learning_rate: float = 0.05
    confidence: float = 0.95
    runs: int = 76
    held_out_fraction: float = 0.2
    one_run_canaries: int = 1000
    one_run_guesses_each_side: int = 100
    one_run_real_records: int = 100
    sampler_steps: int = 500
    task: str = "mlp"
    hidden: int = 4
    classes: int = 3
    rare_records: int = 1
    tiny_records: int = 5
    tiny_runs: int = 4

    def __post_init__(self) -> None:
        check_positive("target_epsilon", self.target_epsilon)
        check_delta("delta", self.delta)
        for name in (
            "real_records",
            "real_features",
            "steps",
            "runs",
            "one_run_canaries",
            "one_run_guesses_each_side",
            "one_run_real_records",
            "sampler_steps",
            "hidden",
            "tiny_records",
        ):
            check_count(name, getattr(self, name), minimum=1)
        check_count("classes", self.classes, minimum=2)
        check_count("tiny_runs", self.tiny_runs, minimum=0)
        check_count("rare_records", self.rare_records, minimum=0)
        if self.rare_records > self.real_records:
            raise InvalidParameterError(
                "rare_records", f"<= real_records = {self.real_records}", self.rare_records
            )
        if 2 * self.one_run_guesses_each_side > self.one_run_canaries:
            raise InvalidParameterError(
                "one_run_guesses_each_side",
                f"<= one_run_canaries / 2 = {self.one_run_canaries / 2}",
                self.one_run_guesses_each_side,
            )
        q: object = self.sampling_probability
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 < float(q) <= 1:
            raise InvalidParameterError("sampling_probability", "a real number in (0, 1]", q)
        check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("learning_rate", self.learning_rate)
        _open_unit("confidence", self.confidence)
        _open_unit("held_out_fraction", self.held_out_fraction)
        if self.task not in TASKS:
            raise InvalidParameterError("task", f"one of {TASKS}", self.task)

    @functools.cached_property
    def noise_multiplier(self) -> float:
        """sigma with PLD epsilon(q, sigma, T) = target at delta (computed once per instance)."""
        return _calibrated(self.target_epsilon, self.delta, self.sampling_probability, self.steps)


@functools.lru_cache(maxsize=64)
def _calibrated(epsilon: float, delta: float, q: float, steps: int) -> float:
    return calibrate_noise(
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=q,
        steps=steps,
        accountant="pld",
    )


#: The per-step audit's default setting (MLP task, epsilon 4, T = 100, 76 runs per world: the
#: runs :func:`~dpcore.auditing.gaussian_scores.runs_for_mu_ratio` gives for a typical epsilon_lb
#: of 0.82 of the claimed epsilon, :func:`~dpcore.auditing.stepwise.mu_ratio_for_epsilon_ratio`;
#: about 30 s per seed on one CPU core).
PER_STEP_SETTINGS = AuditSettings()

#: The one-run and sampler audits' default setting: a smaller claimed epsilon, where the
#: one-run bound has room (with 200 guesses it cannot exceed about 4.2, all guesses right).
ONE_RUN_SETTINGS = AuditSettings(target_epsilon=2.0, steps=100)


@functools.lru_cache(maxsize=256)
def _certified(q: float, sigma: float, steps: int, delta: float) -> tuple[float, float, float]:
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    interval = PldAccountant().compose(event).get_epsilon_interval(delta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        rdp = float(RdpAccountant().compose(event).get_epsilon(delta))
    return interval.upper, interval.lower, rdp


def certified_epsilon(claim: Claim) -> dict[str, float]:
    """dpcore's epsilon for the claimed (q, sigma, T) at delta: PLD interval and RDP."""
    upper, lower, rdp = _certified(
        claim.sampling_probability, claim.noise_multiplier, claim.steps, claim.delta
    )
    return {"pld": upper, "pld_lower": lower, "rdp": rdp}
