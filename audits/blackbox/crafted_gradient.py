"""Hidden-state (last-iterate) audits with a crafted gradient, on the black-box audit's runs.

The threat model of Cebere, Bellet & Papernot (ICLR 2025, "Tighter privacy auditing of DP-SGD in
the hidden state threat model"): the adversary controls the target's gradient but sees only the
final parameters. The target is a record of the training set like any other ("in" world; absent
in the "out" world), trained on with the setting's implementation -- dpcore's DP-SGD
(:class:`~dpcore.torch.training.DPTrainer`, the fast per-example engine) or Opacus 1.6 -- on the
black-box audit's MNIST records and model (:mod:`audits.blackbox`), through
:func:`audits.blackbox.training.fit`. Its per-example gradient is crafted through its input and
loss, so that the implementation's own machinery computes, clips, sums and noises it like any
example's: :class:`CraftedLoss` gives the crafted record (label :data:`CRAFTED_LABEL`) the loss
``-g z_k`` (``z_k``: the logit of class k, the setting's ``target_label``) at the chosen steps
(every ``period``-th step, the first included: :func:`inserted_steps`) and ``0`` at the others;
every other record keeps its cross-entropy loss. ``g = norm C / ||grad z_k||`` at the initial
parameters, so the crafted gradient has norm ``norm * C`` and is clipped to C (``norm >= 1``).

- **Linear model** (exact): the crafted image is zero except for pixel ``j``, a pixel that is
  zero in every record of the training set and of the pre-training records (:func:`zero_pixel`),
  set to :data:`PIXEL_VALUE`. Its gradient is ``-g (PIXEL_VALUE e_{W[k, j]} + e_{b[k]})`` at
  every step; clipped to C it moves ``W[k, j]`` by ``lr C PIXEL_VALUE / sqrt(PIXEL_VALUE^2 + 1)
  / D`` (C up to a relative 5e-9) each step it is in the lot, D the public divisor q N. No real
  record's gradient touches ``W[k, j]``, so the score -- the final ``W[k, j]`` -- is
  ``W_0[k, j] + lr / D (C B + sigma C Z sqrt(T))``, ``B`` the number of chosen steps whose lot
  held the target (0 in the "out" world), ``Z ~ N(0, 1)``.
- **MLP and CNN**: the crafted image is blank (all zero) and its gradient
  ``-g grad z_k(x; theta_t)`` moves with the parameters; the score is the final parameters'
  move projected on the crafted gradient's direction at the initial parameters,
  ``<theta_T - theta_0, d_0>`` (:func:`crafted_direction`). Other records' gradients have parts
  along ``d_0`` too, so the score's law is the linear model's only approximately (when
  ``d_t`` stays ``d_0`` and the others' part is the same in both worlds); every run records how
  far it strayed -- the smallest cosine of ``d_t`` with ``d_0`` and the smallest norm of the
  crafted gradient, in units of C, over the chosen steps (below 1: not clipped, smaller than C).
  The audit's decision does not rest on that law (thresholds are chosen on held-out runs; the
  Gaussian-scores route checks its assumption).

The divisor D is the black-box audit's public q N in both worlds
(:func:`audits.blackbox.training.public_divisor`), not q (N + 1) in the "in" world. The audit of
these runs, what the score can show (its own epsilon) and the table are in
:mod:`audits.blackbox.crafted_audit`; this module holds only what determines a run (its
fingerprint keys the run store).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.blackbox import data, settings, training
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting, check_setting
from audits.dpsgd_whitebox import single_thread
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count, check_positive

__all__ = [
    "CRAFTED_LABEL",
    "PIXEL_VALUE",
    "SCORE",
    "CraftedLoss",
    "CraftedRun",
    "CraftedSetting",
    "check_crafted_run",
    "check_crafted_setting",
    "crafted_direction",
    "crafted_record",
    "crafted_scale",
    "execute",
    "inserted_steps",
    "noise_seed",
    "score",
    "sigma",
    "train",
    "zero_pixel",
]

#: The crafted record's value at its pixel: its gradient's bias part is 1 / PIXEL_VALUE of it.
PIXEL_VALUE = 1e4
#: The crafted record's label (no class has it): :class:`CraftedLoss` recognises it.
CRAFTED_LABEL = -1
#: The base setting by default: the black-box audit's strongest (worst-case init, full batch).
DEFAULT_BASE = BlackBoxSetting()
#: The one score of a run: the final W[k, j] (linear model) or the parameters' move along the
#: crafted direction (MLP, CNN); larger: more likely "in".
SCORE = "projection"


@dataclasses.dataclass(frozen=True)
class CraftedSetting:
    """A black-box setting (data, model, init, q, steps, lr, C) with a crafted-gradient target.

    ``period``: the target's crafted gradient is in the chosen steps ``0, k, 2k, ...``;
    ``norm``: its norm in units of C (>= 1, so that the engine clips it to C). The class k of
    the crafted logit is ``base.target_label``; ``base.target`` is not used.
    """

    name: str
    base: BlackBoxSetting = DEFAULT_BASE
    period: int = 1
    norm: float = 4.0


@dataclasses.dataclass(frozen=True)
class CraftedRun:
    """One training: ``setting`` at the claim ``epsilon``, in ``world``, with run seed ``seed``."""

    setting: CraftedSetting
    epsilon: float
    world: str
    seed: int


def check_crafted_setting(setting: CraftedSetting) -> CraftedSetting:
    """Return ``setting`` after checking it.

    Raises:
        InvalidParameterError: not a CraftedSetting, an empty name, a bad base setting (see
            :func:`audits.blackbox.settings.check_setting`), a period below 1, or a norm not
            >= 1 and finite.
    """
    if not isinstance(setting, CraftedSetting):
        raise InvalidParameterError("setting", "to be a CraftedSetting", setting)
    if not isinstance(setting.name, str) or not setting.name:
        raise InvalidParameterError("name", "a non-empty str", setting.name)
    check_setting(setting.base)
    check_count("period", setting.period, minimum=1)
    norm = check_positive("norm", setting.norm)
    if not 1.0 <= norm < math.inf:
        raise InvalidParameterError("norm", "in [1, inf) (units of C: clipping must act)", norm)
    return setting


def check_crafted_run(run: CraftedRun) -> CraftedRun:
    """Return ``run`` after checking it and its setting.

    Raises:
        InvalidParameterError: a bad setting (see :func:`check_crafted_setting`), or an
            epsilon, world or seed refused by :func:`audits.blackbox.settings.check_run`.
    """
    if not isinstance(run, CraftedRun):
        raise InvalidParameterError("run", "to be a CraftedRun", run)
    check_crafted_setting(run.setting)
    settings.check_run(_base_run(run))
    return run


def _base_run(run: CraftedRun) -> BlackBoxRun:
    return BlackBoxRun(run.setting.base, run.epsilon, run.world, run.seed)


def inserted_steps(steps: int, period: int) -> int:
    """m = ceil(steps / period): how many steps (0, k, 2k, ... < T) carry the crafted gradient.

    Raises:
        InvalidParameterError: ``steps`` or ``period`` below 1.
    """
    steps = check_count("steps", steps, minimum=1)
    period = check_count("period", period, minimum=1)
    return -(-steps // period)


@functools.cache
def zero_pixel(base: BlackBoxSetting) -> int:
    """The first pixel that is 0 in every record of the subset and of the pre-training records.

    Raises:
        InvalidParameterError: a bad setting, or no such pixel.
    """
    x, _ = data.subset(check_setting(base))
    touched = np.any(x != 0, axis=0)
    if base.init == "worst_case":
        touched |= np.any(data.pretraining_records(base)[0] != 0, axis=0)
    free = np.flatnonzero(~touched)
    if free.size == 0:
        raise InvalidParameterError(
            "subset_size", "to leave a pixel zero in every record", base.subset_size
        )
    return int(free[0])


def crafted_record(setting: CraftedSetting) -> data.Records:
    """The crafted record: a (1, 784) float32 image -- PIXEL_VALUE at :func:`zero_pixel` and 0
    elsewhere for the linear model, blank for the others -- and its (1,) int64 label
    :data:`CRAFTED_LABEL`."""
    base = check_crafted_setting(setting).base
    image = np.zeros((1, 784), np.float32)
    if base.model == "linear":
        image[0, zero_pixel(base)] = PIXEL_VALUE
    return image, np.array([CRAFTED_LABEL], np.int64)


def _logit_gradient(
    base: BlackBoxSetting, image: np.ndarray, state: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """grad_theta z_k(image) at the parameters ``state`` (float64, a fresh model: no hooks)."""
    model = training.make_model(base)
    model.load_state_dict(state)
    model.double()
    logit = model(torch.from_numpy(image).double())[0, base.target_label]
    names = [name for name, _ in model.named_parameters()]
    grads = torch.autograd.grad(logit, list(model.parameters()))
    return dict(zip(names, grads, strict=True))


def _norm(vector: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(value.pow(2).sum()) for value in vector.values()))


@functools.cache
def _initial_gradient(setting: CraftedSetting) -> dict[str, torch.Tensor]:
    image, _ = crafted_record(setting)
    return _logit_gradient(setting.base, image, training.initial_state(setting.base))


def crafted_direction(setting: CraftedSetting) -> dict[str, torch.Tensor]:
    """d_0: the unit direction of grad_theta z_k at the crafted image and the initial
    parameters, by parameter name (float64); the crafted gradient is ``-g`` times the
    gradient, so a step on it moves the parameters along ``+d_0``."""
    gradient = _initial_gradient(check_crafted_setting(setting))
    size = _norm(gradient)
    return {name: value / size for name, value in gradient.items()}


def crafted_scale(setting: CraftedSetting) -> float:
    """g = norm C / ||grad_theta z_k|| at the initial parameters (the crafted gradient's norm
    is then norm C there; for the linear model at every step)."""
    check_crafted_setting(setting)
    return setting.norm * setting.base.max_grad_norm / _norm(_initial_gradient(setting))


class CraftedLoss:
    """Per-example losses: cross-entropy, except ``-g z_k`` (``active``) or 0 for the crafted
    record (label :data:`CRAFTED_LABEL`).

    Args:
        class_index: k, the crafted logit.
        scale: g > 0.

    ``active`` is set by the training loop before each step (True at the chosen steps).
    """

    def __init__(self, class_index: int, scale: float) -> None:
        self.class_index = class_index
        self.scale = scale
        self.active = True

    def __call__(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        crafted = labels == CRAFTED_LABEL
        real = nn.functional.cross_entropy(
            outputs, torch.where(crafted, 0, labels), reduction="none"
        )
        weight = -self.scale if self.active else 0.0
        return torch.where(crafted, weight * outputs[:, self.class_index], real)


def noise_seed(run: CraftedRun) -> int:
    """The seed of the run's noise and lots: the black-box run's hash
    (:func:`audits.blackbox.training.run_seed`) hashed again with the period and norm, so that
    rows of other periods share no noise draws."""
    entropy = [training.run_seed(_base_run(run)), run.setting.period, round(run.setting.norm * 1e6)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def sigma(setting: CraftedSetting, epsilon: float) -> float:
    """dpcore's PLD-calibrated noise multiplier of the base setting at ``epsilon``."""
    base = setting.base
    return training.noise_multiplier(epsilon, base.delta, base.sampling_probability, base.steps)


