"""Abadi et al. 2016, §5.3 / Fig. 6: DP-SGD on CIFAR-10 with the TensorFlow-tutorial network.

Paper (arXiv v2, §5.3 and the Fig. 6 caption): 32x32 images cropped to 24x24; two 5x5
convolutions (stride 1, 64 channels) each followed by ReLU and 2x2 max-pooling (12x12x64, then
6x6x64), two fully connected layers of 384 units and a softmax layer; training images are
augmented (random 24x24 crop, left-right flip, random brightness and contrast, redrawn every
epoch); sigma = 6, clipping 3, delta = 1e-5; lot 2,000 for epsilon = 2 and lot 4,000 for
epsilon = 4 and 8, reaching 67 %, 70 % and 73 % test accuracy. The epochs (about 56, 125 and
665) are read off Fig. 6, where each curve ends as delta reaches its limit.

Deviations (see the README): the paper's convolutions were pretrained on CIFAR-100 as public
data and frozen, with the dense layers initialised from that network; CIFAR-100 is not available
here either, so every layer is trained from a random initialisation under DP-SGD. The paper's
learning rate for CIFAR-10 is not stated; ``learning_rate`` is our assumption. The clipping is
one flat bound on the whole per-example gradient (the paper clipped per layer).

Data: :func:`dpcore.data.load_cifar10` on ``config.directory``, else ``$DPCORE_CIFAR10_DIR``,
else ``<data cache>/cifar-10-batches-py``. When the batches are missing :func:`compute` saves a
results file saying "not run: data unavailable" with the loader's message and no accuracy; the
accounting for the paper's settings (which needs no data) is saved either way.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.data import DataUnavailableError, cache_dir, load_cifar10
from dpcore.events import dpsgd_event
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions import common
from reproductions.abadi2016.checkpoints import load_state, save_state
from reproductions.abadi2016.cifar10_inputs import augment, evaluation_inputs
from reproductions.abadi2016.mnist_core import EpochHook, epsilons, progress_bar

STEM = "abadi2016_cifar10"
ENVIRONMENT = "DPCORE_CIFAR10_DIR"
NOT_RUN = "not run: data unavailable"
README = Path(__file__).with_name("README.md")
CHECKPOINTS = common.ROOT / "reproductions" / "checkpoints" / STEM
TABLE_START, TABLE_END = "<!-- cifar10-table:start -->", "<!-- cifar10-table:end -->"


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
    checkpoint_every: int = 0
    eval_batch: int = 1000
    seed: int = 0


PROFILES = {
    # Runs only if the data is present: the first setting for 2 epochs (a smoke-size run).
    "quick": CifarConfig(settings=(dataclasses.replace(PAPER_SETTINGS[0], epochs=2),)),
    "full": CifarConfig(profile="full", checkpoint_every=1),
}


def data_directory(config: CifarConfig) -> Path:
    """Where the ``cifar-10-batches-py`` files are looked for."""
    if config.directory is not None:
        return Path(config.directory)
    if os.environ.get(ENVIRONMENT):
        return Path(os.environ[ENVIRONMENT])
    return cache_dir() / "cifar-10-batches-py"


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


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            int((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum())
            for i in range(0, len(x), batch)
        )
    return correct / len(x)


def train_setting(
    config: CifarConfig,
    setting: CifarSetting,
    data: tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor],
    *,
    checkpoint: Path | None = None,
    on_epoch: EpochHook | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """DP-SGD for ``setting.epochs`` epochs; one row per epoch; resumable from ``checkpoint``.

    An epoch is round(N / L) lots (25 for lot 2,000 of 50,000; 12 for lot 4,000).
    """
    x_train, y_train, x_test, y_test = data
    n = len(x_train)
    per_epoch = max(1, round(n / setting.lot_size))
    total_steps = setting.epochs * per_epoch
    fingerprint = {
        "config": {
            k: v for k, v in dataclasses.asdict(config).items() if k not in ("profile", "settings")
        },
        "setting": {**dataclasses.asdict(setting), "epochs": None},
        "n": n,
    }
    state = load_state(checkpoint, fingerprint)
    if state is not None and state["done"] and state["steps"] == total_steps:
        return state["rows"], state["statement"]
    if state is not None and state["steps"] > total_steps:
        state = None
    fixed = evaluation_inputs(x_train, config.crop)
    test_inputs = evaluation_inputs(x_test, config.crop)
    torch.manual_seed(config.seed)
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
    rows: list[dict[str, Any]] = []
    elapsed = 0.0
    if state is not None and checkpoint is not None:
        trainer.load_checkpoint(checkpoint.with_suffix(".pt"))
        rows, elapsed = state["rows"], state["wall_s"]
    saving = checkpoint is not None and config.checkpoint_every > 0
    bar = progress_bar(setting.epochs, trainer.steps_done // per_epoch, setting.name)
    while trainer.steps_done < total_steps:
        start = time.perf_counter()
        epoch = trainer.steps_done // per_epoch + 1
        if config.augment:  # fresh distortions every epoch, reproducible from (seed, epoch)
            rng = np.random.default_rng([config.seed, epoch])
            trainer.inputs = augment(x_train, config.crop, rng)
        for _ in range(per_epoch):
            trainer.step()
        event = trainer.ledger.event()
        spent = epsilons(event, config.delta) if epoch == setting.epochs else None
        rows.append(
            {
                "setting": setting.name,
                "epoch": epoch,
                "steps": trainer.steps_done,
                "test_accuracy": _accuracy(model, test_inputs, y_test, config.eval_batch),
                "train_accuracy": _accuracy(
                    model, fixed[:10_000], y_train[:10_000], config.eval_batch
                ),
                "epsilon_moments": trainer.epsilon(delta=config.delta, accountant="moments"),
                "epsilon_rdp": trainer.epsilon(delta=config.delta, accountant="rdp"),
                "epsilon_pld_upper": None if spent is None else spent["pld_upper"],
                "wall_s": round(elapsed + time.perf_counter() - start, 2),
            }
        )
        elapsed += time.perf_counter() - start
        last = trainer.steps_done == total_steps
        if saving and checkpoint is not None and (epoch % config.checkpoint_every == 0 or last):
            current = {"fingerprint": fingerprint, "rows": rows, "wall_s": elapsed}
            current.update(done=False, steps=trainer.steps_done)
            save_state(checkpoint, current, trainer.save_checkpoint)
        bar.update(1)
        if on_epoch is not None:
            on_epoch(setting.name, epoch)
    bar.close()
    statement = trainer.privacy_statement(
        delta=config.delta,
        accountants=("moments", "rdp", "pld"),
        model="conv5x5x64-pool-conv5x5x64-pool-384-384-10, all layers trained",
        setting=setting.name,
    )
    if saving and checkpoint is not None:
        done = {"fingerprint": fingerprint, "rows": rows, "wall_s": elapsed, "done": True}
        save_state(checkpoint, {**done, "steps": total_steps, "statement": statement})
    return rows, statement


def reported_settings(config: CifarConfig) -> list[CifarSetting]:
    """Fig. 6's three settings, then any other setting the profile runs."""
    names = {setting.name for setting in PAPER_SETTINGS}
    return [*PAPER_SETTINGS, *(s for s in config.settings if s.name not in names)]


