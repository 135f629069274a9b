"""The MNIST model, data, projection and resumable DP-SGD run of Abadi et al. 2016, §5.2.

Shared by the noise-level experiment (:mod:`reproductions.abadi2016.mnist`, Fig. 3) and the
parameter sweeps (:mod:`reproductions.abadi2016.sweeps`, Fig. 5). Paper values (arXiv v2, §5.2):
a 60-dimensional DP-PCA projection, one hidden layer of 1,000 ReLU units, softmax over 10
classes, lot size 600 of 60,000, clipping at 4, learning rate 0.1 decaying linearly to 0.052 over
10 epochs and then constant; delta = 1e-5.

:func:`train_private` (DP-PCA, then DP-SGD) and :func:`train_baseline` (exact PCA, plain SGD) run
on the reproduction harness (:func:`reproductions.harness.run_training`): a row every
``eval_every`` epochs and at the end, committed with a checkpoint to the run's folder in the run
store when one is given, so a restart resumes, a finished run is read back without training, and
a ``deadline`` stops a run early (its state says how far it got). The released projection is
saved in the run's folder (``projection.npy``) before the first step and reused on every restart.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.accountants.report import epsilon_report
from dpcore.atomic import atomic_path
from dpcore.data.datasets import load_mnist
from dpcore.errors import InvalidParameterError
from dpcore.events import ComposedEvent, DpEvent, dpsgd_event
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.abadi2016.pca import dp_pca_directions, pca_event, random_directions
from reproductions.common import code_fingerprint
from reproductions.harness import (
    NonPrivateTrainer,
    RunState,
    Trainable,
    evaluate,
    run_training,
    torch_seeded,
)
from reproductions.harness.device import default_device

PROJECTIONS = ("dp_pca", "random", "none")
#: Training inputs, training labels, test inputs, test labels (flattened pixels in [0, 1]).
Data = tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]
#: The released projection of a run, in its folder of the run store.
PROJECTION_FILE = "projection.npy"
#: Training examples of MNIST (the fan-out orders its runs by their steps before loading data).
MNIST_TRAIN_SIZE = 60_000
#: Training accuracy is measured on this many of the first training examples.
TRAIN_EVAL = 10_000

#: The code a run's result depends on: a change here starts its runs afresh.
CODE_MODULES = (
    "dpcore.torch",
    "dpcore.accountants",
    "dpcore.events",
    "dpcore.pld",
    "reproductions.harness",
    "reproductions.abadi2016.mnist_core",
    "reproductions.abadi2016.pca",
)


@dataclasses.dataclass(frozen=True)
class MnistConfig:
    """One profile. Tuples are indexed like the noise levels (large, medium, small).

    Paper values cite Abadi et al. 2016 (arXiv v2): §5.2 text and Fig. 3.
    """

    profile: str = "quick"
    #: (sigma, sigma_p) per level, §5.2: large (8, 16), medium (4, 7), small (2, 4).
    noise_multipliers: tuple[float, ...] = (8.0, 4.0, 2.0)
    pca_noise: tuple[float, ...] = (16.0, 7.0, 4.0)
    #: Epochs actually run per level (quick: far fewer than the paper; labelled in the table).
    epochs: tuple[int, ...] = (12, 12, 12)
    #: Epochs of the paper's runs, read off Fig. 3 (each curve ends where delta reaches 1e-5 at
    #: the level's epsilon): about 16, 130 and 780. Approximate readings of a plot.
    paper_epochs: tuple[int, ...] = (16, 130, 780)
    #: §5.2: 90 %, 95 %, 97 % test accuracy at (0.5, 1e-5), (2, 1e-5), (8, 1e-5).
    paper_epsilon: tuple[float, ...] = (0.5, 2.0, 8.0)
    paper_accuracy: tuple[float, ...] = (0.90, 0.95, 0.97)
    #: §5.2 baseline: 98.30 % "in about 100 epochs".
    paper_baseline_accuracy: float = 0.983
    baseline_epochs: int = 20
    lot_size: int = 600
    max_grad_norm: float = 4.0
    hidden_units: int = 1000
    #: "dp_pca" (the paper's), "random" (Fig. 5(1)'s random projection) or "none" (raw pixels).
    projection: str = "dp_pca"
    pca_components: int = 60
    #: Poisson rate of the PCA's sample. §4 says only "a random sample"; 1.0 (every training
    #: image) is our reading of Fig. 3, whose delta at epoch 0 equals that of an unsampled
    #: Gaussian with sigma_p = 16 (8.9e-7 at epsilon 0.5), and of the authors' released code.
    pca_sample_rate: float = 1.0
    lr_start: float = 0.1
    lr_end: float = 0.052
    lr_decay_epochs: int = 10
    delta: float = 1e-5
    #: Evaluate (and commit a checkpoint) every this many epochs (0: only at the end); the last
    #: step is always evaluated.
    eval_every: int = 1
    #: Keep the runs in the run store (resumable), as the full profile does; quick does not.
    checkpoint: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.projection not in PROJECTIONS:
            raise InvalidParameterError("projection", f"in {PROJECTIONS}", self.projection)
        if self.lot_size < 1:
            raise InvalidParameterError("lot_size", ">= 1", self.lot_size)
        if self.eval_every < 0:
            raise InvalidParameterError("eval_every", ">= 0", self.eval_every)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One DP-SGD run: its name, noise multipliers, length in steps and seed."""

    name: str
    noise_multiplier: float
    pca_noise: float
    steps: int
    seed: int