class _Probe:
    """Before each chosen step: the crafted gradient's cosine with d_0 and its norm in units of
    C (the smallest of each over the run), from a copy of the parameters (no hooks touched)."""

    def __init__(self, setting: CraftedSetting, loss: CraftedLoss) -> None:
        self.setting = setting
        self.loss = loss
        self.image = crafted_record(setting)[0]
        self.direction = crafted_direction(setting)
        self.cosine = math.inf
        self.norm = math.inf

    def __call__(self, step: int, model: nn.Module) -> None:
        self.loss.active = step % self.setting.period == 0
        if not self.loss.active:
            return
        state = {name: value.detach() for name, value in model.state_dict().items()}
        gradient = _logit_gradient(self.setting.base, self.image, state)
        size = _norm(gradient)
        along = sum(float((gradient[name] * self.direction[name]).sum()) for name in gradient)
        self.cosine = min(self.cosine, along / size if size > 0 else 0.0)
        scale = self.loss.scale / self.setting.base.max_grad_norm
        self.norm = min(self.norm, scale * size)


def _train(run: CraftedRun, noise: bool) -> tuple[nn.Module, _Probe]:
    setting = check_crafted_run(run).setting
    base = setting.base
    x, y = data.subset(base)
    if run.world == "in":
        cx, cy = crafted_record(setting)
        x, y = np.concatenate([x, cx]), np.concatenate([y, cy])
    loss = CraftedLoss(base.target_label, crafted_scale(setting))
    probe = _Probe(setting, loss)
    model = training.fit(
        base,
        x,
        y,
        seed=noise_seed(run),
        noise_multiplier=sigma(setting, run.epsilon),
        # the black-box runs' public divisor, q times the subset's size in both worlds (the
        # implementations' own, q times the run's training set, is one record larger "in")
        divisor=training.public_divisor(base),
        loss_fn=loss,
        before_step=probe,
        noise=noise,
    )
    return model, probe