def paper_accounting(config: CifarConfig, dataset_size: int = 50_000) -> dict[str, Any]:
    """Epsilon of each reported setting at the paper's epochs (accounting only: needs no data)."""
    result = {}
    for setting in reported_settings(config):
        q = setting.lot_size / dataset_size
        steps = round(setting.paper_epochs * dataset_size / setting.lot_size)
        event = dpsgd_event(
            sampling_probability=q, noise_multiplier=config.noise_multiplier, steps=steps
        )
        result[setting.name] = epsilons(event, config.delta)
    return result


def compute(profile: str = "quick", *, config: CifarConfig | None = None) -> None:
    """Train the profile's settings if the data is there; otherwise save a "not run" record."""
    config = config or PROFILES[profile]
    start = time.perf_counter()
    directory = data_directory(config)
    extra: dict[str, Any] = {
        "seed": config.seed,
        "hardware": f"{torch.get_num_threads()} torch threads, CPU",
        "torch": torch.__version__,
        "directory": str(directory),
        "reported_settings": [dataclasses.asdict(item) for item in reported_settings(config)],
        "paper_accounting": paper_accounting(config),
    }
    try:
        x_train, y_train = load_cifar10(directory, "train")
        x_test, y_test = load_cifar10(directory, "test")
    except DataUnavailableError as error:
        print(f"{STEM}: {NOT_RUN} ({error})", flush=True)
        (common.FIGURES / f"{STEM}.csv").unlink(missing_ok=True)
        extra.update(status=NOT_RUN, error=str(error), summary={})
        extra["wall_time_s"] = round(time.perf_counter() - start, 1)
        common.save_results(STEM, config=config, rows=[], extra=extra)
        return
    data = (x_train, torch.as_tensor(y_train), x_test, torch.as_tensor(y_test))
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    common.FIGURES.mkdir(parents=True, exist_ok=True)
    for setting in config.settings:
        checkpoint = None
        if config.checkpoint_every > 0:
            checkpoint = CHECKPOINTS / config.profile / setting.name
        setting_rows, statement = train_setting(config, setting, data, checkpoint=checkpoint)
        rows += setting_rows
        path = common.FIGURES / f"{STEM}_{setting.name}_privacy.json"
        path.write_text(json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n")
        summary[setting.name] = {
            "epochs_run": setting.epochs,
            "test_accuracy": setting_rows[-1]["test_accuracy"],
            "epsilon": epsilons(
                dpsgd_event(
                    sampling_probability=setting.lot_size / len(x_train),
                    noise_multiplier=config.noise_multiplier,
                    steps=setting_rows[-1]["steps"],
                ),
                config.delta,
            ),
            "privacy_statement": path.name,
        }
    extra.update(status="run", n_train=len(x_train), n_test=len(x_test), summary=summary)
    extra["wall_time_s"] = round(time.perf_counter() - start, 1)
    common.save_results(STEM, config=config, rows=rows, extra=extra)


def _fmt(value: float | None) -> str:
    return "inf" if value is None else f"{value:.2f}"


def readme_table(data: dict[str, Any]) -> str:
    """The CIFAR-10 "paper vs ours" table from the saved results (a "not run" row per setting).

    One row per Fig. 6 setting; the accounting columns need no data and are always filled.
    """
    config, summary, ran = data["config"], data["summary"], data["status"] == "run"
    head = (
        f"Profile **{config['profile']}**, seed {data['seed']}, commit `{data['commit'][:12]}`, "
        f"wall time {data['wall_time_s']:.0f} s ({data['hardware']}); sigma = "
        f"{config['noise_multiplier']:g}, C = {config['max_grad_norm']:g}, delta = "
        f"{config['delta']:g}."
    )
    if not ran:
        head += f" **{NOT_RUN}**: {data['error'].replace(str(common.ROOT) + os.sep, '')}"
    lines = [
        head,
        "",
        "| setting (lot) | epochs run (paper's, Fig. 6) | test acc. ours | paper "
        "| eps run: moments / RDP / PLD upper | eps at paper's epochs: moments / PLD upper "
        "| paper eps |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in data["reported_settings"]:
        paper = data["paper_accounting"][setting["name"]]
        run, accuracy, spent = (NOT_RUN if not ran else "not in this profile"), "-", "-"
        if setting["name"] in summary:
            item = summary[setting["name"]]
            eps = item["epsilon"]
            run, accuracy = str(item["epochs_run"]), f"{item['test_accuracy']:.3f}"
            spent = f"{_fmt(eps['moments'])} / {_fmt(eps['rdp'])} / {_fmt(eps['pld_upper'])}"
        lines.append(
            f"| {setting['name']} ({setting['lot_size']}) | {run} (≈{setting['paper_epochs']}) "
            f"| {accuracy} | {setting['paper_accuracy']:.2f} | {spent} "
            f"| {_fmt(paper['moments'])} / {_fmt(paper['pld_upper'])} "
            f"| {setting['paper_epsilon']:g} |"
        )
    return "\n".join(lines)


def plot() -> None:
    """figures/abadi2016_cifar10.png (accuracy vs epoch) if it ran; the README table always."""
    data = common.load_results(STEM)
    figure_path = common.FIGURES / f"{STEM}.png"
    if data["status"] == "run":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        settings = data["config"]["settings"]
        figure, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6))
        for axis, setting in zip(np.atleast_1d(axes), settings, strict=True):
            mine = [row for row in data["rows"] if row["setting"] == setting["name"]]
            epochs = [row["epoch"] for row in mine]
            axis.plot(epochs, [row["test_accuracy"] for row in mine], "-o", ms=3, label="test")
            axis.plot(epochs, [row["train_accuracy"] for row in mine], "--", label="train")
            axis.axhline(setting["paper_accuracy"], color="tab:red", ls=":", label="paper")
            axis.set_title(f"{setting['name']} (lot {setting['lot_size']})", fontsize=9)
            axis.set_xlabel("epoch")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        figure.suptitle(f"Abadi et al. 2016 CIFAR-10 ({data['config']['profile']} profile)")
        figure.tight_layout()
        figure.savefig(figure_path, dpi=150)
        plt.close(figure)
    else:
        figure_path.unlink(missing_ok=True)  # never leave a figure of an earlier run beside it
    common.write_between_markers(README, TABLE_START, TABLE_END, readme_table(data))