def learning_rate(config: MnistConfig, epoch_fraction: float) -> float:
    """Linear decay from lr_start to lr_end over lr_decay_epochs, then constant (§5.2)."""
    t = min(epoch_fraction / config.lr_decay_epochs, 1.0)
    return config.lr_start + (config.lr_end - config.lr_start) * t


class ScheduledTrainer:
    """A :class:`~reproductions.harness.Trainable` that sets the learning rate before each step.

    ``rate(steps_done)`` is written into every parameter group of ``optimizer`` (the wrapped
    trainer's torch optimizer), then the wrapped trainer steps. The groups are looked up at each
    step: loading a checkpoint replaces them. Checkpoints are the wrapped trainer's; the rate is a
    function of the step count, so a resumed run continues the same schedule.
    """

    def __init__(
        self,
        trainer: Trainable,
        optimizer: torch.optim.Optimizer,
        rate: Callable[[int], float],
    ) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.optimizer = optimizer
        self.rate = rate

    @property
    def steps_done(self) -> int:
        return self.trainer.steps_done

    def step(self) -> object:
        """Set the scheduled rate of this step, then take it."""
        rate = self.rate(self.trainer.steps_done)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        return self.trainer.step()

    def save_checkpoint(self, path: str | Path) -> None:
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path) -> None:
        self.trainer.load_checkpoint(path)


def make_model(config: MnistConfig, input_dim: int | None = None) -> nn.Module:
    """input -> hidden_units ReLU -> 10 (softmax is in the loss); input defaults to the PCA size."""
    return nn.Sequential(
        nn.Linear(input_dim or config.pca_components, config.hidden_units),
        nn.ReLU(),
        nn.Linear(config.hidden_units, 10),
    )


def load_data() -> Data:
    """MNIST flattened and scaled to [0, 1] (float64 for the PCA), labels as int64 tensors."""
    x_train, y_train = load_mnist("train")
    x_test, y_test = load_mnist("test")
    flat_train = x_train.reshape(len(x_train), -1).astype(np.float64) / 255.0
    flat_test = x_test.reshape(len(x_test), -1).astype(np.float64) / 255.0
    return (
        flat_train,
        torch.as_tensor(y_train, dtype=torch.long),
        flat_test,
        torch.as_tensor(y_test, dtype=torch.long),
    )


def steps_per_epoch(config: MnistConfig, dataset_size: int) -> int:
    """Lots per epoch, 1/q = N/L rounded (100 for the paper's 600 of 60,000)."""
    return max(1, round(dataset_size / config.lot_size))


def eval_steps(config: MnistConfig, steps: int, per_epoch: int) -> int:
    """Steps between evaluations: ``eval_every`` epochs, or the whole run if it is 0."""
    return config.eval_every * per_epoch if config.eval_every > 0 else steps


