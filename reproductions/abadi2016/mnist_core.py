"""The MNIST model, data, projection and resumable DP-SGD run of Abadi et al. 2016, §5.2.

Shared by the noise-level experiment (:mod:`reproductions.abadi2016.mnist`, Fig. 3) and the
parameter sweeps (:mod:`reproductions.abadi2016.sweeps`, Fig. 5). Paper values (arXiv v2, §5.2):
a 60-dimensional DP-PCA projection, one hidden layer of 1,000 ReLU units, softmax over 10
classes, lot size 600 of 60,000, clipping at 4, learning rate 0.1 decaying linearly to 0.052 over
10 epochs and then constant; delta = 1e-5.

:func:`train_private` runs DP-SGD for a given number of steps, evaluating after every epoch, and
with a checkpoint path saves the projection, the trainer state and the rows so far every few
epochs; a restart resumes from there (and returns a finished run's results without training).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.accountants import MomentsAccountant, RdpAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.data.datasets import load_mnist
from dpcore.errors import InvalidParameterError
from dpcore.events import ComposedEvent, DpEvent, dpsgd_event
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.abadi2016.checkpoints import load_state, save_state
from reproductions.abadi2016.pca import dp_pca_directions, pca_event, random_directions
from reproductions.common import finite_or_none

PROJECTIONS = ("dp_pca", "random", "none")
#: Training inputs, training labels, test inputs, test labels (flattened pixels in [0, 1]).
Data = tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]
#: Called after every epoch (and its checkpoint) with the run's name and the epoch number.
EpochHook = Callable[[str, int], None]


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
    #: Evaluate every this many epochs (0: only at the end); the last epoch is always evaluated.
    eval_every: int = 1
    #: Save a checkpoint every this many epochs (0: no checkpoints, as in the quick profile).
    checkpoint_every: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.projection not in PROJECTIONS:
            raise InvalidParameterError("projection", f"in {PROJECTIONS}", self.projection)
        if self.lot_size < 1:
            raise InvalidParameterError("lot_size", ">= 1", self.lot_size)


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


def epsilons(event: DpEvent, delta: float) -> dict[str, float | None]:
    """Moments accountant (as in the paper), RDP and the tight PLD interval at ``delta``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # order-grid notes do not change the bound
        interval = PldAccountant().compose(event).get_epsilon_interval(delta)
        return {
            "moments": finite_or_none(MomentsAccountant().compose(event).get_epsilon(delta)),
            "rdp": finite_or_none(RdpAccountant().compose(event).get_epsilon(delta)),
            "pld_lower": finite_or_none(interval.lower),
            "pld_upper": finite_or_none(interval.upper),
        }


def moments_epsilon(event: DpEvent, delta: float) -> float:
    """The moments accountant's epsilon (orders up to 32, as in the paper)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(MomentsAccountant().compose(event).get_epsilon(delta))


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
        return moments_epsilon(with_projection(training, extra), delta)

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
    """Fraction of ``x`` classified as ``y`` (evaluation mode, no gradients)."""
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def project(x: np.ndarray, directions: np.ndarray | None) -> torch.Tensor:
    """``x`` projected onto ``directions`` (or unchanged), as a float32 tensor."""
    return torch.as_tensor(x if directions is None else x @ directions, dtype=torch.float32)


def run_fingerprint(config: MnistConfig, spec: RunSpec) -> dict[str, Any]:
    """What a run's checkpoint must agree on (not its length, so a run can be extended)."""
    ignored = {"profile", "epochs", "paper_epochs", "baseline_epochs", "eval_every"}
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored}
    return {"config": fields, "run": {**dataclasses.asdict(spec), "steps": None}}


