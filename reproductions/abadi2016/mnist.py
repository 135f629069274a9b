"""Abadi et al. 2016, §5.2 / Fig. 3: DP-SGD on MNIST at three noise levels, paper vs ours.

Model (paper §5.2): DP-PCA projection to 60 dimensions, one hidden layer of 1,000 ReLU units,
softmax output; lot size L = 600 of N = 60,000 (q = 0.01, Poisson lots here), clipping C = 4,
learning rate 0.1 decaying linearly to 0.052 over 10 epochs then constant. Noise levels
(sigma for training, sigma_p for the PCA): large (8, 16), medium (4, 7), small (2, 4); delta =
1e-5. A non-private baseline (exact PCA, plain SGD) is trained too.

The DP-PCA (:mod:`reproductions.abadi2016.pca`) is a Poisson-sampled Gaussian event composed once
with the training steps; every epsilon is reported for training alone (what the paper's
accountant example counts) and with the PCA added. :func:`compute` saves the results
(``figures/abadi2016_mnist.{json,csv}``) and one privacy statement per noise level
(``figures/abadi2016_mnist_<level>_privacy.json``); :func:`plot` draws accuracy vs epoch from the
saved JSON only.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.accountants import MomentsAccountant, RdpAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.data.datasets import load_mnist
from dpcore.events import ComposedEvent, DpEvent, dpsgd_event
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.abadi2016.pca import dp_pca_directions, pca_event
from reproductions.common import FIGURES, finite_or_none, load_results, save_results

STEM = "abadi2016_mnist"
README = Path(__file__).with_name("README.md")
TABLE_START, TABLE_END = "<!-- mnist-table:start -->", "<!-- mnist-table:end -->"
LEVELS = ("large", "medium", "small")


@dataclasses.dataclass(frozen=True)
class MnistConfig:
    """One profile. Tuples are indexed like :data:`LEVELS` (large, medium, small noise)."""

    profile: str = "quick"
    noise_multipliers: tuple[float, ...] = (8.0, 4.0, 2.0)
    pca_noise: tuple[float, ...] = (16.0, 7.0, 4.0)
    #: Epochs actually run per level (quick: far fewer than the paper; labelled in the table).
    epochs: tuple[int, ...] = (12, 12, 12)
    #: Epochs the paper's epsilons imply (backed out with the moments accountant for the
    #: training steps alone, q = 0.01, delta = 1e-5): eps(50) = 0.49, eps(245) = 2.0,
    #: eps(720) = 8.0. The full profile runs these.
    paper_epochs: tuple[int, ...] = (50, 245, 720)
    paper_epsilon: tuple[float, ...] = (0.5, 2.0, 8.0)
    paper_accuracy: tuple[float, ...] = (0.90, 0.95, 0.97)
    paper_baseline_accuracy: float = 0.983
    baseline_epochs: int = 20
    dataset_size: int = 60_000
    lot_size: int = 600
    max_grad_norm: float = 4.0
    hidden_units: int = 1000
    pca_components: int = 60
    #: Poisson rate of the PCA's random sample; the paper does not give its size (assumption).
    pca_sample_rate: float = 0.1
    lr_start: float = 0.1
    lr_end: float = 0.052
    lr_decay_epochs: int = 10
    delta: float = 1e-5
    eval_every: int = 1
    seed: int = 0


PROFILES = {
    "quick": MnistConfig(),
    "full": MnistConfig(profile="full", epochs=(50, 245, 720), baseline_epochs=100, eval_every=5),
}


def learning_rate(config: MnistConfig, epoch_fraction: float) -> float:
    """Linear decay from lr_start to lr_end over lr_decay_epochs, then constant (§5.2)."""
    t = min(epoch_fraction / config.lr_decay_epochs, 1.0)
    return config.lr_start + (config.lr_end - config.lr_start) * t


def make_model(config: MnistConfig) -> nn.Module:
    """60 -> 1,000 ReLU -> 10 (softmax is in the loss)."""
    return nn.Sequential(
        nn.Linear(config.pca_components, config.hidden_units),
        nn.ReLU(),
        nn.Linear(config.hidden_units, 10),
    )


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


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


def _data(config: MnistConfig) -> tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]:
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


def _project(x: np.ndarray, directions: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x @ directions, dtype=torch.float32)


def _run_private(
    config: MnistConfig, level: int, data: tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """DP-PCA + DP-SGD at one noise level; returns per-epoch rows and the privacy statement."""
    x_train, y_train, x_test, y_test = data
    name, sigma, sigma_p = LEVELS[level], config.noise_multipliers[level], config.pca_noise[level]
    seed = config.seed + 1000 * level
    directions = dp_pca_directions(
        x_train,
        components=config.pca_components,
        noise_std=sigma_p,
        sample_rate=config.pca_sample_rate,
        rng=np.random.default_rng(seed),
    )
    inputs, test_inputs = _project(x_train, directions), _project(x_test, directions)
    torch.manual_seed(seed)
    model = make_model(config)
    q = config.lot_size / config.dataset_size
    trainer = DPTrainer.dp_sgd(
        model,
        lr=config.lr_start,
        inputs=inputs,
        targets=y_train,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=sigma,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(len(inputs), sampling_probability=q, seed=seed),
        engine="fast",
        seed=seed + 1,
    )
    steps_per_epoch = round(1 / q)
    event_pca = pca_event(noise_std=sigma_p, sample_rate=config.pca_sample_rate)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for epoch in range(1, config.epochs[level] + 1):
        for step in range(steps_per_epoch):
            lr = learning_rate(config, epoch - 1 + step / steps_per_epoch)
            for group in trainer.optimizer.optimizer.param_groups:
                group["lr"] = lr
            trainer.step()
        if epoch % config.eval_every and epoch != config.epochs[level]:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            moments = MomentsAccountant().compose(trainer.ledger.event())
            moments_total = MomentsAccountant().compose(
                ComposedEvent([event_pca, trainer.ledger.event()])
            )
            rows.append(
                {
                    "level": name,
                    "epoch": epoch,
                    "steps": trainer.steps_done,
                    "test_accuracy": _accuracy(model, test_inputs, y_test),
                    "train_accuracy": _accuracy(model, inputs[:10_000], y_train[:10_000]),
                    "epsilon_moments": moments.get_epsilon(config.delta),
                    "epsilon_moments_with_pca": moments_total.get_epsilon(config.delta),
                    "wall_s": round(time.perf_counter() - start, 2),
                }
            )
    training_event = trainer.ledger.event()
    paper_training = dpsgd_event(
        sampling_probability=q, noise_multiplier=sigma, steps=config.paper_epochs[level] * 100
    )
    statement = trainer.privacy_statement(
        delta=config.delta,
        accountants=("moments", "rdp", "pld"),
        model="PCA-60 -> 1000 ReLU -> 10",
        level=name,
    )
    statement["dp_pca"] = {
        "event": event_pca.to_dict(),
        "noise_std": sigma_p,
        "sample_rate": config.pca_sample_rate,
        "sensitivity": "1 (unit-norm rows; upper triangle of A^T A incl. diagonal)",
        "epsilon_alone": epsilons(event_pca, config.delta),
    }
    statement["epsilon_training_only"] = epsilons(training_event, config.delta)
    statement["epsilon_with_pca"] = epsilons(
        ComposedEvent([event_pca, training_event]), config.delta
    )
    statement["epsilon_paper_epochs_training_only"] = epsilons(paper_training, config.delta)
    statement["epsilon_paper_epochs_with_pca"] = epsilons(
        ComposedEvent([event_pca, paper_training]), config.delta
    )
    return rows, statement


def _run_baseline(
    config: MnistConfig, data: tuple[np.ndarray, torch.Tensor, np.ndarray, torch.Tensor]
) -> list[dict[str, Any]]:
    """Non-private: exact PCA on all training rows, plain SGD on shuffled lots of 600."""
    x_train, y_train, x_test, y_test = data
    rng = np.random.default_rng(config.seed + 99)
    directions = dp_pca_directions(
        x_train, components=config.pca_components, noise_std=0.0, sample_rate=1.0, rng=rng
    )
    inputs, test_inputs = _project(x_train, directions), _project(x_test, directions)
    torch.manual_seed(config.seed + 99)
    model = make_model(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr_start)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(config.seed + 99)
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    steps_per_epoch = len(inputs) // config.lot_size
    for epoch in range(1, config.baseline_epochs + 1):
        model.train()
        order = torch.randperm(len(inputs), generator=generator)
        for step in range(steps_per_epoch):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, epoch - 1 + step / steps_per_epoch)
            batch = order[step * config.lot_size : (step + 1) * config.lot_size]
            optimizer.zero_grad()
            loss_fn(model(inputs[batch]), y_train[batch]).backward()
            optimizer.step()
        if epoch % config.eval_every and epoch != config.baseline_epochs:
            continue
        rows.append(
            {
                "level": "non-private",
                "epoch": epoch,
                "steps": epoch * steps_per_epoch,
                "test_accuracy": _accuracy(model, test_inputs, y_test),
                "train_accuracy": _accuracy(model, inputs[:10_000], y_train[:10_000]),
                "epsilon_moments": None,
                "epsilon_moments_with_pca": None,
                "wall_s": round(time.perf_counter() - start, 2),
            }
        )
    return rows


def compute(profile: str = "quick") -> None:
    """Train every noise level and the baseline; save results and privacy statements."""
    config = PROFILES[profile]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    data = _data(config)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    FIGURES.mkdir(parents=True, exist_ok=True)
    for level, name in enumerate(LEVELS):
        level_rows, statement = _run_private(config, level, data)
        rows += level_rows
        path = FIGURES / f"{STEM}_{name}_privacy.json"
        path.write_text(json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n")
        summary[name] = {
            "epochs_run": config.epochs[level],
            "test_accuracy": level_rows[-1]["test_accuracy"],
            "paper_accuracy": config.paper_accuracy[level],
            "paper_epsilon": config.paper_epsilon[level],
            "paper_epochs": config.paper_epochs[level],
            "epsilon_training_only": statement["epsilon_training_only"],
            "epsilon_with_pca": statement["epsilon_with_pca"],
            "epsilon_pca_alone": statement["dp_pca"]["epsilon_alone"],
            "epsilon_paper_epochs_training_only": statement["epsilon_paper_epochs_training_only"],
            "epsilon_paper_epochs_with_pca": statement["epsilon_paper_epochs_with_pca"],
            "privacy_statement": path.name,
        }
        print(f"abadi2016_mnist {name}: {summary[name]['test_accuracy']:.4f}", flush=True)
    baseline_rows = _run_baseline(config, data)
    rows += baseline_rows
    summary["non-private"] = {
        "epochs_run": config.baseline_epochs,
        "test_accuracy": baseline_rows[-1]["test_accuracy"],
        "paper_accuracy": config.paper_baseline_accuracy,
    }
    extra = {
        "seed": config.seed,
        "hardware": f"{torch.get_num_threads()} torch threads, CPU",
        "torch": torch.__version__,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "summary": summary,
        "cifar10": "not run: data unavailable",
    }
    save_results(STEM, config=config, rows=rows, extra=extra)


def plot() -> None:
    """figures/abadi2016_mnist_accuracy.png: test (and train) accuracy vs epoch per level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_results(STEM)
    rows, config, summary = data["rows"], data["config"], data["summary"]
    baseline = summary["non-private"]["test_accuracy"]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for index, (axis, name) in enumerate(zip(axes, LEVELS, strict=True)):
        mine = [row for row in rows if row["level"] == name]
        epochs = [row["epoch"] for row in mine]
        axis.plot(epochs, [row["test_accuracy"] for row in mine], "-o", ms=3, label="test")
        axis.plot(epochs, [row["train_accuracy"] for row in mine], "--", label="train")
        axis.axhline(config["paper_accuracy"][index], color="tab:red", ls=":", label="paper")
        axis.axhline(baseline, color="grey", ls="-.", lw=0.8, label="ours, non-private")
        eps = summary[name]["epsilon_with_pca"]["moments"]
        axis.set_title(
            f"{name}: sigma={config['noise_multipliers'][index]:g}, "
            f"sigma_p={config['pca_noise'][index]:g}\n"
            f"eps={eps:.2f} (moments, incl. PCA), paper eps={config['paper_epsilon'][index]:g}",
            fontsize=9,
        )
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].set_ylim(0.6, 1.0)
    axes[0].legend(fontsize=7, loc="lower right")
    figure.suptitle(f"Abadi et al. 2016 MNIST ({config['profile']} profile, delta = 1e-5)")
    figure.tight_layout()
    figure.savefig(FIGURES / f"{STEM}_accuracy.png", dpi=150)
    plt.close(figure)
    write_readme_table(data)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "inf" if value is None else f"{value:.{digits}f}"


