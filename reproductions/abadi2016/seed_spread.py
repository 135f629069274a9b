"""Abadi et al. 2016, Fig. 3 and Fig. 5 (§5.2): the seed spread of the MNIST runs that differ.

The full sweep (:mod:`reproductions.abadi2016.sweeps`) trains each point once, at seed 0, and
some points differ from the paper's plot by more than the scoreboard's tolerance. This study
trains the same points -- the sweep's own run spec (:func:`~reproductions.abadi2016.sweeps.
point_config`, :func:`~reproductions.abadi2016.sweeps.point_spec`) with only the seed changed --
at seeds 1..K, each a resumable run in the run store
(``reproductions/checkpoints/abadi2016_seed_spread_full/``), and asks whether the paper's value,
one run, is a plausible draw from the spread of ours. Seed 0 is read from the sweep's committed
results (``figures/abadi2016_sweeps_full.json``) when their config is the study's sweep config;
otherwise (the quick profile) it is trained here too.

Fig. 3's medium noise level (sigma = 4, sigma_p = 7, 130 epochs of lot 600, DP-PCA 60 + 1,000
ReLU: 13,000 steps) is one more point of the study, axis ``fig3``, value the level's index in
:data:`~reproductions.abadi2016.mnist.LEVELS` (1; key ``fig3=medium``). Its run spec is
:func:`~reproductions.abadi2016.mnist.level_specs`' medium run of the MNIST profile (the full
profile's :data:`~reproductions.abadi2016.mnist.PROFILES` config) with only the seed changed (the
config's seed and the run's ``seed + 1000 * level``). Seed 0 is read from
``figures/abadi2016_mnist_full.json`` when the fields its run depends on (the run store key's
config, and the level's noise, PCA noise and epochs) equal the study's and the level finished;
otherwise it is trained here. Seeds 1..K are resumable runs in the same run store. Time: the
seed-0 medium run recorded 77 s of training (``wall_s`` in that file; 2 torch threads, commit
5b2182c); the study's Fig. 5 runs took 19-29 ms per step on one thread (476-726 s for 24,644
steps), so a medium run takes about 4-6.5 min on one CPU thread, the 4 seeds about 17-26 min.

Fig. 3's medium level with the per-layer clipping's bound (axis ``fig3_per_layer``, key
``fig3=medium, per-layer bound``) is one more point. The paper "clips the gradient norm of each
layer at 4" (§5.2); clipping each of the K layers with trainable parameters at C bounds the whole
gradient's L2 norm by C sqrt(K), and its noise std is sigma C per coordinate. Ours clips the
whole gradient at C (a stated deviation). This point keeps the paper's total bound and noise std
with our flat clipping: the medium run with ``max_grad_norm`` C sqrt(K) and noise multiplier
sigma / sqrt(K) (:func:`per_layer_config`; K from the model, :func:`trainable_layers`: 2 for 60
-> 1,000 -> 10), everything else, seeds included, the flat medium point's. Its seeds 0..K are all
trained here (its run keys differ from the flat point's by the bound and the multiplier). Its
comparison with the paper joins the Holm family. Each point records every run's epsilon at the
end (moments accountant, training alone and with the DP-PCA): the per-layer bound's smaller
multiplier spends more privacy over the same steps.

The Fig. 5 points still beyond their flat seed spread -- the reference point (lot 600, DP-PCA 60,
1,000 hidden: the "hidden units = 1000" and "lot size = 600" rows), PCA 10 and the random
projection 60 -- have a per-layer-bound point each, after the others (axes ``lot_per_layer``,
``pca_per_layer``, ``random_per_layer``: :func:`per_layer_axis`; keys ``"lot=600, per-layer
bound"``...): the sweep point's own run spec with bound C sqrt(K) and multiplier sigma / sqrt(K)
(:func:`sweep_point`) for the flat point's steps -- the paper's schedule, which the budget gives
at sigma, not recomputed at the smaller multiplier -- so its epsilon at the end exceeds the
sweep's 2. K = 2 for all three (input -> hidden -> 10; the random projection, like the DP-PCA,
is a fixed map applied to the inputs, not a trainable layer). All their seeds, 0 included, are
trained here, their comparisons (the flat point's readings, each named with ``", per-layer bound"``)
join the Holm family, and the flat points' run keys are unchanged.

Which code trained each run: the run store keys a run by its spec and the runs' code
fingerprint, which the full profile pins (``--runs-code``, so finished runs stay readable after
code changes); runs trained later under the pin are trained by the code of the day (e.g. the
seeded noise changed at bf5be5e from torch's Box-Muller to numpy's PCG64 ziggurat: the same
Gaussian noise in distribution, not the same draws). So before training or resuming a run the
study appends the checkout's commit (:func:`~reproductions.harness.output.run_commit`) to
``trained_by_commits`` in the run's state in the store, and every row of the results records
``trained_by_commits`` (None for runs trained before this was recorded, whose code is known
only by ``code_fingerprint``) beside the fingerprint; a seed-0 row read from saved results gives
that file's ``commit``. The medium level's seed 0 (commit 5b2182c, torch Box-Muller noise) and
its seeds 1..K (today's code) are thus trained by different code; the intervals take them as
draws of one distribution, which the change of noise source keeps.

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

Profiles: ``full`` (the sweep's and the MNIST script's full profiles, K = 4; cheapest point
first, all its seeds before the next point); ``quick`` (a tiny config on the quick sweep and the
quick MNIST profile: 1 epoch per run, 2 seeds beside seed 0, seed 0 trained here; shows the
pipeline, not the paper's accuracies).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, parse_executor, run_many
from reproductions.abadi2016 import mnist, mnist_core, sweeps
from reproductions.abadi2016.mnist import LEVELS, LevelJob
from reproductions.abadi2016.mnist_core import (
    CODE_MODULES,
    Data,
    MnistConfig,
    RunSpec,
    private_spec,
)
from reproductions.abadi2016.sweeps import PAPER_FIG5, PointJob, SweepConfig
from reproductions.common import profile_config
from reproductions.harness import Output, RunState, hardware_label, spread
from reproductions.harness.device import default_device
from reproductions.harness.output import run_commit

STEM = "abadi2016_seed_spread"
#: The axis of Fig. 3's noise levels (value: the index into :data:`~reproductions.abadi2016.
#: mnist.LEVELS`).
FIG3 = "fig3"
#: Fig. 3's medium noise level (13,000 steps).
FIG3_MEDIUM = (FIG3, LEVELS.index("medium"))
#: How an axis trained with the per-layer clipping's total bound and noise std
#: (:func:`per_layer_config`) is named: the flat axis with this suffix (:func:`per_layer_axis`).
PER_LAYER_SUFFIX = "_per_layer"
#: The axis of Fig. 3's noise levels trained with the per-layer clipping's total bound and noise
#: std (:func:`per_layer_config`; value: the index into :data:`~reproductions.abadi2016.mnist.
#: LEVELS`).
FIG3_PER_LAYER = FIG3 + PER_LAYER_SUFFIX
#: The axes whose points are Fig. 3 levels.
FIG3_AXES = (FIG3, FIG3_PER_LAYER)
#: The flat axes of the study's points: Fig. 3's levels and the sweep's axes.
AXES = (FIG3, *sweeps.AXES, "random")
#: Fig. 3's medium noise level with the per-layer clipping's total bound and noise std.
FIG3_MEDIUM_PER_LAYER = (FIG3_PER_LAYER, LEVELS.index("medium"))
#: How the per-layer bound's points are named (after the level or the flat point's key).
PER_LAYER = "per-layer bound"


def per_layer_axis(axis: str) -> str:
    """The axis of ``axis``'s points trained with the per-layer clipping's total bound.

    Example:
        >>> per_layer_axis("lot"), per_layer_axis(FIG3) == FIG3_PER_LAYER
        ('lot_per_layer', True)
    """
    return axis + PER_LAYER_SUFFIX


def flat_axis(axis: str) -> str | None:
    """The flat axis of a per-layer-bound axis (None for a flat axis).

    Example:
        >>> flat_axis("random_per_layer"), flat_axis(FIG3_PER_LAYER), flat_axis("random")
        ('random', 'fig3', None)
    """
    return axis.removesuffix(PER_LAYER_SUFFIX) if axis.endswith(PER_LAYER_SUFFIX) else None


#: The runs whose seed-0 run differed unexplained (the Fig. 5 reference point is both the
#: "hidden units = 1000" and the "lot size = 600" row), cheapest first: Fig. 3's medium level
#: (13,000 steps) flat and with the per-layer bound, then the sweep points by the seed-0 runs'
#: training time in ``figures/abadi2016_sweeps_full.json`` (476 s, 502 s, 589 s, 1,719 s); then
#: the per-layer bound of the Fig. 5 points still beyond their flat seed spread, in the same order
#: (the reference point, PCA 10, the random projection: the flat points' steps).
POINTS: tuple[tuple[str, int], ...] = (
    FIG3_MEDIUM,
    FIG3_MEDIUM_PER_LAYER,
    ("lot", 600),
    ("pca", 10),
    ("random", 60),
    ("lot", 300),
    (per_layer_axis("lot"), 600),
    (per_layer_axis("pca"), 10),
    (per_layer_axis("random"), 60),
)


def results_stem(profile: str) -> str:
    """``abadi2016_seed_spread`` (quick, tests) or ``abadi2016_seed_spread_full``.

    Example:
        >>> results_stem("quick"), results_stem("full")
        ('abadi2016_seed_spread', 'abadi2016_seed_spread_full')
    """
    return f"{STEM}_full" if profile == "full" else STEM


#: The quick profile's sweep: the quick sweep at 1 epoch per run.
QUICK_SWEEP = dataclasses.replace(sweeps.PROFILES["quick"], epochs=1)
#: The quick profile's Fig. 3 levels: the quick MNIST profile at 1 epoch per level.
QUICK_FIG3 = dataclasses.replace(mnist.PROFILES["quick"], epochs=(1, 1, 1))


def point_key(axis: str, value: int) -> str:
    """A point's name in the results: ``"<axis>=<value>"``, a Fig. 3 level by its name (with the
    per-layer bound: the flat point's name and ``", per-layer bound"``).

    Example:
        >>> point_key("lot", 600), point_key(*FIG3_MEDIUM), point_key(*FIG3_MEDIUM_PER_LAYER)
        ('lot=600', 'fig3=medium', 'fig3=medium, per-layer bound')
        >>> point_key(per_layer_axis("lot"), 600)
        'lot=600, per-layer bound'
    """
    flat = flat_axis(axis)
    if flat is not None:
        return f"{point_key(flat, value)}, {PER_LAYER}"
    return f"{axis}={LEVELS[value] if axis == FIG3 else value}"


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
        fig3: the MNIST profile whose noise levels are the ``fig3`` points (only its seed is
            changed).
        fig3_seed0_results: the stem of the MNIST results holding the levels' seed-0 runs;
            None trains seed 0 here. Used only when the run's fields there equal ``fig3``'s.
    """

    profile: str = "quick"
    sweep: SweepConfig = QUICK_SWEEP
    points: tuple[tuple[str, int], ...] = (
        FIG3_MEDIUM,
        FIG3_MEDIUM_PER_LAYER,
        ("lot", 600),
        ("pca", 10),
        (per_layer_axis("lot"), 600),
        (per_layer_axis("pca"), 10),
        (per_layer_axis("random"), 60),
    )
    seeds: int = 2
    seed0_results: str | None = None
    level: float = 0.95
    fig3: MnistConfig = QUICK_FIG3
    fig3_seed0_results: str | None = None

    def __post_init__(self) -> None:
        if self.seeds < 1:
            raise InvalidParameterError("seeds", ">= 1", self.seeds)
        if not 0.0 < self.level < 1.0:
            raise InvalidParameterError("level", "in (0, 1)", self.level)
        if not self.points:
            raise InvalidParameterError("points", "at least one (axis, value)", self.points)
        if self.sweep.seed != 0:
            raise InvalidParameterError("sweep.seed", "0 (the seed-0 runs)", self.sweep.seed)
        if self.fig3.seed != 0:
            raise InvalidParameterError("fig3.seed", "0 (the seed-0 runs)", self.fig3.seed)
        for axis, value in self.points:
            if (flat_axis(axis) or axis) not in AXES:
                raise InvalidParameterError("points", f"axes in {AXES} (or {PER_LAYER})", axis)
            if axis in FIG3_AXES and not 0 <= value < len(LEVELS):
                raise InvalidParameterError("points", f"fig3 levels in [0, {len(LEVELS)})", value)


