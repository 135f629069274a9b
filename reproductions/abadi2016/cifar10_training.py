"""The CIFAR-10 settings, network and resumable DP-SGD run of Abadi et al. 2016, §5.3.

:func:`train_setting` trains one Fig. 6 setting on the reproduction harness
(:func:`reproductions.harness.run_training`): DP-SGD (engine ``"fast"``, Poisson lots) wrapped in
:class:`AugmentedTrainer`, which redraws the distorted training images at the start of every
epoch (:func:`~reproductions.abadi2016.cifar10_inputs.augment`, reproducible from the seed and
the epoch, so a resumed run sees the same images). One row per epoch; with a run store the run
resumes from its last epoch and a finished one is read back. The report and the orchestration
are in :mod:`reproductions.abadi2016.cifar10`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.accountants.report import epsilon_report
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.abadi2016.cifar10_inputs import augment, evaluation_inputs
from reproductions.common import code_fingerprint
from reproductions.harness import RunState, Trainable, evaluate, run_training, torch_seeded

#: The code a run's result depends on: a change here starts its runs afresh.
CODE_MODULES = (
    "dpcore.torch",
    "dpcore.accountants",
    "dpcore.events",
    "dpcore.pld",
    "reproductions.harness",
    "reproductions.abadi2016.cifar10_inputs",
    "reproductions.abadi2016.cifar10_training",
)
#: Training accuracy is measured on this many of the first (centre-cropped) training images.
TRAIN_EVAL = 10_000
#: CIFAR-10 arrays: training images (n, 3, 32, 32) uint8, labels, test images, test labels.
CifarData = tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class CifarSetting:
    """One panel of Fig. 6: lot size, epochs run, and the paper's epochs, epsilon and accuracy."""

    name: str
    lot_size: int
    epochs: int
    paper_epochs: int
    paper_epsilon: float
    paper_accuracy: float


#: Fig. 6 caption: "(1) uses a lot size of 2,000, (2) and (3) use a lot size of 4,000"; 67 %,
#: 70 %, 73 % at epsilon 2, 4, 8. Epochs read off the panels' x axes (approximate).
PAPER_SETTINGS = (
    CifarSetting("eps2_lot2000", 2000, 56, 56, 2.0, 0.67),
    CifarSetting("eps4_lot4000", 4000, 125, 125, 4.0, 0.70),
    CifarSetting("eps8_lot4000", 4000, 665, 665, 8.0, 0.73),
)


@dataclasses.dataclass(frozen=True)
class CifarConfig:
    """One profile. ``directory`` None: ``$DPCORE_CIFAR10_DIR`` or the data cache's copy."""

    profile: str = "quick"
    directory: str | None = None
    settings: tuple[CifarSetting, ...] = PAPER_SETTINGS
    noise_multiplier: float = 6.0
    max_grad_norm: float = 3.0
    conv_channels: int = 64
    fc_units: int = 384
    crop: int = 24
    #: Not given in the paper (assumption): plain SGD at the tutorial's initial rate 0.1.
    learning_rate: float = 0.1
    augment: bool = True
    delta: float = 1e-5
    #: Non-private references of §5.3: about 86 % in 500 epochs for the whole network, about 80 %
    #: retraining only the dense layers on CIFAR-100-pretrained convolutions.
    paper_nonprivate_accuracy: float = 0.86
    paper_baseline_accuracy: float = 0.80
    #: Keep the runs in the run store (a commit every epoch, resumable), as the full profile does.
    checkpoint: bool = False
    eval_batch: int = 1000
    seed: int = 0


def make_model(config: CifarConfig) -> nn.Sequential:
    """conv5x5-ReLU-maxpool2 twice, two dense ReLU layers, softmax layer (logits), §5.3."""
    channels, units = config.conv_channels, config.fc_units
    side = config.crop // 4
    return nn.Sequential(
        nn.Conv2d(3, channels, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, channels, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(channels * side * side, units),
        nn.ReLU(),
        nn.Linear(units, units),
        nn.ReLU(),
        nn.Linear(units, 10),
    )


class AugmentedTrainer:
    """A :class:`~reproductions.harness.Trainable`: DP-SGD on images distorted afresh each epoch.

    Before the first step of epoch ``e`` (counted from 1) the wrapped trainer's inputs become
    ``augment(images, crop, default_rng([seed, e]))``; checkpoints are the wrapped trainer's (the
    distortions are a function of the epoch, so a resumed run redraws the same ones).
    """

    def __init__(
        self, trainer: DPTrainer, images: np.ndarray, *, crop: int, seed: int, per_epoch: int
    ) -> None:
        self.trainer = trainer
        self.model = trainer.model
        self.images, self.crop, self.seed, self.per_epoch = images, crop, seed, per_epoch
        self.epoch = 0  # the epoch whose distortions the trainer holds (0: none yet)

    @property
    def steps_done(self) -> int:
        return self.trainer.steps_done

    def step(self) -> object:
        """Redraw the inputs if a new epoch starts, then take one DP-SGD step."""
        epoch = self.trainer.steps_done // self.per_epoch + 1
        if epoch != self.epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self.trainer.inputs = augment(self.images, self.crop, rng)
            self.epoch = epoch
        return self.trainer.step()

    def save_checkpoint(self, path: str | Path) -> None:
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path: str | Path) -> None:
        self.trainer.load_checkpoint(path)