def make_projection(
    config: MnistConfig, x_train: np.ndarray, pca_noise: float, rng: np.random.Generator
) -> np.ndarray | None:
    """The input projection (d x k), or None for raw pixels."""
    if config.projection == "none":
        return None
    if config.projection == "random":
        return random_directions(x_train.shape[1], config.pca_components, rng)
    return dp_pca_directions(
        x_train,
        components=config.pca_components,
        noise_std=pca_noise,
        sample_rate=config.pca_sample_rate,
        rng=rng,
    )


def projection_event(config: MnistConfig, pca_noise: float) -> DpEvent | None:
    """The DP-PCA's privacy event; None for projections that do not look at the data."""
    if config.projection != "dp_pca":
        return None
    return pca_event(noise_std=pca_noise, sample_rate=config.pca_sample_rate)


def with_projection(training: DpEvent, projection: DpEvent | None) -> DpEvent:
    """The training steps composed with the projection's release (if it has one)."""
    return training if projection is None else ComposedEvent([projection, training])


def epsilon_columns(
    event: DpEvent, delta: float, accountants: tuple[str, ...] = ("moments", "rdp", "pld")
) -> dict[str, float | None]:
    """:func:`~dpcore.accountants.report.epsilon_report` under the results' keys.

    ``moments``, ``rdp``, ``pld_lower`` and ``pld_upper`` (for the default accountants: the
    moments accountant as in the paper, RDP and the tight PLD interval); None is infinite.
    """
    report = epsilon_report(event, delta, accountants)
    return {key.removeprefix("epsilon_"): value for key, value in report.items()}


def steps_within_budget(
    *,
    sampling_probability: float,
    noise_multiplier: float,
    target_epsilon: float,
    delta: float,
    extra: DpEvent | None = None,
    max_steps: int = 10_000_000,
) -> int:
    """The most DP-SGD steps whose moments-accountant epsilon (with ``extra``) stays <= target.

    How §5.2's sweeps are run: "we train until the point at which (2, 1e-5)-differential
    privacy would be violated". Returns 0 if ``extra`` alone exceeds the target.
    """

    def spent(steps: int) -> float:
        training = dpsgd_event(
            sampling_probability=sampling_probability,
            noise_multiplier=noise_multiplier,
            steps=steps,
        )
        total = with_projection(training, extra)
        epsilon = epsilon_columns(total, delta, ("moments",))["moments"]
        return math.inf if epsilon is None else epsilon

    if spent(1) > target_epsilon:
        return 0
    low, high = 1, 2
    while high < max_steps and spent(high) <= target_epsilon:
        low, high = high, 2 * high
    high = min(high, max_steps)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if spent(middle) <= target_epsilon else (low, middle)
    return high if spent(high) <= target_epsilon else low


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of ``x`` classified as ``y``: the harness's evaluator, all rows in one batch."""
    return evaluate(model, x, y, batch=len(x))


def project(x: np.ndarray, directions: np.ndarray | None) -> torch.Tensor:
    """``x`` projected onto ``directions`` (or unchanged), as a float32 tensor."""
    return torch.as_tensor(x if directions is None else x @ directions, dtype=torch.float32)


def code() -> str:
    """The fingerprint of :data:`CODE_MODULES` (part of every run's folder name)."""
    return code_fingerprint(*CODE_MODULES)


def _config_spec(config: MnistConfig) -> dict[str, Any]:
    """The fields of ``config`` a run depends on (not the profile, lengths or paper values)."""
    ignored = {
        "profile",
        "noise_multipliers",
        "pca_noise",
        "epochs",
        "paper_epochs",
        "paper_epsilon",
        "paper_accuracy",
        "paper_baseline_accuracy",
        "baseline_epochs",
        "checkpoint",
    }
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored}


def private_spec(config: MnistConfig, spec: RunSpec, dataset_size: int) -> dict[str, Any]:
    """What a DP run's result depends on: its folder in the run store is keyed by this."""
    return {
        "figure": "abadi2016 mnist",
        "config": _config_spec(config),
        "run": dataclasses.asdict(spec),
        "dataset_size": dataset_size,
    }