PROFILES = {
    "quick": SeedSpreadConfig(),
    "full": SeedSpreadConfig(
        profile="full",
        sweep=sweeps.PROFILES["full"],
        points=POINTS,
        seeds=4,
        seed0_results="abadi2016_sweeps_full",
        fig3=mnist.PROFILES["full"],
        fig3_seed0_results="abadi2016_mnist_full",
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


def seed_fig3(config: SeedSpreadConfig, seed: int) -> MnistConfig:
    """The study's MNIST (Fig. 3) config at ``seed``: the profile's own, only the seed changed."""
    return dataclasses.replace(config.fig3, seed=seed)


def trainable_layers(config: MnistConfig) -> int:
    """K, the number of layers of ``config``'s model with trainable parameters (built on the
    meta device: no weights, no random draws). A projection (DP-PCA or random) is applied to
    the inputs before the model, fixed during training: it is not one of them.

    Example:
        >>> trainable_layers(mnist.PROFILES["full"])
        2
        >>> trainable_layers(sweeps.point_config(sweeps.PROFILES["full"], "random", 60))
        2
    """
    with torch.device("meta"):
        model = mnist_core.make_model(config)
    return sum(
        1
        for module in model.modules()
        if any(p.requires_grad for p in module.parameters(recurse=False))
    )


def per_layer_config(config: MnistConfig, level: int) -> MnistConfig:
    """``config`` with the per-layer clipping's total bound and noise std at ``level``: flat
    bound C sqrt(K) and the level's noise multiplier sigma / sqrt(K) (K: :func:`trainable_layers`),
    so the noise std per coordinate stays sigma C.

    Example:
        >>> c = per_layer_config(mnist.PROFILES["full"], 1)
        >>> round(c.max_grad_norm, 4), round(c.noise_multipliers[1], 4), c.noise_multipliers[0]
        (5.6569, 2.8284, 8.0)
        >>> round(c.max_grad_norm * c.noise_multipliers[1], 9)
        16.0
    """
    root = math.sqrt(trainable_layers(config))
    noise = list(config.noise_multipliers)
    noise[level] = noise[level] / root
    return dataclasses.replace(
        config, max_grad_norm=config.max_grad_norm * root, noise_multipliers=tuple(noise)
    )


def fig3_config(config: SeedSpreadConfig, axis: str, value: int, seed: int) -> MnistConfig:
    """The MNIST config of a Fig. 3 point (axis ``fig3`` or ``fig3_per_layer``) at ``seed``."""
    level = seed_fig3(config, seed)
    return per_layer_config(level, value) if axis == FIG3_PER_LAYER else level


def sweep_point(sweep: SweepConfig, axis: str, value: int, n: int) -> tuple[MnistConfig, RunSpec]:
    """The MNIST config and run of a sweep point (``axis`` flat or with the per-layer bound):
    the sweep's own (:func:`~reproductions.abadi2016.sweeps.point_config`, :func:`~reproductions.
    abadi2016.sweeps.point_spec`); with the per-layer bound its :func:`per_layer_config` (bound
    C sqrt(K), multiplier sigma / sqrt(K)) for the same steps: the flat point's, the paper's
    schedule at sigma, not recomputed from the budget at the smaller multiplier.

    Raises:
        InvalidParameterError: ``axis`` is not a sweep axis (flat or with the bound).
    """
    flat = flat_axis(axis)
    point = sweeps.point_config(sweep, flat or axis, value)
    spec = sweeps.point_spec(sweep, point, n)
    if flat is None:
        return point, spec
    bounded = per_layer_config(point, 0)
    return bounded, dataclasses.replace(spec, noise_multiplier=bounded.noise_multipliers[0])


def clipping(config: SeedSpreadConfig, axis: str, value: int) -> dict[str, Any]:
    """A point's clipping and noise: the model's trainable layers, the flat bound, the noise
    multiplier, the noise std per coordinate, and (with the per-layer bound) the paper's bound
    per layer (None for a flat point)."""
    if axis in FIG3_AXES:
        point = fig3_config(config, axis, value, 0)
        sigma, bound = point.noise_multipliers[value], config.fig3.max_grad_norm
    else:
        flat = sweeps.point_config(config.sweep, flat_axis(axis) or axis, value)
        point = per_layer_config(flat, 0) if flat_axis(axis) else flat
        sigma, bound = point.noise_multipliers[0], flat.max_grad_norm
    return {
        "trainable_layers": trainable_layers(point),
        "max_grad_norm": point.max_grad_norm,
        "noise_multiplier": sigma,
        "noise_std": sigma * point.max_grad_norm,
        "per_layer_bound": bound if flat_axis(axis) else None,
    }


def run_spec(
    config: SeedSpreadConfig, axis: str, value: int, seed: int, n: int
) -> tuple[MnistConfig, RunSpec]:
    """The MNIST config and run of one point at one seed: the sweep's point (:func:`sweep_point`,
    flat or with the per-layer bound) or a Fig. 3 level (:func:`~reproductions.abadi2016.mnist.
    level_specs`; with the per-layer bound: :func:`per_layer_config`), at ``seed``."""
    if axis in FIG3_AXES:
        level = fig3_config(config, axis, value, seed)
        return level, mnist.level_specs(level, n)[value]
    return sweep_point(seed_sweep(config, seed), axis, value, n)


def run_name(config: SeedSpreadConfig, axis: str, value: int) -> str:
    """The name of a point's runs (a sweep model's :func:`~reproductions.abadi2016.sweeps.
    run_name`, a Fig. 3 level's name; with the per-layer bound that name and
    ``", per-layer bound"``)."""
    flat = flat_axis(axis)
    if flat is not None:
        return f"{run_name(config, flat, value)}, {PER_LAYER}"
    if axis == FIG3:
        return LEVELS[value]
    return sweeps.run_name(sweeps.point_config(config.sweep, axis, value))


def run_key(config: SeedSpreadConfig, axis: str, value: int, seed: int, n: int) -> dict[str, Any]:
    """What the run of one point at one seed is stored under (the sweep's or Fig. 3's run spec).

    Example (only the seeds differ from the sweep's seed-0 key):
        >>> a, b = (run_key(PROFILES["full"], "lot", 600, s, 60_000) for s in (0, 3))
        >>> a["config"]["seed"], b["config"]["seed"], a["run"]["seed"], b["run"]["seed"]
        (0, 3, 0, 3)
        >>> c = run_key(PROFILES["full"], *FIG3_MEDIUM, 3, 60_000)
        >>> c["config"]["seed"], c["run"]["seed"], c["run"]["steps"]
        (3, 1003, 13000)
    """
    point, spec = run_spec(config, axis, value, seed, n)
    return private_spec(point, spec, n)


def _read_state(
    config: SeedSpreadConfig, axis: str, value: int, seed: int, *, store: Path, n: int, code: str
) -> RunState:
    """A run's state from the store, read only (nothing is trained or written)."""
    return RunState.open(store, run_key(config, axis, value, seed, n), code)


#: Where a run's state in the store lists the commits of the checkouts that trained it.
TRAINED_BY = "trained_by_commits"


def note_commit(
    config: SeedSpreadConfig, axis: str, value: int, seed: int, *, store: Path, n: int, code: str
) -> None:
    """Append the checkout's commit to the run's ``trained_by_commits`` in the store, unless the
    run is done or the commit is already the last one listed (written before it trains)."""
    state = _read_state(config, axis, value, seed, store=store, n=n, code=code)
    commits = list(state.extra.get(TRAINED_BY, []))
    if state.done or commits[-1:] == [run_commit()]:
        return
    state.extra[TRAINED_BY] = [*commits, run_commit()]
    state.commit()


def seeds_to_train(
    config: SeedSpreadConfig, seed0_here: Collection[tuple[str, int]] | None
) -> list[tuple[str, int, int]]:
    """(axis, value, seed) of every run to train, point by point: seeds 1..K, and seed 0 of the
    points in ``seed0_here`` (None: of every point)."""
    return [
        (axis, value, seed)
        for axis, value in config.points
        for seed in range(config.seeds + 1)
        if seed > 0 or seed0_here is None or (axis, value) in seed0_here
    ]


def train(
    config: SeedSpreadConfig,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
    data: Data | None = None,
    seed0_here: Collection[tuple[str, int]] | None = None,
    log: Path | None = None,
) -> None:
    """Train (or resume) every run of the study in the store, one after another.

    Seed 0 is trained for the points in ``seed0_here`` only (None: every point); the others'
    come from saved results. ``log`` gets a line per run (start, end, test accuracy).
    """
    data = mnist_core.load_data() if data is None else data
    n = len(data[0])
    for axis, value, seed in seeds_to_train(config, seed0_here):
        if deadline is not None and time.time() >= deadline:
            return
        point, spec = run_spec(config, axis, value, seed, n)
        _log(log, f"start {spec.name} seed {seed}")
        note_commit(config, axis, value, seed, store=store, n=n, code=fingerprint)
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
    seed0_here: Collection[tuple[str, int]] | None = None,
    n: int = 60_000,
) -> None:
    """Train every run of the study through ``executor`` into ``store`` (:func:`train_job`: the
    sweep's or the MNIST script's job, its config at each seed; a sweep point with the
    per-layer bound: :class:`PerLayerPointJob`); seed 0 as in :func:`train`. ``n`` (the training
    set's size) locates the runs whose commit is noted first."""
    jobs: list[PointJob | LevelJob | PerLayerPointJob] = []
    for axis, value, seed in seeds_to_train(config, seed0_here):
        note_commit(config, axis, value, seed, store=store, n=n, code=fingerprint)
        if axis in FIG3_AXES:
            point = fig3_config(config, axis, value, seed)
            jobs.append(LevelJob(point, value, str(store), fingerprint, deadline))
        elif flat_axis(axis) is not None:
            sweep = seed_sweep(config, seed)
            jobs.append(PerLayerPointJob(sweep, axis, value, str(store), fingerprint, deadline))
        else:
            sweep = seed_sweep(config, seed)
            jobs.append(PointJob(sweep, axis, value, str(store), fingerprint, deadline))
    run_many(train_job, jobs, executor=executor)


@dataclasses.dataclass(frozen=True)
class PerLayerPointJob:
    """A sweep point's run with the per-layer bound (:func:`sweep_point`; ``axis`` a per-layer
    axis), as a picklable spec for :func:`dpcore.runs.run_many`."""

    config: SweepConfig
    axis: str
    value: int
    store: str
    fingerprint: str
    deadline: float | None


def train_job(job: PointJob | LevelJob | PerLayerPointJob) -> dict[str, Any]:
    """Train one run of the study where a worker runs it: a sweep point's (flat or with the
    per-layer bound) or a Fig. 3 level's; its name and whether it is done."""
    if isinstance(job, LevelJob):
        return mnist.train_job(job)
    if isinstance(job, PointJob):
        return sweeps.train_point(job)
    data = mnist_core.load_data()
    point, spec = sweep_point(job.config, job.axis, job.value, len(data[0]))
    state, _ = mnist_core.train_private(
        point, spec, data, store=Path(job.store), fingerprint=job.fingerprint, deadline=job.deadline
    )
    return {"run": spec.name, "done": state.done}


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


def _fig3_seed0_source(
    config: SeedSpreadConfig, output: Output, level: int, n: int
) -> dict[str, Any] | None:
    """The MNIST results holding a Fig. 3 level's seed-0 run, if named, saved, of the study's
    run and finished.

    The run is the study's when the fields its run-store key depends on (its config's, and the
    level's noise, PCA noise and epochs) are equal: fields that do not change the run (the
    profile, how checkpoints are kept, the other levels' lengths) may differ.
    """
    if config.fig3_seed0_results is None or not output.has_results(config.fig3_seed0_results):
        return None
    data = output.load_results(config.fig3_seed0_results)
    saved = data.get("config", {})
    point, spec = run_spec(config, FIG3, level, 0, n)
    wanted = json.loads(json.dumps(private_spec(point, spec, n)["config"]))
    try:
        same = all(saved[key] == item for key, item in wanted.items()) and (
            saved["noise_multipliers"][level],
            saved["pca_noise"][level],
            saved["epochs"][level],
        ) == (point.noise_multipliers[level], point.pca_noise[level], point.epochs[level])
    except (KeyError, IndexError, TypeError):
        return None
    item = data.get("summary", {}).get(LEVELS[level], {})
    finished = (
        item.get("status", "done") == "done" and item.get("epochs_run") == (point.epochs[level])
    )
    return data if same and finished and item.get("test_accuracy") is not None else None


def seed0_from_results(
    config: SeedSpreadConfig, output: Output, n: int
) -> dict[tuple[str, int], dict[str, Any]]:
    """The points whose seed-0 run is read from saved results: (axis, value) -> the row (axis,
    value, run, seed 0, done, epochs, test accuracy, source, code fingerprint, commits)."""
    sweep = _seed0_source(config, output)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for axis, value in config.points:
        if flat_axis(axis) is not None:  # no saved seed-0 run: every seed is trained here
            continue
        if axis == FIG3:
            data = _fig3_seed0_source(config, output, value, n)
            if data is None:
                continue
            item = data["summary"][LEVELS[value]]
            epochs, accuracy, stem = (
                item["epochs_run"],
                item["test_accuracy"],
                config.fig3_seed0_results,
            )
            epsilon = (
                (item.get("epsilon_training_only") or {}).get("moments"),
                (item.get("epsilon_with_pca") or {}).get("moments"),
            )
        elif sweep is not None:
            data, stem = sweep, config.seed0_results
            row = _seed0_row(sweep, axis, value)
            epochs = None if row is None else row["epochs"]
            accuracy = None if row is None else row["test_accuracy"]
            epsilon = (
                (None, None)
                if row is None
                else (row.get("epsilon_moments"), row.get("epsilon_moments_with_pca"))
            )
        else:
            continue
        found[(axis, value)] = {
            "axis": axis,
            "value": value,
            "run": run_name(config, axis, value),
            "seed": 0,
            "done": accuracy is not None,
            "epochs": epochs,
            "test_accuracy": accuracy,
            "epsilon_moments": epsilon[0],
            "epsilon_moments_with_pca": epsilon[1],
            "source": f"figures/{stem}.json",
            "code_fingerprint": data.get("code_fingerprint"),
            TRAINED_BY: None if data.get("commit") is None else [data["commit"]],
        }
    return found


def collect(
    config: SeedSpreadConfig, *, output: Output, store: Path, fingerprint: str, n: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (one per point and seed) and the per-point intervals, read from the saved results
    and the run store only."""
    seed0 = seed0_from_results(config, output, n)
    rows: list[dict[str, Any]] = []
    for axis, value in config.points:
        for seed in range(config.seeds + 1):
            if seed == 0 and (axis, value) in seed0:
                rows.append(seed0[(axis, value)])
                continue
            state = _read_state(config, axis, value, seed, store=store, n=n, code=fingerprint)
            last = state.rows[-1] if state.rows else {}
            rows.append(
                {
                    "axis": axis,
                    "value": value,
                    "run": run_name(config, axis, value),
                    "seed": seed,
                    "done": state.done,
                    "epochs": last.get("epoch"),
                    "test_accuracy": last.get("test_accuracy") if state.done else None,
                    "epsilon_moments": last.get("epsilon_moments") if state.done else None,
                    "epsilon_moments_with_pca": (
                        last.get("epsilon_moments_with_pca") if state.done else None
                    ),
                    "source": "run store",
                    "code_fingerprint": fingerprint,
                    TRAINED_BY: state.extra.get(TRAINED_BY),
                }
            )
    return rows, summarise(config, rows)


def paper_values(config: SeedSpreadConfig, axis: str, value: int) -> dict[str, float]:
    """The paper's values of the run of (axis, value): a Fig. 3 level's accuracy (§5.2) under
    its :func:`point_key`; for a sweep point the Fig. 5 readings of its model, ``"axis=value"``
    -> accuracy, every axis whose point is that model (the reference point is on all three).
    With the per-layer bound: the flat point's, each name followed by ``", per-layer bound"``."""
    flat = flat_axis(axis)
    if flat is not None:
        found = paper_values(config, flat, value)
        return {f"{key}, {PER_LAYER}": accuracy for key, accuracy in found.items()}
    if axis in FIG3_AXES:
        return {point_key(axis, value): config.fig3.paper_accuracy[value]}
    name = sweeps.run_name(sweeps.point_config(config.sweep, axis, value))
    found = {}
    for other, readings in PAPER_FIG5.items():
        for at, accuracy in readings.items():
            if sweeps.run_name(sweeps.point_config(config.sweep, other, at)) == name:
                found[f"{other}={at}"] = accuracy
    return found


def summarise(config: SeedSpreadConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per point: accuracies by seed, the intervals, each paper value's comparison, each run's
    epsilon at the end (moments accountant, training alone and with the projection) and a Fig.
    3 point's clipping (:func:`clipping`)."""
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
            "epsilon_moments_by_seed": {
                str(row["seed"]): {
                    "training_only": row.get("epsilon_moments"),
                    "with_pca": row.get("epsilon_moments_with_pca"),
                }
                for row in sorted(mine, key=lambda row: row["seed"])
                if row["done"]
            },
            "clipping": clipping(config, axis, value),
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
        points[point_key(axis, value)] = entry
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
    data = mnist_core.load_data() if data is None else data  # its size is part of the run keys
    n = len(data[0])
    read = seed0_from_results(config, output, n)
    seed0_here = [point for point in config.points if point not in read]
    if train_runs and executor is not None:
        fan_out(
            config,
            executor,
            store=store,
            fingerprint=fingerprint,
            deadline=deadline,
            seed0_here=seed0_here,
            n=n,
        )
    elif train_runs:
        train(
            config,
            store=store,
            fingerprint=fingerprint,
            deadline=deadline,
            data=data,
            seed0_here=seed0_here,
            log=log,
        )
    rows, points = collect(config, output=output, store=store, fingerprint=fingerprint, n=n)
    left = sum(1 for row in rows if not row["done"])
    seed0 = _seed0_source(config, output)
    fig3_seed0 = {
        point_key(axis, value): _fig3_seed0_source(config, output, value, n)
        for axis, value in config.points
        if axis == FIG3
    }
    extra = {
        "hardware": f"{hardware_label(default_device())}, {spread(executor)}",
        "seed0_hardware": None if seed0 is None else seed0.get("hardware"),
        "fig3_seed0_hardware": {
            key: source.get("hardware") for key, source in fig3_seed0.items() if source
        },
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
        f"**{epochs} epoch(s) per sweep run, not trained to the budget: NOT comparable with the "
        "paper's values**"
        if epochs is not None
        else f"each sweep run trained until eps = {config['sweep']['target_epsilon']:g} "
        "(moments, incl. PCA) as in the sweep"
    )
    fig3 = config.get("fig3")
    levels = [value for axis, value in config["points"] if axis == FIG3]
    if fig3 is not None and levels:
        length += "; Fig. 3 levels: " + ", ".join(
            f"{LEVELS[v]} {fig3['epochs'][v]} epoch(s) (paper's {fig3['paper_epochs'][v]}"
            + ("" if fig3["epochs"][v] == fig3["paper_epochs"][v] else ": **NOT comparable**")
            + ")"
            for v in levels
        )
    lines = [
        f"Seed spread of Abadi et al. 2016 Fig. 3 levels and Fig. 5 sweep points "
        f"({config['profile']} profile; {length}): seeds 0..{k}, {100 * config['level']:g} % "
        f"intervals (t for the mean; prediction for one run), commit `{data['commit'][:12]}`, "
        f"{data['hardware']}; runs left: {data['runs_left']}."
        + (f" Seed 0 (sweep): {data['seed0_hardware']}." if data.get("seed0_hardware") else "")
        + "".join(
            f" Seed 0 ({key}): {hardware}."
            for key, hardware in (data.get("fig3_seed0_hardware") or {}).items()
        )
        + "".join(
            f" Stopped or in progress: {row['run']} seed {row['seed']} at epoch {row['epochs']:g}."
            for row in data["rows"]
            if not row["done"] and row.get("epochs")
        )
        + (
            f" Points with the {PER_LAYER} (flat bound C sqrt(K), multiplier sigma / sqrt(K)) "
            "train the flat point's steps: their eps at the end exceeds the flat runs' (a Fig. 5 "
            f"point's: the sweep's budget {config['sweep']['target_epsilon']:g})."
            if any(flat_axis(axis) for axis, _ in config["points"])
            else ""
        ),
        "",
        "| model | paper's reading | accuracy by seed | n | mean | sd | mean interval "
        "| prediction interval | paper | within prediction | Holm p "
        "| eps at the end, moments: train / +PCA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in data["points"].values():
        seeds = ", ".join(f"{s}: {a:.4f}" for s, a in entry["accuracy_by_seed"].items()) or "-"
        mean_interval = entry.get("mean_interval")
        prediction = entry.get("prediction")
        spans = [
            "-" if span is None else f"[{span[0]:.4f}, {span[1]:.4f}]"
            for span in (mean_interval, prediction)
        ]
        epsilon = _epsilon_cell(entry.get("epsilon_moments_by_seed") or {})
        for label, item in entry["comparisons"].items():
            within = item["within_prediction"]
            lines.append(
                f"| {entry['run']} | {label} | {seeds} | {entry['n']} of {entry['seeds_planned']} "
                f"| {_fmt(entry['mean'])} | {_fmt(entry['sd'])} | {spans[0]} | {spans[1]} "
                f"| {item['paper']:.3f} | {'-' if within is None else 'yes' if within else 'no'} "
                f"| {_fmt(item.get('p_value_holm'), 3)} | {epsilon} |"
            )
    return "\n".join(lines)


def _epsilon_cell(by_seed: dict[str, dict[str, float | None]]) -> str:
    """The runs' end epsilons (training / with PCA), the range over seeds where they differ."""
    cells = []
    for key in ("training_only", "with_pca"):
        found = sorted(
            {round(v, 2) for item in by_seed.values() if (v := item.get(key)) is not None}
        )
        cells.append(
            "-"
            if not found
            else f"{found[0]:.2f}"
            if len(found) == 1
            else f"{found[0]:.2f}-{found[-1]:.2f}"
        )
    return " / ".join(cells)
