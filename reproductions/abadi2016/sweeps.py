"""Abadi et al. 2016, §5.2 "Effect of the parameters" / Fig. 5: MNIST accuracy vs one parameter.

The paper varies one parameter at a time around the reference setting -- 60 PCA dimensions,
1,000 hidden units, lot size 600, clipping 4, learning rate 0.1 -> 0.052 over 10 epochs, sigma = 4
for training and sigma_p = 7 for the PCA -- and trains each combination "until the point at which
(2, 1e-5)-differential privacy would be violated" (§5.2). Fig. 5 (arXiv v2 numbering) shows six
panels; we run the three architecture/lot panels: (1) PCA projection dimension (with the
no-PCA and random-projection lines), (2) hidden units, (3) lot size.

Profiles: ``full`` runs the grid of Fig. 5's axes, each point trained until our moments
accountant (training + DP-PCA) reaches epsilon = 2 at delta = 1e-5, resumable from
``reproductions/checkpoints/abadi2016_sweeps/full/``; ``quick`` is a deliberately tiny version
(2 epochs per point, 2-3 values per axis) that shows the pipeline, not the paper's accuracies.
Everything reuses :mod:`reproductions.abadi2016.mnist_core` (model, data, DP-PCA, schedule).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from dpcore.errors import InvalidParameterError
from reproductions.abadi2016.mnist_core import (
    Data,
    MnistConfig,
    RunSpec,
    load_data,
    projection_event,
    steps_per_epoch,
    steps_within_budget,
    train_private,
)
from reproductions.common import FIGURES, ROOT, load_results, save_results, write_between_markers

STEM = "abadi2016_sweeps"
README = Path(__file__).with_name("README.md")
CHECKPOINTS = ROOT / "reproductions" / "checkpoints" / STEM
TABLE_START, TABLE_END = "<!-- sweeps-table:start -->", "<!-- sweeps-table:end -->"
AXES = ("pca", "hidden", "lot")
AXIS_LABELS = {
    "pca": "PCA dimensions (0 = no PCA)",
    "hidden": "hidden units",
    "lot": "lot size",
    "random": "random projection",
}

#: Test accuracies read off Fig. 5 (arXiv v2) panels (1)-(3) at the full profile's grid points,
#: along the plotted test curve (straight between its kinks); about +-0.003, plot readings, not
#: printed numbers. Panel (1)'s horizontal lines: no PCA about 0.931 (key 0), random projection
#: about 0.925 (§5.2 text: "about 92.5%"; "Not doing PCA reduces accuracy by about 2%").
PAPER_FIG5: dict[str, dict[int, float]] = {
    "pca": {0: 0.931, 10: 0.940, 20: 0.947, 40: 0.948, 60: 0.948, 80: 0.949, 100: 0.946}
    | {120: 0.944, 140: 0.947, 160: 0.947, 180: 0.945, 200: 0.939},
    "hidden": {200: 0.946, 400: 0.947, 600: 0.949, 800: 0.950, 1000: 0.951, 1200: 0.948}
    | {1400: 0.947, 1600: 0.949, 1800: 0.946, 2000: 0.945},
    "lot": {200: 0.890, 300: 0.917, 400: 0.929, 500: 0.941, 600: 0.950, 700: 0.948}
    | {800: 0.946, 900: 0.944, 1000: 0.941, 1100: 0.939, 1200: 0.935},
    "random": {60: 0.925},
}


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """One profile: the reference setting (§5.2), the grid per axis and how long to train.

    Attributes:
        epochs: epochs per point; None trains each point until the moments accountant (training
            plus DP-PCA) would exceed ``target_epsilon`` (the paper's rule).
        pca_dims: projection sizes; 0 means no projection (raw 784 pixels).
        random_projection: also run a data-independent random projection (reference size).
    """

    profile: str = "quick"
    noise_multiplier: float = 4.0
    pca_noise: float = 7.0
    target_epsilon: float = 2.0
    delta: float = 1e-5
    reference_pca: int = 60
    reference_hidden: int = 1000
    reference_lot: int = 600
    pca_dims: tuple[int, ...] = (0, 20, 60)
    hidden_units: tuple[int, ...] = (200, 1000, 2000)
    lot_sizes: tuple[int, ...] = (300, 600, 1200)
    random_projection: bool = True
    epochs: int | None = 2
    checkpoint_every: int = 0
    seed: int = 0


PROFILES = {
    "quick": SweepConfig(),
    "full": SweepConfig(
        profile="full",
        pca_dims=(0, 10, 20, 40, 60, 80, 100, 120, 140, 160, 180, 200),
        hidden_units=tuple(range(200, 2001, 200)),
        lot_sizes=tuple(range(200, 1201, 100)),
        random_projection=True,
        epochs=None,
        checkpoint_every=10,
    ),
}


def points(config: SweepConfig) -> list[tuple[str, int]]:
    """Every (axis, value) of the profile, axis by axis."""
    grid = {"pca": config.pca_dims, "hidden": config.hidden_units, "lot": config.lot_sizes}
    chosen = [(axis, value) for axis in AXES for value in grid[axis]]
    return chosen + ([("random", config.reference_pca)] if config.random_projection else [])


def point_config(config: SweepConfig, axis: str, value: int) -> MnistConfig:
    """The MNIST configuration of one point: the reference with one parameter changed."""
    if axis not in (*AXES, "random"):
        raise InvalidParameterError("axis", f"in {(*AXES, 'random')}", axis)
    pca = value if axis == "pca" else config.reference_pca
    projection = "random" if axis == "random" else ("none" if pca == 0 else "dp_pca")
    return MnistConfig(
        profile=config.profile,
        noise_multipliers=(config.noise_multiplier,),
        pca_noise=(config.pca_noise,),
        lot_size=value if axis == "lot" else config.reference_lot,
        hidden_units=value if axis == "hidden" else config.reference_hidden,
        projection=projection,
        pca_components=pca or config.reference_pca,
        delta=config.delta,
        eval_every=0,
        checkpoint_every=config.checkpoint_every,
        seed=config.seed,
    )


def run_name(point: MnistConfig) -> str:
    """A key naming the trained model (points shared by several axes are trained once)."""
    width = "" if point.projection == "none" else point.pca_components
    return f"{point.projection}{width}_h{point.hidden_units}_l{point.lot_size}"


def run_steps(config: SweepConfig, point: MnistConfig, dataset_size: int) -> int:
    """Steps of one point: ``epochs`` epochs, or as many as the epsilon budget allows."""
    if config.epochs is not None:
        return config.epochs * steps_per_epoch(point, dataset_size)
    return steps_within_budget(
        sampling_probability=point.lot_size / dataset_size,
        noise_multiplier=config.noise_multiplier,
        target_epsilon=config.target_epsilon,
        delta=config.delta,
        extra=projection_event(point, config.pca_noise),
    )


def run(config: SweepConfig, *, checkpoint_dir: Path | None = None) -> dict[str, Any]:
    """Train every point (each distinct model once); rows per (axis, value) and statements."""
    from tqdm import tqdm

    data: Data = load_data()
    n = len(data[0])
    done: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    for axis, value in tqdm(points(config), desc=STEM, unit="point", disable=None):
        point = point_config(config, axis, value)
        name = run_name(point)
        if name not in done:
            spec = RunSpec(
                name=name,
                noise_multiplier=config.noise_multiplier,
                pca_noise=config.pca_noise,
                steps=run_steps(config, point, n),
                seed=config.seed,
            )
            if spec.steps < 1:
                raise InvalidParameterError("target_epsilon", "to allow one step", spec.steps)
            checkpoint = None if checkpoint_dir is None else checkpoint_dir / name
            done[name] = train_private(point, spec, data, checkpoint=checkpoint)
        run_rows, statement = done[name]
        last = run_rows[-1]
        total = statement["epsilon_with_pca"]
        rows.append(
            {
                "axis": axis,
                "value": value,
                "run": name,
                "epochs": last["epoch"],
                "steps": last["steps"],
                "test_accuracy": last["test_accuracy"],
                "train_accuracy": last["train_accuracy"],
                "epsilon_moments_with_pca": total["moments"],
                "epsilon_pld_upper_with_pca": total["pld_upper"],
                "paper_test_accuracy": PAPER_FIG5[axis].get(value),
                "wall_s": last["wall_s"],
            }
        )
    return {"rows": rows, "statements": {name: item[1] for name, item in done.items()}}


def compute(profile: str = "quick") -> None:
    """Run the profile's sweep; save rows (figures/abadi2016_sweeps.*) and the statements."""
    config = PROFILES[profile]
    start = time.perf_counter()
    checkpoint_dir = CHECKPOINTS / config.profile if config.checkpoint_every > 0 else None
    result = run(config, checkpoint_dir=checkpoint_dir)
    FIGURES.mkdir(parents=True, exist_ok=True)
    statements = FIGURES / f"{STEM}_privacy.json"
    statements.write_text(
        json.dumps(result["statements"], indent=1, sort_keys=True, default=str) + "\n"
    )
    extra = {
        "seed": config.seed,
        "hardware": f"{torch.get_num_threads()} torch threads, CPU",
        "torch": torch.__version__,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "privacy_statements": statements.name,
        "paper_fig5": {
            axis: {str(k): v for k, v in item.items()} for axis, item in PAPER_FIG5.items()
        },
    }
    save_results(STEM, config=config, rows=result["rows"], extra=extra)


def plot() -> None:
    """figures/abadi2016_sweeps.png: test accuracy vs each parameter, ours and the paper's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_results(STEM)
    rows, config, paper = data["rows"], data["config"], data["paper_fig5"]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for axis_name, axis in zip(AXES, axes, strict=True):
        mine = sorted(
            (row for row in rows if row["axis"] == axis_name and row["value"] > 0),
            key=lambda row: row["value"],
        )
        values = [row["value"] for row in mine]
        axis.plot(values, [row["test_accuracy"] for row in mine], "-o", ms=4, label="ours, test")
        axis.plot(values, [row["train_accuracy"] for row in mine], "--", label="ours, train")
        readings = sorted((int(k), v) for k, v in paper[axis_name].items() if int(k) > 0)
        axis.plot(*zip(*readings, strict=True), "s:", color="tab:red", ms=3, label="paper (read)")
        axis.set_xlabel(AXIS_LABELS[axis_name])
        axis.grid(alpha=0.3)
    pca_axis = axes[0]
    for row in rows:
        if (row["axis"], row["value"]) == ("pca", 0):
            pca_axis.axhline(row["test_accuracy"], color="black", lw=0.9, label="ours, no PCA")
        if row["axis"] == "random":
            pca_axis.axhline(row["test_accuracy"], color="tab:cyan", lw=0.9, label="ours, random")
    pca_axis.axhline(paper["pca"]["0"], color="black", ls=":", lw=0.9, label="paper, no PCA")
    pca_axis.axhline(paper["random"]["60"], color="tab:cyan", ls=":", lw=0.9, label="paper, random")
    pca_axis.set_ylabel("test accuracy")
    pca_axis.legend(fontsize=6, loc="lower right")
    length = (
        f"{config['epochs']} epochs per point (quick: NOT trained to the budget)"
        if config["epochs"] is not None
        else f"each point trained until eps = {config['target_epsilon']:g} (moments, incl. PCA)"
    )
    figure.suptitle(
        f"Abadi et al. 2016, Fig. 5-style sweeps ({config['profile']} profile): sigma = "
        f"{config['noise_multiplier']:g}, sigma_p = {config['pca_noise']:g}, {length}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(FIGURES / f"{STEM}.png", dpi=150)
    plt.close(figure)
    write_readme_table(data)


def readme_table(data: dict[str, Any]) -> str:
    """The sweep table (ours vs the paper's Fig. 5 readings), from the saved results only."""
    config = data["config"]
    quick = config["epochs"] is not None
    length = (
        f"**{config['epochs']} epochs per point, not trained to the budget: accuracies are NOT "
        "comparable with the paper's**"
        if quick
        else f"each point trained until eps = {config['target_epsilon']:g} (moments, incl. PCA)"
    )
    lines = [
        f"Profile **{config['profile']}** ({length}), seed {data['seed']}, commit "
        f"`{data['commit'][:12]}`, wall time {data['wall_time_s']:.0f} s ({data['hardware']}); "
        f"sigma = {config['noise_multiplier']:g}, sigma_p = {config['pca_noise']:g}, "
        f"delta = {config['delta']:g}.",
        "",
        "| parameter | value | epochs run | eps (moments / PLD upper, incl. PCA) "
        "| test acc. ours | paper (Fig. 5, read off) |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        value = "none" if (row["axis"], row["value"]) == ("pca", 0) else row["value"]
        paper = row["paper_test_accuracy"]
        pld = row["epsilon_pld_upper_with_pca"]
        lines.append(
            f"| {AXIS_LABELS[row['axis']]} | {value} | {row['epochs']:g} "
            f"| {row['epsilon_moments_with_pca']:.2f} / {'inf' if pld is None else f'{pld:.2f}'} "
            f"| {row['test_accuracy']:.3f} | {'-' if paper is None else f'≈{paper:.3f}'} |"
        )
    return "\n".join(lines)


def write_readme_table(data: dict[str, Any]) -> None:
    """Replace the table between the README's sweep markers (left alone if they are absent)."""
    write_between_markers(README, TABLE_START, TABLE_END, readme_table(data))
