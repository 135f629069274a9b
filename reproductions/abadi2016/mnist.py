"""Abadi et al. 2016, §5.2 / Fig. 3: DP-SGD on MNIST at three noise levels, paper vs ours.

Model and settings (paper §5.2, arXiv v2; see :mod:`reproductions.abadi2016.mnist_core`): DP-PCA
projection to 60 dimensions, one hidden layer of 1,000 ReLU units, softmax output; lot size
L = 600 of N = 60,000 (q = 0.01, Poisson lots here), clipping C = 4, learning rate 0.1 decaying
linearly to 0.052 over 10 epochs then constant. Noise levels (sigma for training, sigma_p for the
PCA): large (8, 16), medium (4, 7), small (2, 4); delta = 1e-5. The paper's runs end, per Fig. 3,
after about 16, 130 and 780 epochs. A non-private baseline (exact PCA, plain SGD) is trained too.

The DP-PCA (:mod:`reproductions.abadi2016.pca`) is a Gaussian event composed once with the
training steps; every epsilon is reported for training alone and with the PCA added.
:func:`compute` saves the results (``figures/abadi2016_mnist.{json,csv}``; the full profile
``figures/abadi2016_mnist_full.*``) and one privacy statement per noise level
(``figures/<stem>_<level>_privacy.json``); :func:`plot` draws accuracy vs epoch from the saved
JSON only. The runs go through the reproduction harness (:mod:`reproductions.harness`); the full
profile keeps them in the run store (``reproductions/checkpoints/abadi2016_mnist_full/``), so a
restart resumes them and reads finished ones back, and a ``deadline`` stops them early (saved with
the epochs reached and a ``status`` saying so). With an ``executor`` (``--executor
processes:4``) the noise levels and the baseline (independent runs) train at once through
:func:`dpcore.runs.run_many` into the run store, and are read back from it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

from dpcore.atomic import atomic_write_text
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.runs.markers import write_between_markers
from reproductions.abadi2016.mnist_core import (
    CODE_MODULES,
    Data,
    MnistConfig,
    RunSpec,
    code,
    epochs_reached,
    epsilon_columns,
    learning_rate,
    load_data,
    make_model,
    projection_event,
    run_status,
    steps_per_epoch,
    steps_within_budget,
    train_baseline,
    train_private,
    with_projection,
)
from reproductions.common import profile_config
from reproductions.harness import Executor, Output, fanning_out, hardware_label, spread

__all__ = [
    "PROFILES",
    "LevelJob",
    "MnistConfig",
    "compute",
    "fan_out",
    "learning_rate",
    "make_model",
    "plot",
    "run",
    "train_baseline",
    "train_job",
]

STEM = "abadi2016_mnist"
README = Path(__file__).with_name("README.md")
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
        checkpoint=True,
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


def run(
    config: MnistConfig,
    *,
    store: Path | None = None,
    deadline: float | None = None,
    data: Data | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """Train every noise level and the baseline; return rows, summary and privacy statements.

    With ``store`` (a run-store folder) each level and the baseline resume from their last
    commit there; finished runs are read back, not retrained. ``deadline`` (a ``time.time()``
    value) stops the runs early: their summary's ``status`` says how far they got.
    """
    data = load_data() if data is None else data
    n = len(data[0])
    per_epoch = steps_per_epoch(config, n)
    q = config.lot_size / n
    stem = results_stem(config.profile)
    fingerprint = fingerprint or code()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    statements: dict[str, dict[str, Any]] = {}
    for level, spec in enumerate(level_specs(config, n)):
        state, statement = train_private(
            config, spec, data, store=store, fingerprint=fingerprint, deadline=deadline
        )
        rows += state.rows
        last = state.rows[-1] if state.rows else {}
        event_pca = projection_event(config, spec.pca_noise)
        paper_training = dpsgd_event(
            sampling_probability=q,
            noise_multiplier=spec.noise_multiplier,
            steps=config.paper_epochs[level] * per_epoch,
        )
        paper_epochs = {
            "epsilon_paper_epochs_training_only": epsilon_columns(paper_training, config.delta),
            "epsilon_paper_epochs_with_pca": epsilon_columns(
                with_projection(paper_training, event_pca), config.delta
            ),
        }
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
        if statement is not None:
            statement.update(paper_epochs)
            statements[spec.name] = statement
        summary[spec.name] = {
            "status": run_status(state, config.epochs[level]),
            "epochs_planned": config.epochs[level],
            "epochs_run": epochs_reached(state),
            "test_accuracy": last.get("test_accuracy"),
            "wall_s": last.get("wall_s"),
            "paper_accuracy": config.paper_accuracy[level],
            "paper_epsilon": config.paper_epsilon[level],
            "paper_epochs": config.paper_epochs[level],
            "epsilon_training_only": (statement or {}).get("epsilon_training_only"),
            "epsilon_with_pca": (statement or {}).get("epsilon_with_pca"),
            "epsilon_pca_alone": (
                None if event_pca is None else epsilon_columns(event_pca, config.delta)
            ),
            **paper_epochs,
            "epochs_to_paper_epsilon_moments": budget,
            "privacy_statement": (
                None if statement is None else f"{stem}_{spec.name}_privacy.json"
            ),
        }
        print(f"{stem} {spec.name}: {_fmt(last.get('test_accuracy'), 4, '-')}", flush=True)
    baseline = train_baseline(config, data, store=store, fingerprint=fingerprint, deadline=deadline)
    rows += baseline.rows
    last = baseline.rows[-1] if baseline.rows else {}
    summary["non-private"] = {
        "status": run_status(baseline, config.baseline_epochs),
        "epochs_planned": config.baseline_epochs,
        "epochs_run": epochs_reached(baseline),
        "test_accuracy": last.get("test_accuracy"),
        "paper_accuracy": config.paper_baseline_accuracy,
    }
    return {"rows": rows, "summary": summary, "statements": statements, "code": fingerprint}


@dataclasses.dataclass(frozen=True)
class LevelJob:
    """One noise level's run (or the baseline's) as a picklable job for a worker."""

    config: MnistConfig
    #: Index into :data:`LEVELS`; None: the non-private baseline.
    level: int | None
    store: str
    fingerprint: str
    deadline: float | None


def train_job(job: LevelJob) -> dict[str, Any]:
    """Train ``job``'s run into its run store (where a worker runs it): its name and status."""
    data = load_data()
    store = Path(job.store)
    if job.level is None:
        state = train_baseline(
            job.config, data, store=store, fingerprint=job.fingerprint, deadline=job.deadline
        )
        return {"run": "non-private", "done": state.done}
    spec = level_specs(job.config, len(data[0]))[job.level]
    state, _ = train_private(
        job.config, spec, data, store=store, fingerprint=job.fingerprint, deadline=job.deadline
    )
    return {"run": spec.name, "done": state.done}


