"""Abadi et al. 2016, §5.2 / Fig. 3: DP-SGD on MNIST at three noise levels, paper vs ours.

Model and settings (paper §5.2, arXiv v2; see :mod:`reproductions.abadi2016.mnist_core`): DP-PCA
projection to 60 dimensions, one hidden layer of 1,000 ReLU units, softmax output; lot size
L = 600 of N = 60,000 (q = 0.01, Poisson lots here), clipping C = 4, learning rate 0.1 decaying
linearly to 0.052 over 10 epochs then constant. Noise levels (sigma for training, sigma_p for the
PCA): large (8, 16), medium (4, 7), small (2, 4); delta = 1e-5. The paper's runs end, per Fig. 3,
after about 16, 130 and 780 epochs. A non-private baseline (exact PCA, plain SGD) is trained too.

The DP-PCA (:mod:`reproductions.abadi2016.pca`) is a Gaussian event composed once with the
training steps; every epsilon is reported for training alone and with the PCA added.
:func:`compute` saves the results (``figures/abadi2016_mnist.{json,csv}``) and one privacy
statement per noise level (``figures/abadi2016_mnist_<level>_privacy.json``); :func:`plot` draws
accuracy vs epoch from the saved JSON only. The full profile checkpoints every 5 epochs under
``reproductions/checkpoints/abadi2016_mnist/full/`` and skips finished levels on a restart.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.events import dpsgd_event
from reproductions.abadi2016.checkpoints import load_state, save_state
from reproductions.abadi2016.mnist_core import (
    Data,
    EpochHook,
    MnistConfig,
    RunSpec,
    accuracy,
    epsilons,
    learning_rate,
    load_data,
    make_model,
    progress_bar,
    project,
    projection_event,
    run_fingerprint,
    steps_per_epoch,
    steps_within_budget,
    train_private,
    with_projection,
)
from reproductions.abadi2016.pca import dp_pca_directions
from reproductions.common import FIGURES, ROOT, load_results, save_results, write_between_markers

__all__ = ["PROFILES", "MnistConfig", "compute", "learning_rate", "make_model", "plot", "run"]

STEM = "abadi2016_mnist"
README = Path(__file__).with_name("README.md")
CHECKPOINTS = ROOT / "reproductions" / "checkpoints" / STEM
TABLE_START, TABLE_END = "<!-- mnist-table:start -->", "<!-- mnist-table:end -->"


def results_stem(profile: str) -> str:
    """The quick profile saves under ``abadi2016_mnist``, the full one under ``..._full``.

    Separate stems keep a (slow, once-run) full result beside the quick one that
    ``nox -s reproduce`` regenerates; :func:`plot` draws whichever exist.
    """
    return STEM if profile == "quick" else f"{STEM}_{profile}"


def _markers(profile: str) -> tuple[str, str]:
    name = "mnist-table" if profile == "quick" else f"mnist-{profile}-table"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


LEVELS = ("large", "medium", "small")

PROFILES = {
    "quick": MnistConfig(),
    "full": MnistConfig(
        profile="full",
        epochs=(16, 130, 780),
        baseline_epochs=100,
        eval_every=5,
        checkpoint_every=5,
    ),
}


def level_specs(config: MnistConfig, dataset_size: int) -> list[RunSpec]:
    """One run per noise level, ``config.epochs`` long, seeded as ``seed + 1000 * level``."""
    per_epoch = steps_per_epoch(config, dataset_size)
    return [
        RunSpec(
            name=name,
            noise_multiplier=config.noise_multipliers[level],
            pca_noise=config.pca_noise[level],
            steps=config.epochs[level] * per_epoch,
            seed=config.seed + 1000 * level,
        )
        for level, name in enumerate(LEVELS)
    ]


def train_baseline(
    config: MnistConfig,
    data: Data,
    *,
    checkpoint: Path | None = None,
    on_epoch: EpochHook | None = None,
) -> list[dict[str, Any]]:
    """Non-private: exact PCA on all training rows, plain SGD on shuffled lots; resumable."""
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
    torch.manual_seed(seed)
    model = make_model(config, inputs.shape[1])
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr_start)
    generator = torch.Generator().manual_seed(seed)
    fingerprint = {"config": run_fingerprint(config, RunSpec("non-private", 0, 0, 0, seed))}
    state = load_state(checkpoint, fingerprint)
    if state is not None and state["epoch"] > config.baseline_epochs:
        state = None  # a longer run than asked for: start afresh
    rows: list[dict[str, Any]] = []
    elapsed = 0.0
    if state is not None and checkpoint is not None:
        stored = torch.load(checkpoint.with_suffix(".pt"), weights_only=True)
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])
        generator.set_state(stored["generator"])
        rows, elapsed = state["rows"], state["wall_s"]

    def save_pt(path: Path) -> None:
        payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**payload, "generator": generator.get_state()}, path)

    loss_fn = nn.CrossEntropyLoss()
    per_epoch = len(inputs) // config.lot_size
    first = 1 if state is None else state["epoch"] + 1
    bar = progress_bar(config.baseline_epochs, first - 1, "non-private")
    for epoch in range(first, config.baseline_epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(inputs), generator=generator)
        for step in range(per_epoch):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, epoch - 1 + step / per_epoch)
            batch = order[step * config.lot_size : (step + 1) * config.lot_size]
            optimizer.zero_grad()
            loss_fn(model(inputs[batch]), y_train[batch]).backward()
            optimizer.step()
        last = epoch == config.baseline_epochs
        if (config.eval_every > 0 and epoch % config.eval_every == 0) or last:
            rows.append(
                {
                    "run": "non-private",
                    "epoch": epoch,
                    "steps": epoch * per_epoch,
                    "test_accuracy": accuracy(model, test_inputs, y_test),
                    "train_accuracy": accuracy(model, inputs[:10_000], y_train[:10_000]),
                    "epsilon_moments": None,
                    "epsilon_moments_with_pca": None,
                    "wall_s": round(elapsed + time.perf_counter() - start, 2),
                }
            )
        elapsed += time.perf_counter() - start
        every = config.checkpoint_every
        if checkpoint is not None and every > 0 and (epoch % every == 0 or last):
            current = {"fingerprint": fingerprint, "rows": rows, "wall_s": elapsed}
            save_state(checkpoint, {**current, "epoch": epoch, "done": last}, save_pt)
        bar.update(1)
        if on_epoch is not None:
            on_epoch("non-private", epoch)
    bar.close()
    return rows


def run(
    config: MnistConfig, *, checkpoint_dir: Path | None = None, on_epoch: EpochHook | None = None
) -> dict[str, Any]:
    """Train every noise level and the baseline; return rows, summary and privacy statements.

    With ``checkpoint_dir`` (and ``config.checkpoint_every > 0``) each level and the baseline
    resume from their checkpoints there; finished levels are read back, not retrained.
    """
    data = load_data()
    n = len(data[0])
    per_epoch = steps_per_epoch(config, n)
    q = config.lot_size / n
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    statements: dict[str, dict[str, Any]] = {}
    for level, spec in enumerate(level_specs(config, n)):
        checkpoint = None if checkpoint_dir is None else checkpoint_dir / spec.name
        level_rows, statement = train_private(
            config, spec, data, checkpoint=checkpoint, on_epoch=on_epoch
        )
        rows += level_rows
        event_pca = projection_event(config, spec.pca_noise)
        paper_training = dpsgd_event(
            sampling_probability=q,
            noise_multiplier=spec.noise_multiplier,
            steps=config.paper_epochs[level] * per_epoch,
        )
        statement["epsilon_paper_epochs_training_only"] = epsilons(paper_training, config.delta)
        statement["epsilon_paper_epochs_with_pca"] = epsilons(
            with_projection(paper_training, event_pca), config.delta
        )
        budget = {
            key: steps_within_budget(
                sampling_probability=q,
                noise_multiplier=spec.noise_multiplier,
                target_epsilon=config.paper_epsilon[level],
                delta=config.delta,
                extra=extra,
            )
            / per_epoch
            for key, extra in (("training_only", None), ("with_pca", event_pca))
        }
        statements[spec.name] = statement
        summary[spec.name] = {
            "epochs_run": config.epochs[level],
            "test_accuracy": level_rows[-1]["test_accuracy"],
            "wall_s": level_rows[-1]["wall_s"],
            "paper_accuracy": config.paper_accuracy[level],
            "paper_epsilon": config.paper_epsilon[level],
            "paper_epochs": config.paper_epochs[level],
            "epsilon_training_only": statement["epsilon_training_only"],
            "epsilon_with_pca": statement["epsilon_with_pca"],
            "epsilon_pca_alone": statement.get("dp_pca", {}).get("epsilon_alone"),
            "epsilon_paper_epochs_training_only": statement["epsilon_paper_epochs_training_only"],
            "epsilon_paper_epochs_with_pca": statement["epsilon_paper_epochs_with_pca"],
            "epochs_to_paper_epsilon_moments": budget,
            "privacy_statement": f"{STEM}_{spec.name}_privacy.json",
        }
        print(f"{STEM} {spec.name}: {summary[spec.name]['test_accuracy']:.4f}", flush=True)
    baseline = None if checkpoint_dir is None else checkpoint_dir / "non_private"
    baseline_rows = train_baseline(config, data, checkpoint=baseline, on_epoch=on_epoch)
    rows += baseline_rows
    summary["non-private"] = {
        "epochs_run": config.baseline_epochs,
        "test_accuracy": baseline_rows[-1]["test_accuracy"],
        "paper_accuracy": config.paper_baseline_accuracy,
    }
    return {"rows": rows, "summary": summary, "statements": statements}


def compute(profile: str = "quick") -> None:
    """Run :func:`run` for the profile; save results and privacy statements under figures/."""
    config = PROFILES[profile]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    start = time.perf_counter()
    checkpoint_dir = CHECKPOINTS / config.profile if config.checkpoint_every > 0 else None
    result = run(config, checkpoint_dir=checkpoint_dir)
    FIGURES.mkdir(parents=True, exist_ok=True)
    for name, statement in result["statements"].items():
        path = FIGURES / f"{results_stem(profile)}_{name}_privacy.json"
        path.write_text(json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n")
    extra = {
        "seed": config.seed,
        "hardware": f"{torch.get_num_threads()} torch threads, CPU",
        "torch": torch.__version__,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "resumable": checkpoint_dir is not None,
        "summary": result["summary"],
    }
    save_results(results_stem(profile), config=config, rows=result["rows"], extra=extra)


def plot() -> None:
    """``figures/<stem>_accuracy.png`` and the README table for each profile's saved results."""
    for profile in PROFILES:
        if (FIGURES / f"{results_stem(profile)}.json").is_file():
            _plot_profile(profile)