def readme_table(data: dict[str, Any]) -> str:
    """The "paper vs ours" markdown table, from the saved results only."""
    config, summary = data["config"], data["summary"]
    lines = [
        f"Profile **{config['profile']}**, seed {data['seed']}, commit `{data['commit'][:12]}`, "
        f"wall time {data['wall_time_s']:.0f} s ({data['hardware']}), delta = {config['delta']:g}.",
        "",
        "| noise (sigma, sigma_p) | epochs run (paper's) | test acc. ours | paper | "
        "eps run: moments train / +PCA | eps run +PCA: RDP / PLD | "
        "eps at paper's epochs: moments train / +PCA | PLD +PCA | paper eps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for index, name in enumerate(LEVELS):
        item = summary[name]
        run, total = item["epsilon_training_only"], item["epsilon_with_pca"]
        paper_run, paper_total = (
            item["epsilon_paper_epochs_training_only"],
            item["epsilon_paper_epochs_with_pca"],
        )
        lines.append(
            f"| {name} ({config['noise_multipliers'][index]:g}, {config['pca_noise'][index]:g}) "
            f"| {item['epochs_run']} ({item['paper_epochs']}) "
            f"| {item['test_accuracy']:.3f} | {item['paper_accuracy']:.2f} "
            f"| {_fmt(run['moments'])} / {_fmt(total['moments'])} "
            f"| {_fmt(total['rdp'])} / [{_fmt(total['pld_lower'])}, {_fmt(total['pld_upper'])}] "
            f"| {_fmt(paper_run['moments'])} / {_fmt(paper_total['moments'])} "
            f"| [{_fmt(paper_total['pld_lower'])}, {_fmt(paper_total['pld_upper'])}] "
            f"| {item['paper_epsilon']:g} |"
        )
    base = summary["non-private"]
    lines.append(
        f"| non-private (exact PCA) | {base['epochs_run']} (-) | {base['test_accuracy']:.3f} "
        f"| {base['paper_accuracy']:.3f} | - | - | - | - | - |"
    )
    lines.append(f"| CIFAR-10 (all settings) | {data['cifar10']} | - | - | - | - | - | - | - |")
    return "\n".join(lines)


def write_readme_table(data: dict[str, Any]) -> None:
    """Replace the table between the README's markers (left alone if the markers are absent)."""
    if not README.is_file():
        return
    text = README.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        return
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    README.write_text(f"{head}{TABLE_START}\n{readme_table(data)}\n{TABLE_END}{tail}")
