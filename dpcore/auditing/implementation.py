"""The contract between the auditor and a DP-SGD implementation it does not control.

The auditor (:mod:`dpcore.auditing.implementation_audits`) hands an implementation an
:class:`AuditTask`: the data (real records, with or without input-space canaries), the model and
the loss (fixed below, so that every framework builds the same one), and the training settings.
The implementation trains with *its own* sampling, clipping, noise and optimizer, calls the
:class:`Observer` once per step with the parameters, and returns its :class:`Claim`: the
(q, sigma, C, T, delta) it ran with, the epsilon its own accountant reports, and which sampling
that accounting assumes.

The model and loss are the task's :class:`~dpcore.auditing.models.ModelSpec` (every adapter
builds exactly it, from :attr:`AuditTask.initial_parameters`; :func:`make_task` gives the linear
regression task, :func:`make_mlp_task` an MLP classifier with biases and a rare class), trained
by plain SGD (no momentum, no weight decay) at :attr:`AuditTask.learning_rate`. The linear task:

* linear, no bias: ``z = x . w`` with ``w`` in R^d starting at :attr:`AuditTask.initial_weight`;
* per-example loss ``(z - y)^2 / 2``, so the per-example gradient is ``(z - y) x``.

MLP canaries (:func:`make_mlp_task`): canary ``i`` is the input ``A e_i`` (a feature no real
record uses) of the rare class, wired to a hidden unit ``i`` that only it drives (ReLU, bias
-1: off for every real record), so its gradient is large in every tensor, biases included; the
auditor, who knows the weights at every step, computes its exact clipped contribution per
tensor (:mod:`dpcore.auditing.structural`).

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
import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from dpcore.auditing.models import ModelSpec
from dpcore.errors import InvalidParameterError

#: A canary's target in units of C: its unclipped gradient norm is about this times C.
CANARY_TARGET = 1e6

#: Samplers a claim may name. ``poisson``: each record independently with probability q per step;
#: ``shuffle``: fixed-size batches from a fresh permutation per epoch; ``fixed``: fixed-size
#: batches drawn some other way.
SAMPLERS = ("poisson", "shuffle", "fixed")

#: The MLP canary's input value on its own feature (its gradient is about 24 in norm).
MLP_CANARY_SCALE = 10.0


@dataclasses.dataclass(frozen=True)
class AuditTask:
    """One training run asked of an implementation (model and loss: see the module doc).

    ``features`` is (n, d) float32 and ``targets`` (n,) (float32 for the squared loss, int64
    class labels for cross-entropy); records ``canary_rows`` are canaries (their positions are
    known to the auditor only through this field; an implementation must treat every record
    alike). ``initial_weight`` is the parameter *vector* (the canonical tuple
    :attr:`initial_parameters` flattened); ``model`` None is the linear task. ``canary_inputs``
    and ``canary_targets`` hold every canary slot, present or not, and ``canary_slots`` the slot
    of each row of ``canary_rows`` (the auditor's, for canaries it left out).
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
    #: whether the implementation should compute its epsilon. An adapter must honour it and
    #: return ``Claim(epsilon=None)`` when it is False: the auditor turns it off for every run but
    #: one, and for the sampler audit's probe run, whose noise multiplier (0.01) no accountant
    #: needs to price (Opacus' PRV accountant asks for hundreds of GiB there; dpcore's PLD raises
    #: ``ResourceLimitError``)
    report_epsilon: bool = True
    model: ModelSpec | None = None
    canary_inputs: np.ndarray | None = None
    canary_targets: np.ndarray | None = None
    canary_slots: tuple[int, ...] = ()
    name: str = "linear"

    @property
    def spec(self) -> ModelSpec:
        """The model (the linear task's when ``model`` is None)."""
        if self.model is not None:
            return self.model
        return ModelSpec((self.dimension, 1), bias=False, activation="identity", loss="squared")

    @property
    def initial_parameters(self) -> tuple[np.ndarray, ...]:
        """The initial parameters in the canonical order (float32 copies)."""
        return tuple(t.astype(np.float32).copy() for t in self.spec.unflatten(self.initial_weight))

    @property
    def dataset_size(self) -> int:
        """n, the number of records (canaries included)."""
        return int(self.features.shape[0])

    @property
    def dimension(self) -> int:
        """d, the number of input features (the number of weights of the linear task)."""
        return int(self.features.shape[1])

    @property
    def batch_size(self) -> int:
        """round(q n): the batch size of implementations that use fixed-size batches."""
        return max(1, round(self.sampling_probability * self.dataset_size))


@dataclasses.dataclass(frozen=True)
class Claim:
    """What an implementation says it ran, and what its own accountant says that costs.

    ``divisor`` is what the noisy clipped sum is divided by (q N for Poisson lots, the batch size
    for fixed-size batches); None (the default) lets the auditor derive it from the lots the
    observer saw (:func:`derived_divisor`). ``accounting_assumes`` is the sampling its epsilon
    is computed for; ``sampler`` the one it actually uses (as it says). ``epsilon`` is None when the
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
    divisor: float | None = None
    epsilon: float | None = None
    accountant: str = ""

    def __post_init__(self) -> None:
        for name in ("sampler", "accounting_assumes"):
            value = getattr(self, name)
            if value not in SAMPLERS:
                raise InvalidParameterError(name, f"one of {SAMPLERS}", value)
        if self.divisor is not None and not (
            isinstance(self.divisor, (int, float))
            and not isinstance(self.divisor, bool)
            and math.isfinite(self.divisor)
            and self.divisor > 0
        ):
            raise InvalidParameterError("divisor", "> 0 and finite (or None)", self.divisor)


class Observer:
    """Collects the parameter trace: :meth:`step` once after every optimizer step.

    ``lot`` (the record indices used at that step) is optional: implementations that can say
    which records they used pass it, and the per-step white-box and structural audits need it.
    ``spec`` (the task's model) lets :meth:`step` take the parameter tuple in the canonical
    order; without it (or for the linear task) one parameter vector is taken as well.
    """

    def __init__(
        self, initial_weight: np.ndarray | Sequence[np.ndarray], spec: ModelSpec | None = None
    ) -> None:
        self.spec = spec
        first = self._vector(initial_weight, "initial_weight")
        self.weights: list[np.ndarray] = [first]
        self.lots: list[np.ndarray] | None = []

    def _vector(self, weight: np.ndarray | Sequence[np.ndarray], name: str) -> np.ndarray:
        if isinstance(weight, (tuple, list)):
            if self.spec is not None:
                return self.spec.flatten([np.asarray(t) for t in weight])
            return np.concatenate([np.asarray(t, dtype=np.float64).reshape(-1) for t in weight])
        vector = np.asarray(weight, dtype=np.float64).reshape(-1)
        if self.spec is not None and vector.size != self.spec.size:
            raise InvalidParameterError(name, f"a vector of {self.spec.size} values", vector.shape)
        return vector.copy()

    def step(
        self,
        weight: np.ndarray | Sequence[np.ndarray],
        lot: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        """Record the parameters after one step (and, if known, the records used).

        ``weight`` is the parameter vector, or the tuple of tensors in the canonical order
        (``W1, b1, W2, b2, ...``; torch ``nn.Linear`` layout).
        """
        vector = self._vector(weight, "weight")
        if vector.shape != self.weights[0].shape:
            raise InvalidParameterError(
                "weight", f"a vector of {self.weights[0].size} values", vector.shape
            )
        if not np.all(np.isfinite(vector)):
            raise InvalidParameterError("weight", "finite", "NaN or inf")
        self.weights.append(vector)
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
        """s_t,i (steps x coordinates) of the module doc (linear task), divisor derived."""
        if self.steps != task.steps:
            raise InvalidParameterError(
                "observed steps", f"= task.steps = {task.steps}", self.steps
            )
        trace = np.stack(self.weights)[:, list(coordinates)]
        divisor = derived_divisor(task, claim, self)
        return np.diff(trace, axis=0) * divisor / (task.learning_rate * task.max_grad_norm)


def derived_divisor(task: AuditTask, claim: Claim, observer: Observer) -> float:
    """What the noisy clipped sum is divided by, read from the lots where the observer has them.

    Lots all of one size B (fixed-size batches, e.g. B = round(q N)): B, whatever the claim
    says. Otherwise (lots of varying size, or none reported) the claim's divisor if it gives
    one, else q N (the claimed q) for a Poisson claim (or when no lots are known) and the
    largest lot for others (shuffled batches whose last one is short).
    """
    if observer.lots:
        sizes = {int(lot.size) for lot in observer.lots}
        if len(sizes) == 1 and min(sizes) > 0:
            return float(sizes.pop())
    if claim.divisor is not None:
        return float(claim.divisor)
    if claim.sampler == "poisson" or not observer.lots:
        return claim.sampling_probability * task.dataset_size
    return float(max(lot.size for lot in observer.lots))


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
        canary_inputs=np.eye(m, m + real_features),
        canary_targets=np.full(m, CANARY_TARGET * max_grad_norm),
        canary_slots=tuple(included),
    )


def make_mlp_task(
    *,
    real_records: int,
    real_features: int,
    hidden: int,
    classes: int,
    canaries: Sequence[bool],
    sampling_probability: float,
    noise_multiplier: float,
    max_grad_norm: float,
    learning_rate: float,
    steps: int,
    delta: float,
    seed: int,
    rare_records: int = 1,
    report_epsilon: bool = True,
) -> AuditTask:
    """An MLP classifier with biases, a rare class and input-space canaries of that class.

    Layers ``(m + real_features, m + hidden, classes)``, ReLU, softmax cross-entropy, where
    ``m = len(canaries)``. Real records (Gaussian on features ``m..``) are labelled by a random
    linear teacher with classes ``0..classes-2``; ``rare_records`` of them are relabelled to
    the rare class ``classes - 1``, which every canary has (with ``rare_records = 0`` the
    canaries are a singleton class). Canary ``i`` is ``x = A e_i`` (A =
    :data:`MLP_CANARY_SCALE`), wired to hidden unit ``i`` alone (``W1[i, i] = 1``,
    ``b1[i] = -1``: off for every real record) whose output weights vote against the rare
    class, so its gradient is about 24 in norm, in every tensor (biases too).
    """
    if classes < 2:
        raise InvalidParameterError("classes", ">= 2", classes)
    if not 0 <= rare_records <= real_records:
        raise InvalidParameterError("rare_records", f"in [0, {real_records}]", rare_records)
    rng = np.random.default_rng(seed)
    m = len(canaries)
    d, h = m + real_features, m + hidden
    x_real = np.zeros((real_records, d))
    x_real[:, m:] = rng.standard_normal((real_records, real_features))
    teacher = rng.standard_normal((real_features, classes - 1))
    y_real = np.argmax(x_real[:, m:] @ teacher, axis=1)
    y_real[:rare_records] = classes - 1
    rare = classes - 1
    included = [i for i, present in enumerate(canaries) if present]
    x_canary = np.zeros((len(included), d))
    x_canary[np.arange(len(included)), included] = MLP_CANARY_SCALE
    features = np.concatenate([x_real, x_canary])
    targets = np.concatenate([y_real, np.full(len(included), rare)])
    order = rng.permutation(features.shape[0])
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    w1 = np.zeros((h, d))
    w1[m:, m:] = rng.standard_normal((hidden, real_features)) / np.sqrt(real_features)
    w1[np.arange(m), np.arange(m)] = 1.0
    b1 = np.zeros(h)
    b1[:m] = -1.0
    w2 = np.zeros((classes, h))
    w2[:, m:] = rng.standard_normal((classes, hidden)) / np.sqrt(hidden)
    w2[0, :m], w2[rare, :m] = 1.0, -1.0
    b2 = np.zeros(classes)
    spec = ModelSpec((d, h, classes), bias=True, activation="relu", loss="cross_entropy")
    return AuditTask(
        features=features[order].astype(np.float32),
        targets=targets[order].astype(np.int64),
        initial_weight=spec.flatten([w1, b1, w2, b2]).astype(np.float32),
        sampling_probability=sampling_probability,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        learning_rate=learning_rate,
        steps=steps,
        delta=delta,
        seed=seed,
        canary_rows=tuple(int(position[real_records + k]) for k in range(len(included))),
        report_epsilon=report_epsilon,
        model=spec,
        canary_inputs=np.eye(m, d) * MLP_CANARY_SCALE,
        canary_targets=np.full(m, rare),
        canary_slots=tuple(included),
        name="mlp",
    )