def baseline_spec(config: MnistConfig, dataset_size: int) -> dict[str, Any]:
    """What the non-private baseline's result depends on."""
    return {
        "figure": "abadi2016 mnist",
        "config": _config_spec(config),
        "run": "non-private",
        "epochs": config.baseline_epochs,
        "dataset_size": dataset_size,
    }


def epochs_reached(state: RunState) -> float:
    """The epoch of the run's last row (0 without rows), an int when whole (``12``, not 12.0)."""
    reached = float(state.rows[-1]["epoch"]) if state.rows else 0.0
    return int(reached) if reached.is_integer() else reached


def run_status(state: RunState, epochs: float) -> str:
    """``done``, or ``stopped at epoch <reached> of <epochs> (deadline)``."""
    if state.done:
        return "done"
    return f"stopped at epoch {epochs_reached(state):g} of {epochs:g} (deadline)"


def released_projection(
    config: MnistConfig, spec: RunSpec, x_train: np.ndarray, state: RunState
) -> tuple[np.ndarray | None, RunState]:
    """The run's projection and its state: drawn once, saved before training, reused after.

    A run whose folder holds ``projection.npy`` reuses it (a restart must not release a second
    noisy PCA); one without it draws the projection and saves it (atomically) before its first
    step. A run that has rows but no saved projection starts over with a fresh state.
    """
    if config.projection == "none":
        return None, state
    path = None if state.folder is None else state.folder / PROJECTION_FILE
    if path is not None and path.is_file():
        directions: np.ndarray = np.load(path)
        return directions, state
    if state.rows or state.checkpoint is not None:
        if state.checkpoint_path is not None:
            state.checkpoint_path.unlink(missing_ok=True)
        state = state.fresh()
    drawn = make_projection(config, x_train, spec.pca_noise, np.random.default_rng(spec.seed))
    assert drawn is not None
    if path is not None:
        with atomic_path(path) as temporary, temporary.open("wb") as handle:
            np.save(handle, drawn)
    return drawn, state


def train_private(
    config: MnistConfig,
    spec: RunSpec,
    data: Data,
    *,
    store: Path | None = None,
    fingerprint: str | None = None,
    deadline: float | None = None,
) -> tuple[RunState, dict[str, Any] | None]:
    """Projection + DP-SGD for ``spec.steps`` steps; returns the run's state and its statement.

    Trains on :func:`~reproductions.harness.device.default_device` (``$DPCORE_DEVICE``, else CUDA
    when torch sees a GPU); the projection is computed on the CPU in float64 either way.

    Rows (``run``, ``step``, ``epoch``, test and train accuracy, the moments accountant's
    epsilon of the training alone and with the projection, ``wall_s``) come every
    ``config.eval_every`` epochs and at the end. With ``store`` (a run-store folder) the run
    resumes from its last commit there. The statement is None when no step was taken (a
    deadline already past).
    """
    x_train, y_train, x_test, y_test = data
    per_epoch = steps_per_epoch(config, len(x_train))
    q = config.lot_size / len(x_train)
    state = RunState.open(store, private_spec(config, spec, len(x_train)), fingerprint or code())
    directions, state = released_projection(config, spec, x_train, state)
    device = torch.device(default_device())
    if device.type == "cuda":  # float32 products, not TF32: the clipping bound must hold exactly
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    inputs = project(x_train, directions).to(device)
    test_inputs = project(x_test, directions).to(device)
    y_train, y_test = y_train.to(device), y_test.to(device)
    with torch_seeded(spec.seed):
        model = make_model(config, inputs.shape[1])  # the same initial weights on every device
    model = model.to(device)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=config.lr_start,
        inputs=inputs,
        targets=y_train,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=spec.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(len(inputs), sampling_probability=q, seed=spec.seed),
        engine="fast",
        seed=spec.seed + 1,
    )
    scheduled = ScheduledTrainer(
        trainer,
        trainer.optimizer.optimizer,
        lambda done: learning_rate(config, done / per_epoch),
    )
    event_projection = projection_event(config, spec.pca_noise)

    def measure(_: Trainable) -> dict[str, Any]:
        training_event = trainer.ledger.event()
        total = with_projection(training_event, event_projection)
        return {
            "test_accuracy": accuracy(model, test_inputs, y_test),
            "train_accuracy": accuracy(model, inputs[:TRAIN_EVAL], y_train[:TRAIN_EVAL]),
            "epsilon_moments": epsilon_columns(training_event, config.delta, ("moments",))[
                "moments"
            ],
            "epsilon_moments_with_pca": epsilon_columns(total, config.delta, ("moments",))[
                "moments"
            ],
        }

    run_training(
        scheduled,
        state,
        steps=spec.steps,
        eval_every=eval_steps(config, spec.steps, per_epoch),
        per_epoch=per_epoch,
        measure=measure,
        row={"run": spec.name},
        deadline=deadline,
        label=spec.name,
    )
    if trainer.steps_done == 0:
        return state, None
    return state, _statement(config, spec, trainer, event_projection)


