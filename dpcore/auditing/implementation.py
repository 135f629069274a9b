"""The contract between the auditor and a DP-SGD implementation it does not control.

The auditor (:mod:`dpcore.auditing.implementation_audits`) hands an implementation an
:class:`AuditTask`: the data (real records, with or without input-space canaries), the model and
the loss (fixed below, so that every framework builds the same one), and the training settings.
The implementation trains with *its own* sampling, clipping, noise and optimizer, calls the
:class:`Observer` once per step with the parameters, and returns its :class:`Claim`: the
(q, sigma, C, T, delta) it ran with, the epsilon its own accountant reports, and which sampling
that accounting assumes.

The model and loss (every adapter builds exactly these):

* linear, no bias: ``z = x . w`` with ``w`` in R^d starting at :attr:`AuditTask.initial_weight`;
* per-example loss ``(z - y)^2 / 2``, so the per-example gradient is ``(z - y) x``;
* plain SGD (no momentum, no weight decay) at :attr:`AuditTask.learning_rate`.

Input-space canaries need no access to internals. Canary ``i`` is the record ``x = e_i``,
``y = CANARY_TARGET * C`` on a feature ``i`` that every real record leaves at 0. Its gradient is
``(w_i - y) e_i``, of norm about ``1e6 C`` while ``|w_i|`` stays far below ``y``, so a correct
implementation clips it to ``-C e_i`` (up to float rounding) and no real record ever moves
``w_i``. From two consecutive parameter vectors the auditor reads, for a correct DP-SGD with the
claimed divisor ``b`` (q N for Poisson lots),

    s_t,i = (w_t,i - w_{t-1},i) b / (lr C)  ~  N(1[canary i in lot t], sigma^2),

the per-step statistic of Nasr et al. 2023 (arXiv 2302.07956, white-box gradient canary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from dpcore.errors import InvalidParameterError

#: A canary's target in units of C: its unclipped gradient norm is about this times C.
CANARY_TARGET = 1e6

#: Samplers a claim may name. ``poisson``: each record independently with probability q per step;
#: ``shuffle``: fixed-size batches from a fresh permutation per epoch; ``fixed``: fixed-size
#: batches drawn some other way.
SAMPLERS = ("poisson", "shuffle", "fixed")


@dataclasses.dataclass(frozen=True)
class AuditTask:
    """One training run asked of an implementation (model and loss: see the module doc).

    ``features`` is (n, d) float32 and ``targets`` (n,); records ``canary_rows`` are canaries
    (their positions are known to the auditor only through this field; an implementation must
    treat every record alike).
    """

    features: np.ndarray
    targets: np.ndarray
    initial_weight: np.ndarray
    sampling_probability: float
    noise_multiplier: float
    max_grad_norm: float
    learning_rate: float
    steps: int
    delta: float
    seed: int
    canary_rows: tuple[int, ...] = ()
    #: whether the implementation should compute its epsilon (off for the sampler audit's probe
    #: run, whose tiny noise multiplier no accountant needs to price)
    report_epsilon: bool = True

    @property
    def dataset_size(self) -> int:
        """n, the number of records (canaries included)."""
        return int(self.features.shape[0])

    @property
    def dimension(self) -> int:
        """d, the number of weights."""
        return int(self.features.shape[1])

    @property
    def batch_size(self) -> int:
        """round(q n): the batch size of implementations that use fixed-size batches."""
        return max(1, round(self.sampling_probability * self.dataset_size))


@dataclasses.dataclass(frozen=True)
class Claim:
    """What an implementation says it ran, and what its own accountant says that costs.

    ``divisor`` is what the noisy clipped sum is divided by (q N for Poisson lots, the batch size
    for fixed-size batches). ``accounting_assumes`` is the sampling its epsilon is computed for;
    ``sampler`` the one it actually uses (as it says). ``epsilon`` is None when the
    implementation reports none (the auditor then compares against dpcore's certified value).
    """

    implementation: str
    sampler: str
    accounting_assumes: str
    sampling_probability: float
    noise_multiplier: float
    max_grad_norm: float
    steps: int
    delta: float
    divisor: float
    epsilon: float | None = None
    accountant: str = ""

    def __post_init__(self) -> None:
        for name in ("sampler", "accounting_assumes"):
            value = getattr(self, name)
            if value not in SAMPLERS:
                raise InvalidParameterError(name, f"one of {SAMPLERS}", value)
        if not self.divisor > 0:
            raise InvalidParameterError("divisor", "> 0", self.divisor)


class Observer:
    """Collects the parameter trace: :meth:`step` once after every optimizer step.

    ``lot`` (the record indices used at that step) is optional: implementations that can say
    which records they used pass it, and the per-step white-box audit needs it.
    """

    def __init__(self, initial_weight: np.ndarray) -> None:
        self.weights: list[np.ndarray] = [np.asarray(initial_weight, dtype=np.float64).copy()]
        self.lots: list[np.ndarray] | None = []

    def step(self, weight: np.ndarray, lot: Sequence[int] | np.ndarray | None = None) -> None:
        """Record the weight after one step (and, if known, the records used)."""
        vector = np.asarray(weight, dtype=np.float64).reshape(-1)
        if vector.shape != self.weights[0].shape:
            raise InvalidParameterError(
                "weight", f"a vector of {self.weights[0].size} values", vector.shape
            )
        self.weights.append(vector.copy())
        if lot is None:
            self.lots = None
        elif self.lots is not None:
            self.lots.append(np.asarray(lot, dtype=np.int64).reshape(-1))

    @property
    def steps(self) -> int:
        """Steps observed so far."""
        return len(self.weights) - 1

    def canary_scores(
        self, task: AuditTask, claim: Claim, coordinates: Sequence[int]
    ) -> np.ndarray:
        """s_t,i (steps x coordinates) of the module doc, with the claim's divisor."""
        if self.steps != task.steps:
            raise InvalidParameterError(
                "observed steps", f"= task.steps = {task.steps}", self.steps
            )
        trace = np.stack(self.weights)[:, list(coordinates)]
        return np.diff(trace, axis=0) * claim.divisor / (task.learning_rate * task.max_grad_norm)


class Implementation(Protocol):
    """A DP-SGD implementation behind an adapter (see the module doc for the contract)."""

    name: str

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        """Train on ``task`` with the implementation's own DP-SGD; report each step; claim."""
        ...


def make_task(
    *,
    real_records: int,
    real_features: int,
    canaries: Sequence[bool],
    sampling_probability: float,
    noise_multiplier: float,
    max_grad_norm: float,
    learning_rate: float,
    steps: int,
    delta: float,
    seed: int,
    report_epsilon: bool = True,
) -> AuditTask:
    """Real regression records on features ``m..m+real_features`` and the included canaries.

    ``canaries[i]`` says whether canary ``i`` (feature ``i``) is in the dataset; records are
    shuffled (seeded) so that no implementation can find the canaries by position.
    """
    rng = np.random.default_rng(seed)
    m = len(canaries)
    x_real = np.zeros((real_records, m + real_features))
    x_real[:, m:] = rng.standard_normal((real_records, real_features)) / np.sqrt(real_features)
    truth = rng.standard_normal(real_features)
    y_real = x_real[:, m:] @ truth + 0.1 * rng.standard_normal(real_records)
    included = [i for i, present in enumerate(canaries) if present]
    x_canary = np.zeros((len(included), m + real_features))
    x_canary[np.arange(len(included)), included] = 1.0
    y_canary = np.full(len(included), CANARY_TARGET * max_grad_norm)
    features = np.concatenate([x_real, x_canary])
    targets = np.concatenate([y_real, y_canary])
    order = rng.permutation(features.shape[0])
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return AuditTask(
        features=features[order].astype(np.float32),
        targets=targets[order].astype(np.float32),
        initial_weight=np.zeros(m + real_features, dtype=np.float32),
        sampling_probability=sampling_probability,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        learning_rate=learning_rate,
        steps=steps,
        delta=delta,
        seed=seed,
        canary_rows=tuple(int(position[real_records + k]) for k in range(len(included))),
        report_epsilon=report_epsilon,
    )
