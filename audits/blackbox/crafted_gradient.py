"""Hidden-state (last-iterate) audits with a crafted gradient, on the black-box audit's runs.

The threat model of Cebere, Bellet & Papernot (ICLR 2025, "Tighter privacy auditing of DP-SGD in
the hidden state threat model"): the adversary controls the target's gradient but sees only the
final parameters. The target is a record of the training set like any other ("in" world; absent
in the "out" world), trained on with dpcore's DP-SGD (:class:`~dpcore.torch.training.DPTrainer`,
Poisson lots, the fast per-example engine, the noise of the claim) on the black-box audit's
1,000-record MNIST subset and model (:mod:`audits.blackbox`). Its per-example gradient is
crafted through its input and loss, so that dpcore's own engine computes, clips, sums and
noises it like any example's:

- the crafted record's image is zero except for pixel ``j``, a pixel that is zero in every
  record of the subset and of the pre-training records (:func:`zero_pixel`), set to
  :data:`PIXEL_VALUE`; its label is :data:`CRAFTED_LABEL`;
- :class:`CraftedLoss` gives it the loss ``-g z_k`` (``z_k``: the logit of class k, the
  setting's ``target_label``) at the chosen steps (every ``period``-th step, the first
  included: :func:`inserted_steps`) and ``0`` at the others; every other record keeps its
  cross-entropy loss.

Its gradient is then ``-g (PIXEL_VALUE e_{W[k, j]} + e_{b[k]})``, of norm ``norm * C`` with
``g = norm C / sqrt(PIXEL_VALUE^2 + 1)``; clipped to C by the engine (``norm >= 1``), it moves
the weight ``W[k, j]`` by ``lr C PIXEL_VALUE / sqrt(PIXEL_VALUE^2 + 1) / (q N)`` (``C`` up to a
relative 5e-9) at each step it is in the lot, N the subset's size: the runs divide by the
black-box audit's public divisor q N in both worlds
(:func:`audits.blackbox.training.public_divisor`), not by DPTrainer's q (N + 1) in the "in"
world. No real record's gradient touches ``W[k, j]`` (pixel j is zero), so the score -- the
final ``W[k, j]``, the final parameters projected on the crafted direction's weight
coordinate -- is ``W_0[k, j] + lr / (q N) (C B + sigma C Z sqrt(T))``
with ``B`` the number of chosen steps whose lot held the target (0 in the "out" world) and
``Z ~ N(0, 1)``.

The audit of these runs, what the score can show (its own epsilon) and the table are in
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
from dpcore.torch.noise import NoiseSource
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
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
    "crafted_record",
    "execute",
    "inserted_steps",
    "noise_seed",
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
#: The one score of a run: the final weight W[k, j] (larger: more likely "in").
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
            :func:`audits.blackbox.settings.check_setting`), a model other than "linear" (the
            crafted direction is a weight of the linear model), an implementation other than
            "dpcore", a period below 1, or a norm
            not >= 1 and finite.
    """
    if not isinstance(setting, CraftedSetting):
        raise InvalidParameterError("setting", "to be a CraftedSetting", setting)
    if not isinstance(setting.name, str) or not setting.name:
        raise InvalidParameterError("name", "a non-empty str", setting.name)
    check_setting(setting.base)
    if setting.base.implementation != "dpcore":
        raise InvalidParameterError(
            "implementation", "'dpcore' (the crafted loss is dpcore's)", setting.base.implementation
        )
    if setting.base.model != "linear":
        raise InvalidParameterError(
            "model", "'linear' (the crafted weight's model)", setting.base.model
        )
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
    """The crafted record: (1, 784) float32 image, PIXEL_VALUE at :func:`zero_pixel`, 0 else,
    and its (1,) int64 label :data:`CRAFTED_LABEL`."""
    image = np.zeros((1, 784), np.float32)
    image[0, zero_pixel(check_crafted_setting(setting).base)] = PIXEL_VALUE
    return image, np.array([CRAFTED_LABEL], np.int64)


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


def train(run: CraftedRun, *, noise: NoiseSource | None = None) -> nn.Module:
    """The final model of ``run``, trained by :meth:`DPTrainer.dp_sgd` on the subset (plus the
    crafted record in the "in" world) with :class:`CraftedLoss` (one torch thread).

    Args:
        run: the run.
        noise: the noise source (default: seeded from the run); tests pass one drawing zeros
            to see the crafted gradient alone.

    Raises:
        InvalidParameterError: a bad run.
    """
    setting = check_crafted_run(run).setting
    base = setting.base
    x, y = data.subset(base)
    if run.world == "in":
        cx, cy = crafted_record(setting)
        x, y = np.concatenate([x, cx]), np.concatenate([y, cy])
    model = training.make_model(base)
    model.load_state_dict(training.initial_state(base))
    seed = noise_seed(run)
    scale = setting.norm * base.max_grad_norm / math.sqrt(PIXEL_VALUE**2 + 1)
    loss = CraftedLoss(base.target_label, scale)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=base.lr,
        inputs=torch.from_numpy(x),
        targets=torch.from_numpy(y),
        loss_fn=loss,
        noise_multiplier=sigma(setting, run.epsilon),
        max_grad_norm=base.max_grad_norm,
        sampler=PoissonSampler(len(y), sampling_probability=base.sampling_probability, seed=seed),
        engine="fast",
        noise=noise,
        seed=seed,
    )
    # the black-box runs' public divisor, q times the subset's size in both worlds (DPTrainer's
    # own, q times the run's training set, would be one record larger in the "in" world)
    trainer.optimizer.expected_batch_size = training.public_divisor(base)
    for step in range(base.steps):
        loss.active = step % setting.period == 0
        trainer.step()
    return model


def execute(run: CraftedRun) -> dict[str, Any]:
    """Train ``run``'s model; its score (the final W[k, j]), sigma and seconds (JSON).

    Raises:
        InvalidParameterError: a bad run.
    """
    start = time.perf_counter()
    with single_thread():
        model = train(run)
    weight = model.get_parameter("weight").detach()
    k, j = run.setting.base.target_label, zero_pixel(run.setting.base)
    return {
        SCORE: float(weight[k, j]),
        "noise_multiplier": sigma(run.setting, run.epsilon),
        "seconds": time.perf_counter() - start,
    }