def train(run: CraftedRun, *, noise: bool = True) -> nn.Module:
    """The final model of ``run``, trained with :class:`CraftedLoss` by the setting's
    implementation (:func:`audits.blackbox.training.fit`) on the subset, plus the crafted record
    in the "in" world (call it with one torch thread).

    Args:
        run: the run.
        noise: False to train without noise (tests: the crafted gradient alone).

    Raises:
        InvalidParameterError: a bad run.
    """
    return _train(run, noise)[0]


def score(setting: CraftedSetting, model: nn.Module) -> float:
    """The run's score: the final ``W[k, j]`` (linear model), else
    ``<theta_T - theta_0, d_0>`` (:func:`crafted_direction`)."""
    base = check_crafted_setting(setting).base
    if base.model == "linear":
        return float(model.get_parameter("weight").detach()[base.target_label, zero_pixel(base)])
    start = training.initial_state(base)
    direction = crafted_direction(setting)
    return float(
        sum(
            ((value.detach().double() - start[name].double()) * direction[name]).sum()
            for name, value in model.named_parameters()
        )
    )


def execute(run: CraftedRun) -> dict[str, Any]:
    """Train ``run``'s model; its score, sigma, the crafted gradient's smallest cosine with d_0
    and smallest norm (units of C) over the chosen steps, and the seconds (JSON).

    Raises:
        InvalidParameterError: a bad run.
    """
    start = time.perf_counter()
    with single_thread():
        model, probe = _train(run, noise=True)
        value = score(run.setting, model)
    return {
        SCORE: value,
        "noise_multiplier": sigma(run.setting, run.epsilon),
        "cosine": probe.cosine,
        "norm": probe.norm,
        "seconds": time.perf_counter() - start,
    }