def train_baseline(
    config: MnistConfig,
    data: Data,
    *,
    store: Path | None = None,
    fingerprint: str | None = None,
    deadline: float | None = None,
) -> RunState:
    """Non-private: exact PCA on all training rows, plain SGD on shuffled lots; resumable.

    The harness's :class:`~reproductions.harness.NonPrivateTrainer` (a fresh permutation per
    epoch, batches of exactly ``lot_size``, the last partial batch dropped) with the private
    runs' learning-rate schedule; rows like :func:`train_private`'s, epsilons None.
    """
    x_train, y_train, x_test, y_test = data
    seed = config.seed + 99
    directions = dp_pca_directions(
        x_train,
        components=config.pca_components,
        noise_std=0.0,
        sample_rate=1.0,
        rng=np.random.default_rng(seed),
    )
    inputs, test_inputs = project(x_train, directions), project(x_test, directions)
    with torch_seeded(seed):
        model = make_model(config, inputs.shape[1])
    trainer = NonPrivateTrainer(
        model,
        inputs,
        y_train,
        optimizer=lambda params: torch.optim.SGD(params, lr=config.lr_start),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=config.lot_size,
        seed=seed,
    )
    per_epoch = trainer.steps_per_epoch
    # The epoch fraction as (epoch - 1) + step / per_epoch, as the baseline always computed it
    # (equal to done / per_epoch up to the last bit).
    scheduled = ScheduledTrainer(
        trainer,
        trainer.optimizer,
        lambda done: learning_rate(config, done // per_epoch + done % per_epoch / per_epoch),
    )
    state = RunState.open(store, baseline_spec(config, len(x_train)), fingerprint or code())
    steps = config.baseline_epochs * per_epoch
    run_training(
        scheduled,
        state,
        steps=steps,
        eval_every=eval_steps(config, steps, per_epoch),
        per_epoch=per_epoch,
        measure=lambda _: {
            "test_accuracy": accuracy(model, test_inputs, y_test),
            "train_accuracy": accuracy(model, inputs[:TRAIN_EVAL], y_train[:TRAIN_EVAL]),
            "epsilon_moments": None,
            "epsilon_moments_with_pca": None,
        },
        row={"run": "non-private"},
        deadline=deadline,
        label="non-private",
    )
    return state


def _statement(
    config: MnistConfig, spec: RunSpec, trainer: DPTrainer, event_projection: DpEvent | None
) -> dict[str, Any]:
    """dpcore's statement for the training steps plus the projection's cost and the total."""
    width = config.pca_components if config.projection != "none" else "784 pixels"
    statement = trainer.privacy_statement(
        delta=config.delta,
        accountants=("moments", "rdp", "pld"),
        model=f"{config.projection}-{width} -> {config.hidden_units} ReLU -> 10",
        run_name=spec.name,
    )
    training_event = trainer.ledger.event()
    if event_projection is not None:
        statement["dp_pca"] = {
            "event": event_projection.to_dict(),
            "noise_std": spec.pca_noise,
            "sample_rate": config.pca_sample_rate,
            "sensitivity": "1 (unit-norm rows; upper triangle of A^T A incl. diagonal)",
            "epsilon_alone": epsilon_columns(event_projection, config.delta),
        }
    statement["projection"] = config.projection
    statement["epsilon_training_only"] = epsilon_columns(training_event, config.delta)
    statement["epsilon_with_pca"] = epsilon_columns(
        with_projection(training_event, event_projection), config.delta
    )
    return statement