def progress_bar(total: int, initial: int, name: str) -> Any:
    """A tqdm bar over epochs (shown only on a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="epoch", leave=False, disable=None)


def train_private(
    config: MnistConfig,
    spec: RunSpec,
    data: Data,
    *,
    checkpoint: Path | None = None,
    on_epoch: EpochHook | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Projection + DP-SGD for ``spec.steps`` steps; returns per-epoch rows and a statement.

    With ``checkpoint`` (a path without suffix) the run saves ``.json`` (rows, state),
    ``.pt`` (trainer) and ``_projection.npy`` (the released projection, drawn once: a restart
    must not release a second noisy PCA) every ``config.checkpoint_every`` epochs and at the end.
    """
    x_train, y_train, x_test, y_test = data
    per_epoch = steps_per_epoch(config, len(x_train))
    q = config.lot_size / len(x_train)
    fingerprint = run_fingerprint(config, spec)
    state = load_state(checkpoint, fingerprint)
    if state is not None and state["done"] and state["steps"] == spec.steps:
        return state["rows"], state["statement"]
    if state is not None and state["steps"] > spec.steps:
        state = None  # a longer run than asked for: start afresh
    projection_file = None if checkpoint is None else Path(f"{checkpoint}_projection.npy")
    directions = None
    if state is not None and config.projection != "none":
        if projection_file is None or not projection_file.is_file():
            state = None
        else:
            directions = np.load(projection_file)
    if state is None:
        directions = make_projection(
            config, x_train, spec.pca_noise, np.random.default_rng(spec.seed)
        )
    inputs, test_inputs = project(x_train, directions), project(x_test, directions)
    torch.manual_seed(spec.seed)
    model = make_model(config, inputs.shape[1])
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
    rows: list[dict[str, Any]] = []
    elapsed = 0.0
    saving = checkpoint is not None and config.checkpoint_every > 0

    def save(finished: bool, **extra: Any) -> None:
        if checkpoint is None:
            return
        current = {"fingerprint": fingerprint, "rows": rows, "wall_s": elapsed, "done": finished}
        save_state(checkpoint, {**current, **extra}, None if finished else trainer.save_checkpoint)

    if state is not None and checkpoint is not None:
        trainer.load_checkpoint(checkpoint.with_suffix(".pt"))
        rows, elapsed = state["rows"], state["wall_s"]
    elif saving:
        # The projection is released once: saved before training, reused on every restart.
        if projection_file is not None and directions is not None:
            projection_file.parent.mkdir(parents=True, exist_ok=True)
            np.save(projection_file, directions)
        save(False, steps=0)
    event_projection = projection_event(config, spec.pca_noise)
    epochs_total = math.ceil(spec.steps / per_epoch)
    bar = progress_bar(epochs_total, math.ceil(trainer.steps_done / per_epoch), f"{spec.name}")
    while trainer.steps_done < spec.steps:
        start = time.perf_counter()
        take = min(per_epoch - trainer.steps_done % per_epoch, spec.steps - trainer.steps_done)
        for _ in range(take):
            rate = learning_rate(config, trainer.steps_done / per_epoch)
            for group in trainer.optimizer.optimizer.param_groups:
                group["lr"] = rate
            trainer.step()
        epoch = math.ceil(trainer.steps_done / per_epoch)
        finished = trainer.steps_done == spec.steps
        if (config.eval_every > 0 and epoch % config.eval_every == 0) or finished:
            training_event = trainer.ledger.event()
            rows.append(
                {
                    "run": spec.name,
                    "epoch": round(trainer.steps_done / per_epoch, 3),
                    "steps": trainer.steps_done,
                    "test_accuracy": accuracy(model, test_inputs, y_test),
                    "train_accuracy": accuracy(model, inputs[:10_000], y_train[:10_000]),
                    "epsilon_moments": moments_epsilon(training_event, config.delta),
                    "epsilon_moments_with_pca": moments_epsilon(
                        with_projection(training_event, event_projection), config.delta
                    ),
                    "wall_s": round(elapsed + time.perf_counter() - start, 2),
                }
            )
        elapsed += time.perf_counter() - start
        if saving and (epoch % config.checkpoint_every == 0 or finished):
            save(False, steps=trainer.steps_done)
        bar.update(1)
        if on_epoch is not None:
            on_epoch(spec.name, epoch)
    bar.close()
    statement = _statement(config, spec, trainer, event_projection)
    if saving:
        save(True, steps=spec.steps, statement=statement)
    return rows, statement


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
            "epsilon_alone": epsilons(event_projection, config.delta),
        }
    statement["projection"] = config.projection
    statement["epsilon_training_only"] = epsilons(training_event, config.delta)
    statement["epsilon_with_pca"] = epsilons(
        with_projection(training_event, event_projection), config.delta
    )
    return statement
