"""Abadi et al. 2016, §5.2 "Effect of the parameters" / Fig. 5: MNIST accuracy vs one parameter.

The paper varies one parameter at a time around the reference setting -- 60 PCA dimensions,
1,000 hidden units, lot size 600, clipping 4, learning rate 0.1 -> 0.052 over 10 epochs, sigma = 4
for training and sigma_p = 7 for the PCA -- and trains each combination "until the point at which
(2, 1e-5)-differential privacy would be violated" (§5.2). Fig. 5 (arXiv v2 numbering) shows six
panels; we run the three architecture/lot panels: (1) PCA projection dimension (with the
no-PCA and random-projection lines), (2) hidden units, (3) lot size.

Profiles: ``full`` runs the grid of Fig. 5's axes, each point trained until our moments
accountant (training + DP-PCA) reaches epsilon = 2 at delta = 1e-5, resumable from the run store
(``reproductions/checkpoints/abadi2016_sweeps/``, a commit every 10 epochs); ``quick`` is a
deliberately tiny version (2 epochs per point, 2-3 values per axis) that shows the pipeline, not
the paper's accuracies. Everything reuses :mod:`reproductions.abadi2016.mnist_core` (model, data,
DP-PCA, schedule, the harness-driven run); a ``deadline`` stops the runs early, saved with a
``status`` per run in the results' ``summary``.

With an ``executor`` (``python -m reproductions --only abadi2016_sweeps --executor processes:2``)
the distinct models are trained at once through :func:`dpcore.runs.run_many`
(:class:`PointJob`, :func:`train_point`) into the run store, then read back here: the same rows
as the in-process run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, parse_executor, run_many
from dpcore.runs.markers import write_between_markers
from reproductions.abadi2016 import mnist_core
from reproductions.abadi2016.mnist_core import (
    CODE_MODULES,
    Data,
    MnistConfig,
    RunSpec,
    code,
    epochs_reached,
    load_data,
    projection_event,
    run_status,
    steps_per_epoch,
    steps_within_budget,
    train_private,
)
from reproductions.common import profile_config
from reproductions.harness import Output, RunState, hardware_label, spread
from reproductions.harness.device import default_device
from reproductions.harness.output import run_commit

STEM = "abadi2016_sweeps"
README = Path(__file__).with_name("README.md")
TABLE_START, TABLE_END = "<!-- sweeps-table:start -->", "<!-- sweeps-table:end -->"


def results_stem(profile: str) -> str:
    """``abadi2016_sweeps`` (quick, tests) or ``abadi2016_sweeps_full`` (its own results).

    Example:
        >>> results_stem("quick"), results_stem("full")
        ('abadi2016_sweeps', 'abadi2016_sweeps_full')
    """
    return f"{STEM}_full" if profile == "full" else STEM


def markers(profile: str) -> tuple[str, str]:
    """README markers of a profile's table (``sweeps-table`` or ``sweeps-table-full``)."""
    if profile != "full":
        return TABLE_START, TABLE_END
    return "<!-- sweeps-table-full:start -->", "<!-- sweeps-table-full:end -->"


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
    #: Evaluate (and commit a checkpoint) every this many epochs, 0: only at the end. Only a
    #: point's last evaluation is reported.
    eval_every: int = 0
    #: Keep the runs in the run store (resumable), as the full profile does.
    checkpoint: bool = False
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
        eval_every=10,
        checkpoint=True,
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
        eval_every=config.eval_every,
        checkpoint=config.checkpoint,
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


def point_spec(config: SweepConfig, point: MnistConfig, dataset_size: int) -> RunSpec:
    """The training run of one point (named by :func:`run_name`).

    Raises:
        InvalidParameterError: the budget does not allow one step.
    """
    spec = RunSpec(
        name=run_name(point),
        noise_multiplier=config.noise_multiplier,
        pca_noise=config.pca_noise,
        steps=run_steps(config, point, dataset_size),
        seed=config.seed,
    )
    if spec.steps < 1:
        raise InvalidParameterError("target_epsilon", "to allow one step", spec.steps)
    return spec


@dataclasses.dataclass(frozen=True)
class PointJob:
    """One distinct model of a sweep, as a picklable spec for :func:`dpcore.runs.run_many`."""

    config: SweepConfig
    axis: str
    value: int
    store: str
    fingerprint: str
    deadline: float | None


