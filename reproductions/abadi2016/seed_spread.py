"""Abadi et al. 2016, Fig. 5 (§5.2): the seed spread of the MNIST sweep points that differ.

The full sweep (:mod:`reproductions.abadi2016.sweeps`) trains each point once, at seed 0, and
some points differ from the paper's plot by more than the scoreboard's tolerance. This study
trains the same points -- the sweep's own run spec (:func:`~reproductions.abadi2016.sweeps.
point_config`, :func:`~reproductions.abadi2016.sweeps.point_spec`) with only the seed changed --
at seeds 1..K, each a resumable run in the run store
(``reproductions/checkpoints/abadi2016_seed_spread_full/``), and asks whether the paper's value,
one run, is a plausible draw from the spread of ours. Seed 0 is read from the sweep's committed
results (``figures/abadi2016_sweeps_full.json``) when their config is the study's sweep config;
otherwise (the quick profile) it is trained here too.

Intervals, at level 1 - alpha = 95 %, for the n = K + 1 test accuracies of a point (mean m,
sample standard deviation s), under a normal model of the accuracy over seeds (independent
seeds; same data, schedule and code):

- the t interval for the mean accuracy, ``m ± t(n-1, 1-alpha/2) s / sqrt(n)``;
- the prediction interval for ONE further run, ``m ± t(n-1, 1-alpha/2) s sqrt(1 + 1/n)``, from
  the pivot ``(X - m) / (s sqrt(1 + 1/n)) ~ t(n-1)`` for a run X independent of the n (the
  normal-theory prediction interval, e.g. Hahn & Meeker 1991, *Statistical Intervals*, ch. 4).

The paper prints one run, so the prediction interval decides: the paper's value inside it is
what seed noise alone gives (at 95 %), outside it is not explained by seed noise. The t interval
says where our average lies. Each comparison also carries the two-sided p-value of the paper's
value under that pivot and its Holm adjustment over all comparisons of one study (several
points, and several of the paper's readings of the reference point, are tested at once): a value
outside the prediction interval whose Holm-adjusted p-value is still below alpha is outside at
the family level too. The paper's values are read off a plot (about ±0.003), which the intervals
do not include.

Profiles: ``full`` (the sweep's full profile, K = 4; cheapest point first, all its seeds before
the next point); ``quick`` (a tiny config on the quick sweep: 1 epoch per run, 2 seeds beside
seed 0, seed 0 trained here; shows the pipeline, not the paper's accuracies).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, parse_executor, run_many
from reproductions.abadi2016 import mnist_core, sweeps
from reproductions.abadi2016.mnist_core import CODE_MODULES, Data, private_spec
from reproductions.abadi2016.sweeps import PAPER_FIG5, PointJob, SweepConfig
from reproductions.common import profile_config
from reproductions.harness import Output, RunState, hardware_label, spread
from reproductions.harness.device import default_device
from reproductions.harness.output import run_commit

STEM = "abadi2016_seed_spread"
#: The sweep points whose seed-0 run differed unexplained (the reference point is both the
#: "hidden units = 1000" and the "lot size = 600" row), cheapest first by the seed-0 runs'
#: training time in ``figures/abadi2016_sweeps_full.json`` (476 s, 502 s, 589 s, 1,719 s).
POINTS: tuple[tuple[str, int], ...] = (("lot", 600), ("pca", 10), ("random", 60), ("lot", 300))


def results_stem(profile: str) -> str:
    """``abadi2016_seed_spread`` (quick, tests) or ``abadi2016_seed_spread_full``.

    Example:
        >>> results_stem("quick"), results_stem("full")
        ('abadi2016_seed_spread', 'abadi2016_seed_spread_full')
    """
    return f"{STEM}_full" if profile == "full" else STEM


#: The quick profile's sweep: the quick sweep at 1 epoch per run.
QUICK_SWEEP = dataclasses.replace(sweeps.PROFILES["quick"], epochs=1)


@dataclasses.dataclass(frozen=True)
class SeedSpreadConfig:
    """One profile of the study.

    Attributes:
        sweep: the sweep profile whose points are retrained (only its seed is changed).
        points: (axis, value) of the points, in the order they are trained (all seeds of a
            point before the next).
        seeds: K, the seeds 1..K trained beside seed 0.
        seed0_results: the stem of the sweep results holding the seed-0 runs; None trains
            seed 0 here too. Used only when their config is ``sweep`` (else seed 0 is trained).
        level: the intervals' level (two-sided).
    """

    profile: str = "quick"
    sweep: SweepConfig = QUICK_SWEEP
    points: tuple[tuple[str, int], ...] = (("lot", 600), ("pca", 10))
    seeds: int = 2
    seed0_results: str | None = None
    level: float = 0.95

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise InvalidParameterError("seeds", ">= 1", self.seeds)
        if not 0.0 < self.level < 1.0:
            raise InvalidParameterError("level", "in (0, 1)", self.level)
        if not self.points:
            raise InvalidParameterError("points", "at least one (axis, value)", self.points)
        if self.sweep.seed != 0:
            raise InvalidParameterError("sweep.seed", "0 (the seed-0 runs)", self.sweep.seed)


PROFILES = {
    "quick": SeedSpreadConfig(),
    "full": SeedSpreadConfig(
        profile="full",
        sweep=sweeps.PROFILES["full"],
        points=POINTS,
        seeds=4,
        seed0_results="abadi2016_sweeps_full",
    ),
}


# ----------------------------------------------------------------------------- interval math


def interval_summary(values: list[float], level: float = 0.95) -> dict[str, Any]:
    """Mean, sample sd, the t interval for the mean and the prediction interval for one run.

    Needs two values at least (no spread from one): with fewer, the intervals are None.

    Example:
        >>> s = interval_summary([0.90, 0.92, 0.94])
        >>> round(s["mean"], 4), round(s["sd"], 4), [round(v, 4) for v in s["prediction"]]
        (0.92, 0.02, [0.8206, 1.0194])
    """
    n = len(values)
    mean = float(np.mean(values)) if n else None
    if n < 2:
        return {
            "n": n,
            "mean": mean,
            "sd": None,
            "t": None,
            "mean_interval": None,
            "prediction": None,
        }
    sd = float(np.std(values, ddof=1))
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    assert mean is not None
    half_mean, half_one = t * sd / math.sqrt(n), t * sd * math.sqrt(1 + 1 / n)
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "t": t,
        "mean_interval": [mean - half_mean, mean + half_mean],
        "prediction": [mean - half_one, mean + half_one],
    }


def prediction_p_value(value: float, summary: dict[str, Any]) -> float | None:
    """Two-sided p-value of ``value`` as one further run: ``2 P(T > |value - m| / (s sqrt(1 +
    1/n)))``, T ~ t(n-1); None without a spread (n < 2), 0 or 1 for a zero spread.

    Example:
        >>> s = interval_summary([0.90, 0.92, 0.94])
        >>> round(prediction_p_value(s["prediction"][1], s), 6)
        0.05
    """
    n, sd = summary["n"], summary["sd"]
    if sd is None:
        return None
    gap = abs(value - summary["mean"])
    if sd == 0.0:
        return 1.0 if gap == 0.0 else 0.0
    return float(2 * stats.t.sf(gap / (sd * math.sqrt(1 + 1 / n)), n - 1))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given.

    Example:
        >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03])]
        [0.03, 0.06, 0.06]
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# ----------------------------------------------------------------------------- runs


def seed_sweep(config: SeedSpreadConfig, seed: int) -> SweepConfig:
    """The study's sweep config at ``seed``: the sweep's own, only the seed changed."""
    return dataclasses.replace(config.sweep, seed=seed)


def run_key(config: SeedSpreadConfig, axis: str, value: int, seed: int, n: int) -> dict[str, Any]:
    """What the run of one point at one seed is stored under (the sweep's run spec).

    Example (only the seeds differ from the sweep's seed-0 key):
        >>> a, b = (run_key(PROFILES["full"], "lot", 600, s, 60_000) for s in (0, 3))
        >>> a["config"]["seed"], b["config"]["seed"], a["run"]["seed"], b["run"]["seed"]
        (0, 3, 0, 3)
    """
    sweep = seed_sweep(config, seed)
    point = sweeps.point_config(sweep, axis, value)
    return private_spec(point, sweeps.point_spec(sweep, point, n), n)


def _read_state(
    config: SeedSpreadConfig, axis: str, value: int, seed: int, *, store: Path, n: int, code: str
) -> RunState:
    """A run's state from the store, read only (nothing is trained or written)."""
    return RunState.open(store, run_key(config, axis, value, seed, n), code)


def train(
    config: SeedSpreadConfig,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
    data: Data | None = None,
    include_seed0: bool = True,
    log: Path | None = None,
) -> None:
    """Train (or resume) every run of the study in the store, one after another.

    ``include_seed0`` False leaves seed 0 to the sweep's results. ``log`` gets a line per run
    (start, end, test accuracy).
    """
    data = mnist_core.load_data() if data is None else data
    n = len(data[0])
    first = 0 if include_seed0 else 1
    for axis, value in config.points:
        for seed in range(first, config.seeds + 1):
            if deadline is not None and time.time() >= deadline:
                return
            sweep = seed_sweep(config, seed)
            point = sweeps.point_config(sweep, axis, value)
            spec = sweeps.point_spec(sweep, point, n)
            _log(log, f"start {spec.name} seed {seed}")
            state, _ = mnist_core.train_private(
                point, spec, data, store=store, fingerprint=fingerprint, deadline=deadline
            )
            last = state.rows[-1] if state.rows else {}
            _log(
                log,
                f"{'done' if state.done else 'stopped'} {spec.name} seed {seed}: epoch "
                f"{last.get('epoch', 0)}, test accuracy {last.get('test_accuracy')}",
            )


def fan_out(
    config: SeedSpreadConfig,
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
    include_seed0: bool = True,
) -> None:
    """Train every run of the study through ``executor`` (the sweep's :func:`~reproductions.
    abadi2016.sweeps.train_point`, its config at each seed) into ``store``."""
    first = 0 if include_seed0 else 1
    jobs = [
        PointJob(seed_sweep(config, seed), axis, value, str(store), fingerprint, deadline)
        for axis, value in config.points
        for seed in range(first, config.seeds + 1)
    ]
    run_many(sweeps.train_point, jobs, executor=executor)


def _log(path: Path | None, text: str) -> None:
    """Print ``text`` with the time (UTC), and append it to ``path`` if given."""
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC {STEM}: {text}"
    print(line, flush=True)
    if path is not None:
        with path.open("a") as handle:
            handle.write(line + "\n")


def _seed0_source(config: SeedSpreadConfig, output: Output) -> dict[str, Any] | None:
    """The sweep results holding the seed-0 runs, if named, saved and of the study's sweep."""
    if config.seed0_results is None or not output.has_results(config.seed0_results):
        return None
    data = output.load_results(config.seed0_results)
    plain = json.loads(json.dumps(dataclasses.asdict(config.sweep)))
    return data if data.get("config") == plain else None


def _seed0_row(data: dict[str, Any], axis: str, value: int) -> dict[str, Any] | None:
    """The sweep row of (axis, value), if its run finished."""
    for row in data["rows"]:
        if (row["axis"], row["value"]) == (axis, value):
            status = data.get("summary", {}).get(row["run"], {}).get("status", "done")
            return row if status == "done" else None
    return None


def collect(
    config: SeedSpreadConfig, *, output: Output, store: Path, fingerprint: str, n: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per point and seed) and the per-point intervals, read from the saved results
    and the run store only."""
    seed0 = _seed0_source(config, output)
    rows: list[dict[str, Any]] = []
    for axis, value in config.points:
        for seed in range(config.seeds + 1):
            name = sweeps.run_name(sweeps.point_config(config.sweep, axis, value))
            if seed == 0 and seed0 is not None:
                found = _seed0_row(seed0, axis, value)
                rows.append(
                    {
                        "axis": axis,
                        "value": value,
                        "run": name,
                        "seed": 0,
                        "done": found is not None,
                        "epochs": None if found is None else found["epochs"],
                        "test_accuracy": None if found is None else found["test_accuracy"],
                        "source": f"figures/{config.seed0_results}.json",
                        "code_fingerprint": seed0.get("code_fingerprint"),
                    }
                )
                continue
            state = _read_state(config, axis, value, seed, store=store, n=n, code=fingerprint)
            last = state.rows[-1] if state.rows else {}
            rows.append(
                {
                    "axis": axis,
                    "value": value,
                    "run": name,
                    "seed": seed,
                    "done": state.done,
                    "epochs": last.get("epoch"),
                    "test_accuracy": last.get("test_accuracy") if state.done else None,
                    "source": "run store",
                    "code_fingerprint": fingerprint,
                }
            )
    return rows, summarise(config, rows)


def paper_values(config: SeedSpreadConfig, axis: str, value: int) -> dict[str, float]:
    """The paper's Fig. 5 readings of the model of (axis, value): ``"axis=value"`` -> accuracy,
    every axis whose point is that model (the reference point is on all three)."""
    name = sweeps.run_name(sweeps.point_config(config.sweep, axis, value))
    found = {}
    for other, readings in PAPER_FIG5.items():
        for at, accuracy in readings.items():
            if sweeps.run_name(sweeps.point_config(config.sweep, other, at)) == name:
                found[f"{other}={at}"] = accuracy
    return found


def summarise(config: SeedSpreadConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point: accuracies by seed, the intervals, and each paper value's comparison."""
    points: dict[str, Any] = {}
    comparisons: list[dict[str, Any]] = []
    for axis, value in config.points:
        mine = [row for row in rows if (row["axis"], row["value"]) == (axis, value)]
        done = {row["seed"]: row["test_accuracy"] for row in mine if row["done"]}
        accuracies = [done[seed] for seed in sorted(done)]
        summary = interval_summary(accuracies, config.level)
        entry: dict[str, Any] = {
            "run": mine[0]["run"],
            "accuracy_by_seed": {str(seed): done[seed] for seed in sorted(done)},
            "seeds_planned": config.seeds + 1,
            "complete": len(done) == config.seeds + 1,
            **summary,
            "comparisons": {},
        }
        for key, paper in paper_values(config, axis, value).items():
            p = prediction_p_value(paper, summary)
            within = None
            if summary["sd"] is not None:
                low, high = summary["prediction"]
                within = bool(low <= paper <= high)
            item: dict[str, Any] = {"paper": paper, "within_prediction": within, "p_value": p}
            if summary["sd"] is not None:
                low, high = summary["mean_interval"]
                item["within_mean_interval"] = bool(low <= paper <= high)
            item["statement"] = _statement(paper, summary, config, within, item)
            entry["comparisons"][key] = item
            if p is not None:
                comparisons.append(item)
        points[f"{axis}={value}"] = entry
    for item, adjusted in zip(comparisons, holm([c["p_value"] for c in comparisons]), strict=True):
        item["p_value_holm"] = adjusted
        item["outside_after_holm"] = adjusted < 1 - config.level
    return points


def _statement(
    paper: float,
    summary: dict[str, Any],
    config: SeedSpreadConfig,
    within: bool | None,
    item: dict[str, Any],
) -> str:
    """One sentence: where the paper's value lies against our intervals."""
    n, planned = summary["n"], config.seeds + 1
    if within is None:
        return f"no spread yet ({n} of {planned} seeds done)"
    level = f"{100 * config.level:g} %"
    one, mean = summary["prediction"], summary["mean_interval"]
    return (
        f"the paper's {paper:.3f} is {'inside' if within else 'outside'} the {level} prediction "
        f"interval of one run [{one[0]:.4f}, {one[1]:.4f}] and "
        f"{'inside' if item['within_mean_interval'] else 'outside'} the {level} t interval for "
        f"the mean [{mean[0]:.4f}, {mean[1]:.4f}] ({n} of {planned} seeds, mean "
        f"{summary['mean']:.4f}, sd {summary['sd']:.4f})"
    )


def compute(
    profile: str = "quick",
    *,
    config: SeedSpreadConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    train_runs: bool = True,
    log: Path | None = None,
    data: Data | None = None,
) -> None:
    """Train (resume) the study's runs, then save ``<figures>/<stem>.json`` (+ ``.csv``, ``.md``).

    ``train_runs`` False only reads back what the store holds (a report while the runs go on
    elsewhere). ``executor`` (None or ``"local"``: here, one run after another) trains the runs
    through :func:`dpcore.runs.run_many`. ``deadline`` (a ``time.time()`` value) stops them.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice (before anything runs).
    """
    config = profile_config(PROFILES, profile, config)
    if isinstance(executor, str):
        executor = parse_executor(executor)
    if isinstance(executor, ExecutorChoice) and executor.kind == "local":
        executor = None
    output = output or Output()
    run_commit()
    start = time.perf_counter()
    stem = results_stem(config.profile)
    store = output.store(stem)
    fingerprint = output.code(*CODE_MODULES)
    # Pinned for this call: the results record the runs' code even if the files change meanwhile.
    output = dataclasses.replace(output, runs_code=fingerprint)
    include_seed0 = _seed0_source(config, output) is None
    data = mnist_core.load_data() if data is None else data  # its size is part of the run keys
    if train_runs and executor is not None:
        fan_out(
            config,
            executor,
            store=store,
            fingerprint=fingerprint,
            deadline=deadline,
            include_seed0=include_seed0,
        )
    elif train_runs:
        train(
            config,
            store=store,
            fingerprint=fingerprint,
            deadline=deadline,
            data=data,
            include_seed0=include_seed0,
            log=log,
        )
    rows, points = collect(
        config, output=output, store=store, fingerprint=fingerprint, n=len(data[0])
    )
    left = sum(1 for row in rows if not row["done"])
    seed0 = _seed0_source(config, output)
    extra = {
        "hardware": f"{hardware_label(default_device())}, {spread(executor)}",
        "seed0_hardware": None if seed0 is None else seed0.get("hardware"),
        "torch": torch.__version__,
        **output.provenance_of_runs(*CODE_MODULES),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "runs_left": left,
        # the runs' code pinned: a later commit to the training code would start them afresh
        "resume": f"python -m reproductions --only {STEM} --profile {config.profile} "
        f"--runs-code {fingerprint}",
        "points": points,
    }
    output.save_results(stem, config=config, rows=rows, extra=extra)
    atomic_write_text(output.path(f"{stem}.md"), table(output.load_results(stem)) + "\n")


def plot(*, output: Output | None = None) -> None:
    """Nothing to draw: the study's table (``<stem>.md``) is written by :func:`compute`."""


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(data: dict[str, Any]) -> str:
    """The study as a markdown table, from the saved results only."""
    config = data["config"]
    k, epochs = config["seeds"], config["sweep"]["epochs"]
    length = (
        f"**{epochs} epoch(s) per run, not trained to the budget: NOT comparable with the "
        "paper's values**"
        if epochs is not None
        else f"each run trained until eps = {config['sweep']['target_epsilon']:g} (moments, "
        "incl. PCA) as in the sweep"
    )
    lines = [
        f"Seed spread of Abadi et al. 2016 Fig. 5 sweep points ({config['profile']} profile; "
        f"{length}): seeds 0..{k}, {100 * config['level']:g} % intervals (t for the mean; "
        f"prediction for one run), commit `{data['commit'][:12]}`, {data['hardware']}; runs "
        f"left: {data['runs_left']}."
        + (f" Seed 0: {data['seed0_hardware']}." if data.get("seed0_hardware") else "")
        + "".join(
            f" Stopped or in progress: {row['run']} seed {row['seed']} at epoch {row['epochs']:g}."
            for row in data["rows"]
            if not row["done"] and row.get("epochs")
        ),
        "",
        "| model | paper's reading | accuracy by seed | n | mean | sd | mean interval "
        "| prediction interval | paper | within prediction | Holm p |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in data["points"].values():
        seeds = ", ".join(f"{s}: {a:.4f}" for s, a in entry["accuracy_by_seed"].items()) or "-"
        mean_interval = entry.get("mean_interval")
        prediction = entry.get("prediction")
        spans = [
            "-" if span is None else f"[{span[0]:.4f}, {span[1]:.4f}]"
            for span in (mean_interval, prediction)
        ]
        for label, item in entry["comparisons"].items():
            within = item["within_prediction"]
            lines.append(
                f"| {entry['run']} | {label} | {seeds} | {entry['n']} of {entry['seeds_planned']} "
                f"| {_fmt(entry['mean'])} | {_fmt(entry['sd'])} | {spans[0]} | {spans[1]} "
                f"| {item['paper']:.3f} | {'-' if within is None else 'yes' if within else 'no'} "
                f"| {_fmt(item.get('p_value_holm'), 3)} |"
            )
    return "\n".join(lines)
