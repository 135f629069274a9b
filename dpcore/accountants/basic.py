"""Basic composition: (sum of epsilons, sum of deltas) (Dwork & Roth 2014, Thm 3.16).

Supported steps and the (epsilon, delta) each one contributes:

* :class:`EpsilonDeltaEvent` -- its own (epsilon, delta);
* :class:`LaplaceEvent` with scale b (relative to the L1 sensitivity) -- (1/b, 0);
* :class:`RandomizedResponseEvent` with noise parameter p over k values --
  (log(1 + k (1 - p) / p), 0), exactly its pure-DP epsilon (inf at p = 0, 0 at p = 1; see
  :func:`randomized_response_epsilon`);
* :class:`ExponentialMechanismEvent` at epsilon -- (epsilon, 0) (Dwork & Roth 2014, Thm 3.10);
* :class:`PoissonSampledEvent` of any of these -- amplified by sampling to
  (log(1 + q (e^epsilon - 1)), q delta) (Balle, Barthe, Gaboardi 2018, Thm 8; Li, Qardaji, Su
  2012);
* :class:`GaussianEvent` and :class:`PoissonSampledEvent` of a Gaussian -- see below.

At ``target_delta = 0`` the answer is the sum of the pure epsilons when every step is pure
(delta = 0 and not Gaussian), inf otherwise.

**Group privacy** (``group_size = k``, neighbours that differ in k records): every fixed step
(epsilon, delta) becomes (k epsilon, delta (1 + e^epsilon + ... + e^{(k-1) epsilon})) (see
:func:`group_epsilon_delta`), applied after amplification by sampling. An unsampled Gaussian step
is instead the Gaussian with sensitivity k, i.e. noise multiplier sigma / k (exact, the L2
distance of a group's sums is at most k times the clipping norm); a Poisson-sampled Gaussian
step gets the group lemma applied to its amplified (epsilon, delta), its inner delta chosen so
that the group delta it spends is at most its share.

A Gaussian step has a whole curve of (epsilon, delta), not one pair, so it is fixed only at query
time. **Delta split (our choice):** ``get_epsilon(delta)`` first pays the deltas of the fixed
steps; the remaining budget is divided *evenly over the Gaussian steps* (one share per step,
whatever its q or sigma). A step sampled with rate q runs its Gaussian at delta_g = share / q, so
that after amplification it spends q delta_g = share; its epsilon is the exact analytic Gaussian
epsilon at delta_g (Balle & Wang 2018, Thm 8), then amplified. An even split is simple and
reproducible, not optimal for heterogeneous steps; every split is valid, so the answer is an
upper bound. ``get_delta(epsilon)`` inverts ``get_epsilon`` by bisection on log delta and
returns the upper end of the final bracket, so the delta it returns certifies epsilon.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from typing import Any, cast

import numpy as np

from dpcore.accountants.base import PrivacyAccountant, handles
from dpcore.accountants.inversion import delta_for_epsilon
from dpcore.events import (
    EpsilonDeltaEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    RandomizedResponseEvent,
)
from dpcore.mechanisms.gaussian import gaussian_epsilon_upper
from dpcore.mechanisms.noise_range import is_noiseless
from dpcore.validation import (
    check_count,
    check_delta_closed,
    check_non_negative,
    check_probability,
)

__all__ = [
    "BasicCompositionAccountant",
    "StepLedger",
    "amplify",
    "group_epsilon_delta",
    "randomized_response_epsilon",
]

#: (epsilon, delta, count): ``count`` steps, each (epsilon, delta)-DP.
Step = tuple[float, float, int]

# The Gaussian budget is shrunk by this relative margin so that rounding in the split (share / q,
# then q * delta_g, summed) can never make the spent delta exceed the target.
_ROUNDING_MARGIN = 1e-9
# delta_g is capped below 1 (gaussian_epsilon needs delta < 1); there epsilon is already 0.
_MAX_STEP_DELTA = 1.0 - 1e-12
# Iterations of the inner-delta search of a grouped sampled Gaussian step.
_FIXED_POINT_STEPS = 12
_SHRINK_STEPS = 60


def amplify(*, epsilon: float, delta: float, sampling_probability: float) -> tuple[float, float]:
    """(epsilon, delta) of an (epsilon, delta)-DP mechanism run on a Poisson sample of rate q.

    The result is (log(1 + q (e^epsilon - 1)), q delta) (Balle, Barthe, Gaboardi 2018, Thm 8;
    Li, Qardaji, Su 2012), computed without overflow for large epsilon.

    >>> amplify(epsilon=1.0, delta=1e-6, sampling_probability=0.5)
    (0.6201145069582775, 5e-07)

    Raises:
        InvalidParameterError: epsilon < 0 or NaN, delta outside [0, 1), q outside [0, 1].
    """
    epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
    delta = check_delta_closed("delta", delta)
    q = check_probability("sampling_probability", sampling_probability)
    if q == 0:
        return 0.0, 0.0
    if math.isinf(epsilon):
        return math.inf, q * delta
    if epsilon > 700:  # e^epsilon overflows: log(1 - q + q e^epsilon) in log space
        log_rest = math.log1p(-q) if q < 1 else -math.inf
        return float(np.logaddexp(log_rest, math.log(q) + epsilon)), q * delta
    return math.log1p(q * math.expm1(epsilon)), q * delta


def _laplace_epsilon(scale: float) -> float:
    """Laplace mechanism with scale b x L1 sensitivity is (1/b)-DP (Dwork & Roth, Thm 3.6)."""
    return math.inf if scale == 0 else 1.0 / scale


def randomized_response_epsilon(*, noise_parameter: float, num_buckets: int) -> float:
    """Pure-DP epsilon of k-ary randomized response with noise parameter p: log(1 + k (1-p)/p).

    The true value is reported with probability 1 - p + p/k and each other value with p/k
    (:class:`~dpcore.events.RandomizedResponseEvent`), so the largest likelihood ratio between
    two inputs is (1 - p + p/k) / (p/k) = 1 + k (1 - p) / p, attained at either input's own
    value: the epsilon is exact (Warner 1965; the k-ary form is dp_accounting's
    ``RandomizedResponseDpEvent``). inf at p = 0 (the value itself is reported), 0 at p = 1.

    >>> round(randomized_response_epsilon(noise_parameter=0.5, num_buckets=2), 12) == round(
    ...     math.log(3), 12)
    True

    Raises:
        InvalidParameterError: p outside [0, 1], or k not an integer >= 2.
    """
    p = check_probability("noise_parameter", noise_parameter)
    k = check_count("num_buckets", num_buckets, minimum=2)
    if p == 0:
        return math.inf
    # log1p(k (1 - p) / p); k (1 - p) / p overflows only for p below ~1e-300 (then inf, the
    # IEEE rounding of a number beyond the float range).
    with np.errstate(over="ignore"):
        ratio = float(np.float64(k) * np.float64(1.0 - p) / np.float64(p))
    return math.log1p(ratio)


def _log_group_factor(epsilon: float, group_size: int) -> float:
    """log(1 + e^epsilon + ... + e^{(k-1) epsilon}) for k = group_size, without overflow."""
    if group_size == 1:
        return 0.0
    if epsilon == 0:
        return math.log(group_size)
    # (e^{k eps} - 1) / (e^eps - 1), each log(expm1(x)) = x + log(-expm1(-x)).
    top = group_size * epsilon + math.log(-math.expm1(-group_size * epsilon))
    bottom = epsilon + math.log(-math.expm1(-epsilon))
    return top - bottom


def group_epsilon_delta(*, epsilon: float, delta: float, group_size: int) -> tuple[float, float]:
    """(k epsilon, delta (1 + e^epsilon + ... + e^{(k-1) epsilon})): group privacy of size k.

    For datasets D_0, ..., D_k, each a neighbour of the next, applying
    P[M(D_i) in S] <= e^epsilon P[M(D_{i+1}) in S] + delta along the chain gives
    P[M(D_0) in S] <= e^{k epsilon} P[M(D_k) in S] + delta sum_{j<k} e^{j epsilon}; for
    delta = 0 this is Dwork & Roth 2014, Thm 2.2. It is also implied by Dong, Roth, Su 2019
    (arXiv 1905.02383), Thm 2.14 for f_{epsilon, delta}, whose exact answer is a sharper
    tradeoff curve (:func:`dpcore.tradeoff.group_privacy`). The delta is rounded up and capped
    at 1 (a delta of 1 certifies nothing).

    >>> group_epsilon_delta(epsilon=0.5, delta=0.0, group_size=4)
    (2.0, 0.0)
    >>> epsilon, delta = group_epsilon_delta(epsilon=1.0, delta=1e-6, group_size=3)
    >>> epsilon, round(delta / 1e-6, 9)  # 1 + e + e^2
    (3.0, 11.107337927)

    Raises:
        InvalidParameterError: epsilon < 0 or NaN, delta outside [0, 1), group_size < 1.
    """
    epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
    delta = check_delta_closed("delta", delta)
    k = check_count("group_size", group_size, minimum=1)
    if k == 1:
        return epsilon, delta
    if delta == 0:
        return k * epsilon, 0.0
    if math.isinf(epsilon):
        return math.inf, 1.0
    log_delta = math.log(delta) + _log_group_factor(epsilon, k)
    if log_delta >= 0:
        return k * epsilon, 1.0
    return k * epsilon, min(1.0, math.exp(log_delta) * (1 + _ROUND_UP))


#: Relative amount by which computed group deltas are rounded up (a few units in the last place).
_ROUND_UP = 2.0**-50


class StepLedger(PrivacyAccountant):
    """Bookkeeping shared by basic and advanced composition (not itself an accountant).

    Steps with a fixed guarantee are kept as (epsilon, delta) -> count; Gaussian steps as
    (q, sigma) -> count (q = 1 for an unsampled Gaussian), to be given a delta at query time.
    """

    def __init__(self) -> None:
        super().__init__()
        self._fixed: dict[tuple[float, float], int] = defaultdict(int)
        self._gaussian: dict[tuple[float, float], int] = defaultdict(int)
        #: Group size k (neighbours differing in k records); 1 is ordinary DP.
        self._group_size = 1

    @handles((EpsilonDeltaEvent,))
    def _epsilon_delta(self, event: EpsilonDeltaEvent, count: int) -> None:
        if event.epsilon > 0 or event.delta > 0:
            self._fixed[(event.epsilon, event.delta)] += count

    @handles((LaplaceEvent,))
    def _laplace(self, event: LaplaceEvent, count: int) -> None:
        self._fixed[(_laplace_epsilon(event.noise_multiplier), 0.0)] += count

    @handles((GaussianEvent,))
    def _plain_gaussian(self, event: GaussianEvent, count: int) -> None:
        self._gaussian[(1.0, event.noise_multiplier)] += count

    @handles((PoissonSampledEvent, GaussianEvent))
    def _sampled_gaussian(self, event: PoissonSampledEvent, count: int) -> None:
        inner = cast(GaussianEvent, event.event)  # the registry signature guarantees the type
        if event.sampling_probability > 0:  # q = 0: the record is never used
            self._gaussian[(event.sampling_probability, inner.noise_multiplier)] += count

    @handles((RandomizedResponseEvent,))
    def _randomized_response(self, event: RandomizedResponseEvent, count: int) -> None:
        epsilon = randomized_response_epsilon(
            noise_parameter=event.noise_parameter, num_buckets=event.num_buckets
        )
        if epsilon > 0:
            self._fixed[(epsilon, 0.0)] += count

    @handles((ExponentialMechanismEvent,))
    def _exponential(self, event: ExponentialMechanismEvent, count: int) -> None:
        if event.epsilon > 0:
            self._fixed[(event.epsilon, 0.0)] += count

    @staticmethod
    def _pure_or_fixed(inner: object) -> tuple[float, float]:
        """(epsilon, delta) of a non-Gaussian step (the registry guarantees one of these)."""
        if isinstance(inner, LaplaceEvent):
            return _laplace_epsilon(inner.noise_multiplier), 0.0
        if isinstance(inner, RandomizedResponseEvent):
            epsilon = randomized_response_epsilon(
                noise_parameter=inner.noise_parameter, num_buckets=inner.num_buckets
            )
            return epsilon, 0.0
        if isinstance(inner, ExponentialMechanismEvent):
            return inner.epsilon, 0.0
        inner = cast(EpsilonDeltaEvent, inner)
        return inner.epsilon, inner.delta

    @handles(
        (PoissonSampledEvent, LaplaceEvent),
        (PoissonSampledEvent, EpsilonDeltaEvent),
        (PoissonSampledEvent, RandomizedResponseEvent),
        (PoissonSampledEvent, ExponentialMechanismEvent),
    )
    def _sampled_fixed(self, event: PoissonSampledEvent, count: int) -> None:
        epsilon, delta = self._pure_or_fixed(event.event)
        amplified = amplify(
            epsilon=epsilon, delta=delta, sampling_probability=event.sampling_probability
        )
        if amplified != (0.0, 0.0):
            self._fixed[amplified] += count

    # ----------------------------------------------------------------- helpers
    def _fixed_delta(self) -> float:
        """Sum of the deltas of the steps with a fixed guarantee (for the group, if k > 1)."""
        return math.fsum(delta * count for _, delta, count in self._fixed_steps())

    def _fixed_steps(self) -> list[Step]:
        """The fixed steps as (epsilon, delta, count), after group privacy for k > 1."""
        steps = []
        for (epsilon, delta), count in self._fixed.items():
            group = group_epsilon_delta(epsilon=epsilon, delta=delta, group_size=self._group_size)
            steps.append((*group, count))
        return steps

    def _gaussian_steps(self, budget: float) -> list[Step]:
        """The Gaussian steps as (epsilon, delta, count), sharing ``budget`` evenly per step.

        Each step spends at most ``budget * (1 - 1e-9) / number_of_gaussian_steps``.
        """
        total = sum(self._gaussian.values())
        share = budget * (1 - _ROUNDING_MARGIN) / max(total, 1)
        steps: list[Step] = []
        for (q, sigma), count in self._gaussian.items():
            step_delta = min(share / q, _MAX_STEP_DELTA)
            # No noise, or a share in the subnormal range, where rounding can overspend the
            # budget: such a step is not certified at all (epsilon inf, never an overspent delta).
            if is_noiseless(sigma) or share < sys.float_info.min:
                steps.append((math.inf, 0.0, count))
                continue
            if self._group_size > 1 and q < 1:
                steps.append((*self._grouped_sampled_gaussian(q, sigma, share), count))
                continue
            # A group of k moves an unsampled Gaussian's sum by at most k clipping norms: the
            # Gaussian with noise multiplier sigma / k, exactly.
            scaled = sigma / self._group_size
            if is_noiseless(scaled):
                steps.append((math.inf, 0.0, count))
                continue
            inner = gaussian_epsilon_upper(noise_multiplier=scaled, delta=step_delta)
            steps.append((*amplify(epsilon=inner, delta=step_delta, sampling_probability=q), count))
        return steps

    def _grouped_sampled_gaussian(
        self, q: float, sigma: float, share: float
    ) -> tuple[float, float]:
        """(epsilon, delta) of a Poisson-sampled Gaussian step for the group, delta <= share.

        The step is (e1, q d)-DP at inner delta d (analytic Gaussian, then amplification), hence
        (k e1, q d S)-DP for the group with S = sum_{j<k} e^{j e1} (:func:`group_epsilon_delta`).
        d is found by the fixed-point iteration d <- share / (q S(e1(d))) from d = share / q,
        which approaches the solution from above; the final d is shrunk until the group delta
        it spends is at most ``share`` (checked), so the pair is always certified.
        """

        def at(inner_delta: float) -> tuple[float, float]:
            inner = gaussian_epsilon_upper(noise_multiplier=sigma, delta=inner_delta)
            epsilon, delta = amplify(epsilon=inner, delta=inner_delta, sampling_probability=q)
            return group_epsilon_delta(epsilon=epsilon, delta=delta, group_size=self._group_size)

        inner_delta = min(share / q, _MAX_STEP_DELTA)
        for _ in range(_FIXED_POINT_STEPS):
            epsilon, spent = at(inner_delta)
            if spent <= 0 or not math.isfinite(epsilon):
                break
            smaller = min(inner_delta * share / spent, _MAX_STEP_DELTA)
            if smaller < sys.float_info.min:
                break
            inner_delta = smaller
        inner_delta *= 1 - 1e-6
        for _ in range(_SHRINK_STEPS):
            if inner_delta < sys.float_info.min:
                break
            epsilon, spent = at(inner_delta)
            if spent <= share:
                return epsilon, spent
            inner_delta *= 0.5
        return math.inf, 0.0  # not certified: never an overspent delta

    @staticmethod
    def _spent(steps: list[Step]) -> float:
        return math.fsum(delta * count for _, delta, count in steps)

    def _certified(self, steps: list[Step], target_delta: float, slack: float = 0.0) -> list[Step]:
        """``steps`` after checking that they spend at most ``target_delta`` with ``slack``."""
        if self._spent(steps) + slack > target_delta:  # pragma: no cover - a defect
            raise ArithmeticError(
                f"{type(self).__name__} split overspent delta = {target_delta!r}; please report."
            )
        return steps

    def _delta(self, epsilon: float) -> float:
        return delta_for_epsilon(self._epsilon, epsilon)


class BasicCompositionAccountant(StepLedger):
    """Basic composition with amplification by sampling and an even delta split.

    Args:
        group_size: k >= 1, the number of records in which neighbouring datasets differ
            (group privacy; 1 is ordinary DP). See the module docstring.

    Example:
        >>> acc = BasicCompositionAccountant().compose(EpsilonDeltaEvent(0.5, 1e-7), 10)
        >>> acc.get_epsilon(1e-5), acc.get_delta(5.0)
        (5.0, 1e-06)
    """

    name = "basic"

    def __init__(self, group_size: int = 1) -> None:
        super().__init__()
        self._group_size = check_count("group_size", group_size, minimum=1)

    @property
    def group_size(self) -> int:
        """The group size k the guarantees are for."""
        return self._group_size

    def config(self) -> dict[str, Any]:
        return {"group_size": self._group_size}

    def _epsilon(self, delta: float) -> float:
        budget = delta - self._fixed_delta()
        if budget < 0 or (budget == 0 and self._gaussian):
            return math.inf  # the fixed steps alone spend the whole target
        steps = self._fixed_steps() + self._gaussian_steps(budget)
        return math.fsum(epsilon * count for epsilon, _, count in self._certified(steps, delta))

    def _delta(self, epsilon: float) -> float:
        if not self._gaussian:  # fixed steps only: delta is exactly their sum, or nothing works
            fixed = self._fixed_steps()
            spent = math.fsum(e * count for e, _, count in fixed)
            return self._fixed_delta() if spent <= epsilon else 1.0
        return super()._delta(epsilon)