def train_point(job: PointJob) -> dict[str, Any]:
    """Train ``job``'s model into its run store (where a worker runs it): its name and status."""
    data = mnist_core.load_data()
    point = point_config(job.config, job.axis, job.value)
    spec = point_spec(job.config, point, len(data[0]))
    state, _ = train_private(
        point,
        spec,
        data,
        store=Path(job.store),
        fingerprint=job.fingerprint,
        deadline=job.deadline,
    )
    return {"run": spec.name, "done": state.done}


def fan_out(
    config: SweepConfig,
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train every distinct model of ``config`` through ``executor`` into ``store``."""
    jobs: dict[str, PointJob] = {}
    steps: dict[str, int] = {}
    for axis, value in points(config):
        point = point_config(config, axis, value)
        name = run_name(point)
        jobs.setdefault(name, PointJob(config, axis, value, str(store), fingerprint, deadline))
        steps.setdefault(name, run_steps(config, point, mnist_core.MNIST_TRAIN_SIZE))
    # Longest first: the runs of 100k+ steps (small lots) start at once, not behind the others.
    order = sorted(jobs, key=lambda name: -steps[name])
    results: list[dict[str, Any]] = run_many(
        train_point, [jobs[name] for name in order], executor=executor
    )
    return results


def run(
    config: SweepConfig,
    *,
    store: Path | None = None,
    deadline: float | None = None,
    data: Data | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """Train every point (each distinct model once); rows per (axis, value), statements, summary.

    With ``store`` the runs resume from the run store; ``deadline`` stops them early (a stopped
    run's ``summary`` entry says how far it got; its rows show its last evaluation, if any).
    """
    from tqdm import tqdm

    data = load_data() if data is None else data
    n = len(data[0])
    fingerprint = fingerprint or code()
    done: dict[str, tuple[RunState, dict[str, Any] | None]] = {}
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for axis, value in tqdm(points(config), desc=STEM, unit="point", disable=None):
        point = point_config(config, axis, value)
        name = run_name(point)
        if name not in done:
            spec = point_spec(config, point, n)
            done[name] = train_private(
                point, spec, data, store=store, fingerprint=fingerprint, deadline=deadline
            )
            planned = spec.steps / steps_per_epoch(point, n)
            state = done[name][0]
            summary[name] = {
                "status": run_status(state, planned),
                "steps_planned": spec.steps,
                "epochs_planned": planned,
                "epochs_run": epochs_reached(state),
            }
        state, statement = done[name]
        last = state.rows[-1] if state.rows else {}
        total = {} if statement is None else statement["epsilon_with_pca"]
        rows.append(
            {
                "axis": axis,
                "value": value,
                "run": name,
                "epochs": last.get("epoch", 0),
                "steps": last.get("step", 0),
                "test_accuracy": last.get("test_accuracy"),
                "train_accuracy": last.get("train_accuracy"),
                "epsilon_moments_with_pca": total.get("moments"),
                "epsilon_pld_upper_with_pca": total.get("pld_upper"),
                "paper_test_accuracy": PAPER_FIG5[axis].get(value),
                "wall_s": last.get("wall_s"),
            }
        )
    statements = {name: item[1] for name, item in done.items() if item[1] is not None}
    return {"rows": rows, "statements": statements, "summary": summary, "code": fingerprint}


def compute(
    profile: str = "quick",
    *,
    config: SweepConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    hardware: str | None = None,
) -> None:
    """Run the profile's sweep; save rows (``<figures>/abadi2016_sweeps.*``) and the statements.

    ``config`` replaces the profile's; ``output`` the folders (the full profile's runs go to its
    run store); ``deadline`` (a ``time.time()`` value) stops the runs early. ``executor`` (None
    or ``"local"``: here, one model after another) trains the models at once through
    :func:`dpcore.runs.run_many` into the run store (used then whatever the profile), and the
    results are read back from it: the same rows. ``hardware`` replaces the saved description
    of what trained the runs (default: this process's device and spread) when the stored runs
    were trained elsewhere, or in parts on several machines (the store does not record it).

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice, or ``hardware`` is empty
            (before anything runs).
    """
    if hardware is not None and not (isinstance(hardware, str) and hardware.strip()):
        raise InvalidParameterError("hardware", "a non-empty description", hardware)
    config = profile_config(PROFILES, profile, config)
    if isinstance(executor, str):
        executor = parse_executor(executor)
    if isinstance(executor, ExecutorChoice) and executor.kind == "local":
        executor = None
    output = output or Output()
    run_commit()  # the checkout as it is now, before this run writes its statements under figures/
    start = time.perf_counter()
    stem = results_stem(config.profile)
    store = output.store(stem) if config.checkpoint or executor is not None else None
    fingerprint = output.code(*CODE_MODULES)
    if executor is not None:
        assert store is not None
        fan_out(config, executor, store=store, fingerprint=fingerprint, deadline=deadline)
    result = run(config, store=store, deadline=deadline, fingerprint=fingerprint)
    statements = output.path(f"{stem}_privacy.json")
    text = json.dumps(result["statements"], indent=1, sort_keys=True, default=str) + "\n"
    atomic_write_text(statements, text)
    extra = {
        "seed": config.seed,
        "hardware": hardware or f"{hardware_label(default_device())}, {spread(executor)}",
        "torch": torch.__version__,
        **output.provenance_of_runs(*CODE_MODULES),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "training_seconds": training_seconds(result["rows"]),
        "privacy_statements": statements.name,
        "paper_fig5": {
            axis: {str(k): v for k, v in item.items()} for axis, item in PAPER_FIG5.items()
        },
        "summary": result["summary"],
    }
    output.save_results(stem, config=config, rows=result["rows"], extra=extra)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``<figures>/<stem>.png``: test accuracy vs each parameter, ours and the paper's, and the
    README table, for every profile with saved results."""
    output = output or Output()
    for profile in ("quick", "full"):
        if output.has_results(results_stem(profile)):
            _plot_profile(output, results_stem(profile), readme)


def _plot_profile(output: Output, stem: str, readme: Path | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(stem)
    config, paper = data["config"], data["paper_fig5"]
    rows = [row for row in data["rows"] if row["test_accuracy"] is not None]
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
    figure.savefig(output.path(f"{stem}.png"), dpi=150)
    plt.close(figure)
    write_readme_table(data, readme=readme)


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
        f"`{data['commit'][:12]}`, {_time_spent(data)} ({data['hardware']}); "
        f"sigma = {config['noise_multiplier']:g}, sigma_p = {config['pca_noise']:g}, "
        f"delta = {config['delta']:g}.",
        "",
        "| parameter | value | epochs run | eps (moments / PLD upper, incl. PCA) "
        "| test acc. ours | paper (Fig. 5, read off) |",
        "|---|---|---|---|---|---|",
    ]
    summary = data.get("summary", {})  # results saved before statuses existed: all done
    for row in data["rows"]:
        value = "none" if (row["axis"], row["value"]) == ("pca", 0) else row["value"]
        paper = row["paper_test_accuracy"]
        status = summary.get(row["run"], {}).get("status", "done")
        epochs = f"{row['epochs']:g}" + ("" if status == "done" else f", {status}")
        if row["test_accuracy"] is None:  # stopped before its first evaluation
            spent, accuracy = "-", "-"
        else:
            spent = " / ".join(
                "inf" if eps is None else f"{eps:.2f}"  # null is an infinite epsilon
                for eps in (row["epsilon_moments_with_pca"], row["epsilon_pld_upper_with_pca"])
            )
            accuracy = f"{row['test_accuracy']:.3f}"
        lines.append(
            f"| {AXIS_LABELS[row['axis']]} | {value} | {epochs} | {spent} | {accuracy} "
            f"| {'-' if paper is None else f'≈{paper:.3f}'} |"
        )
    return "\n".join(lines)


def training_seconds(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The training time of the distinct models (each run's last recorded ``wall_s``, summed over
    its restarts): their sum and the longest, which a read-back of stored runs does not show in
    its own wall time.

    Example:
        >>> training_seconds([{"run": "a", "wall_s": 3.0}, {"run": "a", "wall_s": 3.0},
        ...                   {"run": "b", "wall_s": 5.0}, {"run": "c", "wall_s": None}])
        {'sum': 8.0, 'longest': 5.0}
    """
    last = {row["run"]: row["wall_s"] for row in rows if row.get("wall_s") is not None}
    return {"sum": round(sum(last.values()), 1), "longest": round(max(last.values(), default=0), 1)}


def _time_spent(data: dict[str, Any]) -> str:
    spent = data.get("training_seconds")  # absent in results saved before it was recorded
    if spent is None or not spent["sum"]:
        return f"wall time {data['wall_time_s']:.0f} s"
    return (
        f"training {spent['sum']:.0f} s over all models (longest {spent['longest']:.0f} s), "
        f"this report {data['wall_time_s']:.0f} s"
    )


def write_readme_table(data: dict[str, Any], *, readme: Path | None = None) -> None:
    """Replace the table between the README's sweep markers (left alone if they are absent)."""
    start, end = markers(data["config"]["profile"])
    write_between_markers(readme or README, start, end, readme_table(data))