def fan_out(
    config: MnistConfig,
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train the three noise levels and the baseline at once through ``executor`` into
    ``store`` (independent runs, each with its own seeds).

    Raises:
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    levels: list[int | None] = [*range(len(LEVELS)), None]
    jobs = [LevelJob(config, level, str(store), fingerprint, deadline) for level in levels]
    results: list[dict[str, Any]] = run_many(train_job, jobs, executor=executor, progress=False)
    return results


def compute(
    profile: str = "quick",
    *,
    config: MnistConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: Executor = None,
) -> None:
    """Run :func:`run` for the profile; save results and privacy statements under ``output``.

    ``config`` replaces the profile's (tests use tiny ones); the full profile's runs are kept
    in ``output``'s run store; ``deadline`` (a ``time.time()`` value) stops them early.
    ``executor`` (None or ``"local"``: here, one run after another) trains the noise levels and
    the baseline at once through :func:`dpcore.runs.run_many` (:func:`fan_out`) into the run
    store (used then whatever the profile), and they are read back from it: the same rows.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: fanned-out runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    stem = results_stem(config.profile)
    store = output.store(stem) if config.checkpoint or fanned is not None else None
    fingerprint = output.code(*CODE_MODULES)
    start = time.perf_counter()
    if fanned is not None:
        assert store is not None
        fan_out(config, fanned, store=store, fingerprint=fingerprint, deadline=deadline)
    result = run(config, store=store, deadline=deadline, fingerprint=fingerprint)
    for name, statement in result["statements"].items():
        text = json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n"
        atomic_write_text(output.path(f"{stem}_{name}_privacy.json"), text)
    extra = {
        "seed": config.seed,
        "hardware": hardware_label("cpu"),
        "runs_spread": spread(fanned),
        "torch": torch.__version__,
        **output.provenance_of_runs(*CODE_MODULES),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "resumable": store is not None,
        "summary": result["summary"],
    }
    output.save_results(stem, config=config, rows=result["rows"], extra=extra)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``figures/<stem>_accuracy.png`` and the README table for each profile's saved results."""
    output = output or Output()
    for profile in PROFILES:
        if output.has_results(results_stem(profile)):
            _plot_profile(output, profile, readme or README)


def _plot_profile(output: Output, profile: str, readme: Path) -> None:
    """Test (and train) accuracy vs epoch per noise level, from the saved JSON only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stem = results_stem(profile)
    data = output.load_results(stem)
    rows, config, summary = data["rows"], data["config"], data["summary"]
    baseline = summary["non-private"]["test_accuracy"]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
    for index, (axis, name) in enumerate(zip(axes, LEVELS, strict=True)):
        mine = [row for row in rows if row["run"] == name]
        epochs = [row["epoch"] for row in mine]
        axis.plot(epochs, [row["test_accuracy"] for row in mine], "-o", ms=3, label="test")
        axis.plot(epochs, [row["train_accuracy"] for row in mine], "--", label="train")
        axis.axhline(config["paper_accuracy"][index], color="tab:red", ls=":", label="paper")
        if baseline is not None:
            axis.axhline(baseline, color="grey", ls="-.", lw=0.8, label="ours, non-private")
        eps = _fmt_epsilon(summary[name].get("epsilon_with_pca"), "moments")
        stopped = "" if _status(summary[name]) == "done" else ", stopped early"
        axis.set_title(
            f"{name}: sigma={config['noise_multipliers'][index]:g}, "
            f"sigma_p={config['pca_noise'][index]:g}{stopped}\n"
            f"eps={eps} (moments, incl. PCA), paper eps={config['paper_epsilon'][index]:g}",
            fontsize=9,
        )
        axis.set_xlabel("epoch")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].set_ylim(0.6, 1.0)
    axes[0].legend(fontsize=7, loc="lower right")
    figure.suptitle(f"Abadi et al. 2016 MNIST ({config['profile']} profile, delta = 1e-5)")
    figure.tight_layout()
    figure.savefig(output.path(f"{stem}_accuracy.png"), dpi=150)
    plt.close(figure)
    write_readme_table(data, profile, readme=readme)


def _fmt(value: float | None, digits: int = 2, missing: str = "inf") -> str:
    """A number, or ``missing`` for None (an infinite epsilon unless said otherwise)."""
    return missing if value is None else f"{value:.{digits}f}"


def _fmt_epsilon(epsilons: dict[str, Any] | None, key: str) -> str:
    """An epsilon of a saved dict ("inf" for null); "-" when the run took no step."""
    return "-" if epsilons is None else _fmt(epsilons[key])


def _status(item: dict[str, Any]) -> str:
    """A summary entry's status (results saved before statuses existed are all done)."""
    status: str = item.get("status", "done")
    return status


def _epochs_cell(item: dict[str, Any]) -> str:
    status = _status(item)
    return f"{item['epochs_run']:g}" + ("" if status == "done" else f", {status}")


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
        pld = "-" if total is None else f"[{_fmt(total['pld_lower'])}, {_fmt(total['pld_upper'])}]"
        lines.append(
            f"| {name} ({config['noise_multipliers'][index]:g}, {config['pca_noise'][index]:g}) "
            f"| {_epochs_cell(item)} (≈{item['paper_epochs']}) "
            f"| {_fmt(item['test_accuracy'], 3, '-')} | {item['paper_accuracy']:.2f} "
            f"| {_fmt_epsilon(run_eps, 'moments')} / {_fmt_epsilon(total, 'moments')} "
            f"| {_fmt_epsilon(total, 'rdp')} / {pld} "
            f"| {_fmt(paper_total['moments'])} / "
            f"[{_fmt(paper_total['pld_lower'])}, {_fmt(paper_total['pld_upper'])}] "
            f"| {budget:.0f} | {item['paper_epsilon']:g} |"
        )
    base = summary["non-private"]
    lines.append(
        f"| non-private (exact PCA) | {_epochs_cell(base)} (≈100) "
        f"| {_fmt(base['test_accuracy'], 3, '-')} "
        f"| {base['paper_accuracy']:.3f} | - | - | - | - | - |"
    )
    return "\n".join(lines)


def write_readme_table(
    data: dict[str, Any], profile: str = "quick", *, readme: Path | None = None
) -> None:
    """Replace the profile's table between its README markers (left alone if they are absent)."""
    start, end = _markers(profile)
    write_between_markers(readme or README, start, end, readme_table(data))