def _plot_profile(profile: str) -> None:
    """Test (and train) accuracy vs epoch per noise level, from the saved JSON only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = results_stem(profile)
    data = load_results(stem)
    rows, config, summary = data["rows"], data["config"], data["summary"]
    baseline = summary["non-private"]["test_accuracy"]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for index, (axis, name) in enumerate(zip(axes, LEVELS, strict=True)):
        mine = [row for row in rows if row["run"] == name]
        epochs = [row["epoch"] for row in mine]
        axis.plot(epochs, [row["test_accuracy"] for row in mine], "-o", ms=3, label="test")
        axis.plot(epochs, [row["train_accuracy"] for row in mine], "--", label="train")
        axis.axhline(config["paper_accuracy"][index], color="tab:red", ls=":", label="paper")
        axis.axhline(baseline, color="grey", ls="-.", lw=0.8, label="ours, non-private")
        eps = summary[name]["epsilon_with_pca"]["moments"]
        axis.set_title(
            f"{name}: sigma={config['noise_multipliers'][index]:g}, "
            f"sigma_p={config['pca_noise'][index]:g}\n"
            f"eps={_fmt(eps)} (moments, incl. PCA), paper eps={config['paper_epsilon'][index]:g}",
            fontsize=9,
        )
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].set_ylim(0.6, 1.0)
    axes[0].legend(fontsize=7, loc="lower right")
    figure.suptitle(f"Abadi et al. 2016 MNIST ({config['profile']} profile, delta = 1e-5)")
    figure.tight_layout()
    figure.savefig(FIGURES / f"{stem}_accuracy.png", dpi=150)
    plt.close(figure)
    write_readme_table(data, profile)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "inf" if value is None else f"{value:.{digits}f}"


def readme_table(data: dict[str, Any]) -> str:
    """The "paper vs ours" markdown table, from the saved results only."""
    config, summary = data["config"], data["summary"]
    lines = [
        f"Profile **{config['profile']}**, seed {data['seed']}, commit `{data['commit'][:12]}`, "
        f"wall time {data['wall_time_s']:.0f} s ({data['hardware']}), delta = {config['delta']:g}"
        f", PCA sample rate {config['pca_sample_rate']:g}.",
        "",
        "| noise (sigma, sigma_p) | epochs run (paper's, Fig. 3) | test acc. ours | paper "
        "| eps run, moments: train / +PCA | eps run +PCA: RDP / PLD "
        "| eps at paper's epochs +PCA: moments / PLD | our epochs to paper's eps (moments +PCA) "
        "| paper eps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for index, name in enumerate(LEVELS):
        item = summary[name]
        run_eps, total = item["epsilon_training_only"], item["epsilon_with_pca"]
        paper_total = item["epsilon_paper_epochs_with_pca"]
        budget = item["epochs_to_paper_epsilon_moments"]["with_pca"]
        lines.append(
            f"| {name} ({config['noise_multipliers'][index]:g}, {config['pca_noise'][index]:g}) "
            f"| {item['epochs_run']} (≈{item['paper_epochs']}) "
            f"| {item['test_accuracy']:.3f} | {item['paper_accuracy']:.2f} "
            f"| {_fmt(run_eps['moments'])} / {_fmt(total['moments'])} "
            f"| {_fmt(total['rdp'])} / [{_fmt(total['pld_lower'])}, {_fmt(total['pld_upper'])}] "
            f"| {_fmt(paper_total['moments'])} / "
            f"[{_fmt(paper_total['pld_lower'])}, {_fmt(paper_total['pld_upper'])}] "
            f"| {budget:.0f} | {item['paper_epsilon']:g} |"
        )
    base = summary["non-private"]
    lines.append(
        f"| non-private (exact PCA) | {base['epochs_run']} (≈100) | {base['test_accuracy']:.3f} "
        f"| {base['paper_accuracy']:.3f} | - | - | - | - | - |"
    )
    return "\n".join(lines)


def write_readme_table(data: dict[str, Any], profile: str = "quick") -> None:
    """Replace the profile's table between its README markers (left alone if they are absent)."""
    start, end = _markers(profile)
    write_between_markers(README, start, end, readme_table(data))