def steps_per_epoch(setting: CifarSetting, dataset_size: int) -> int:
    """round(N / L) lots (25 for lot 2,000 of 50,000; 12 for lot 4,000)."""
    return max(1, round(dataset_size / setting.lot_size))


def run_spec(config: CifarConfig, setting: CifarSetting, dataset_size: int) -> dict[str, Any]:
    """What a setting's run depends on: its folder in the run store is keyed by this."""
    ignored = {
        "profile",
        "directory",
        "settings",
        "checkpoint",
        "paper_nonprivate_accuracy",
        "paper_baseline_accuracy",
    }
    return {
        "figure": "abadi2016 cifar10",
        "config": {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored},
        "setting": {"name": setting.name, "lot_size": setting.lot_size, "epochs": setting.epochs},
        "dataset_size": dataset_size,
    }


def code() -> str:
    """The fingerprint of :data:`CODE_MODULES`."""
    return code_fingerprint(*CODE_MODULES)


def train_setting(
    config: CifarConfig,
    setting: CifarSetting,
    data: CifarData,
    *,
    store: Path | None = None,
    fingerprint: str | None = None,
    deadline: float | None = None,
) -> tuple[RunState, dict[str, Any] | None]:
    """DP-SGD for ``setting.epochs`` epochs; one row per epoch; resumable from ``store``.

    Rows: ``setting``, ``step``, ``epoch``, test and train accuracy, the moments and RDP epsilon
    so far and, at the last epoch, the PLD upper bound. Returns the run's state and dpcore's
    privacy statement (None when no step was taken, e.g. a deadline already past).
    """
    x_train, y_train, x_test, y_test = data
    n = len(x_train)
    per_epoch = steps_per_epoch(setting, n)
    total_steps = setting.epochs * per_epoch
    state = RunState.open(store, run_spec(config, setting, n), fingerprint or code())
    fixed = evaluation_inputs(x_train, config.crop)
    test_inputs = evaluation_inputs(x_test, config.crop)
    with torch_seeded(config.seed):
        model = make_model(config)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=config.learning_rate,
        inputs=fixed,
        targets=y_train,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=config.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(n, sampling_probability=setting.lot_size / n, seed=config.seed),
        engine="fast",
        seed=config.seed + 1,
    )
    driven: Trainable = trainer
    if config.augment:
        driven = AugmentedTrainer(
            trainer, x_train, crop=config.crop, seed=config.seed, per_epoch=per_epoch
        )

    def measure(_: Trainable) -> dict[str, Any]:
        last = trainer.steps_done == total_steps
        accountants = ("moments", "rdp", "pld") if last else ("moments", "rdp")
        spent = epsilon_report(trainer.ledger.event(), config.delta, accountants)
        return {
            "test_accuracy": evaluate(model, test_inputs, y_test, batch=config.eval_batch),
            "train_accuracy": evaluate(
                model, fixed[:TRAIN_EVAL], y_train[:TRAIN_EVAL], batch=config.eval_batch
            ),
            "epsilon_moments": spent["epsilon_moments"],
            "epsilon_rdp": spent["epsilon_rdp"],
            "epsilon_pld_upper": spent.get("epsilon_pld_upper"),
        }

    run_training(
        driven,
        state,
        steps=total_steps,
        eval_every=per_epoch,
        per_epoch=per_epoch,
        measure=measure,
        row={"setting": setting.name},
        deadline=deadline,
        label=setting.name,
    )
    if trainer.steps_done == 0:
        return state, None
    statement = trainer.privacy_statement(
        delta=config.delta,
        accountants=("moments", "rdp", "pld"),
        model="conv5x5x64-pool-conv5x5x64-pool-384-384-10, all layers trained",
        setting=setting.name,
    )
    return state, statement
