"""Bu et al. 2021, Figure 3: epsilon of DP-SGD-JL vs epochs for several JL dimensions r.

Setting (IMDb, §5): n = 25,000, Poisson lots of expected size 256 (q = 256 / 25,000), delta =
1e-5, noise multiplier sigma (:data:`~reproductions.bu2021_jl.config.NOISE_MULTIPLIER`, an
assumption). One DP-SGD-JL step clips by a norm estimated from r projections, so the worst
example's contribution has the random norm ``C sqrt(r / X)``, ``X ~ chi^2_r`` (Lemma 4.1), and the
composition is accounted numerically (Thm 4.1) by :class:`dpcore.accountants.JlAccountant`, which
returns a certified interval ``[lower, upper]`` (``upper = inf`` when no finite bound holds at
this delta on the grid).

Speed: the expensive part of the JL accountant is discretising one step (the shift law of
``sqrt(r / X)`` over ``bins`` probability bins); composition is an FFT power. Each r's one-step
pessimistic and optimistic PLDs are therefore built once (:meth:`JlAccountant.composed_pmfs` of
one step) and raised to every step count of the figure with :meth:`LossPmf.self_compose`. Each
one-step PLD already carries its rounding allowance in ``error_mass``, which the powers multiply
by T: the result is slightly more conservative than composing T steps in one go, never less.

Vanilla DP-SGD (exact clipping) is accounted twice: the tight PLD (certified interval) and the
CLT of Bu, Dong, Long, Su 2019 (mu-GDP, an approximation), the f-DP toolbox the paper builds on.
Which accountant the paper's vanilla curve used is not checked here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpcore.accountants import GdpCltAccountant, JlAccountant, PldAccountant
from dpcore.events import JLGaussianEvent, PoissonSampledEvent, dpsgd_event
from dpcore.runs import RunStore, run_many
from reproductions.bu2021_jl import config as paper
from reproductions.common import code_fingerprint, finite_or_none, profile_config
from reproductions.harness import Executor, Output, fanning_out, spread

STEM = "bu2021_jl_epsilon"
TABLE = "epsilon-table"
#: The code behind a cached epsilon: a change to any of it recomputes the cache.
ACCOUNTANT_MODULES = ("dpcore.pld", "dpcore.accountants", "dpcore.events")


@dataclasses.dataclass(frozen=True)
class EpsilonConfig:
    """One profile of Figure 3."""

    profile: str = "quick"
    dataset_size: int = paper.IMDB_TRAIN_SIZE
    lot_size: int = paper.IMDB_LOT
    noise_multiplier: float = paper.NOISE_MULTIPLIER
    delta: float = paper.DELTA
    jl_dimensions: tuple[int, ...] = paper.FIGURE3_JL_DIMENSIONS
    #: Epoch counts at which epsilon is reported (the last is the table's).
    epochs: tuple[int, ...] = (1, 2, 5, 10, 15, paper.IMDB_EPOCHS)
    #: Probability bins of the JL shift law (fewer: faster, wider certified interval).
    bins: int = 100
    #: Loss-grid spacing of the JL steps (the accountant's default).
    grid_spacing: float = 1e-3

    @property
    def sampling_probability(self) -> float:
        return self.lot_size / self.dataset_size


PROFILES = {
    "quick": EpsilonConfig(),
    "full": EpsilonConfig(profile="full", epochs=tuple(range(1, paper.IMDB_EPOCHS + 1)), bins=400),
}


def epoch_steps(config: EpsilonConfig) -> list[int]:
    """Steps after each of ``config.epochs`` (``round(epochs / q)``)."""
    return [paper.steps_for_epochs(e, config.dataset_size, config.lot_size) for e in config.epochs]


def jl_epsilon_intervals(
    *,
    sampling_probability: float,
    noise_multiplier: float,
    jl_dimension: int,
    steps: Sequence[int],
    delta: float,
    bins: int = 400,
    grid_spacing: float = 1e-3,
) -> list[tuple[float, float]]:
    """Certified ``(lower, upper)`` epsilon of T Poisson-subsampled DP-SGD-JL steps, per T.

    One step is discretised once and composed to each T in ``steps`` by FFT powers; the worse
    of the remove and add directions is reported, as by :class:`JlAccountant`.
    """
    step = PoissonSampledEvent(
        sampling_probability, JLGaussianEvent(noise_multiplier, jl_dimension)
    )
    accountant = JlAccountant(grid_spacing=grid_spacing, bins=bins).compose(step, 1)
    directions = accountant.composed_pmfs(grid_spacing)
    result = []
    for count in steps:
        uppers, lowers = [], []
        for pessimistic, optimistic in directions:
            upper = pessimistic.self_compose(count)
            lower = optimistic.self_compose(count)
            budget = delta - upper.error_mass
            uppers.append(upper.epsilon(budget) if budget > 0 else float("inf"))
            lowers.append(lower.epsilon(min(delta + lower.error_mass, 1.0)))
        result.append((max(lowers), max(uppers)))
    return result


def vanilla_epsilons(
    *, sampling_probability: float, noise_multiplier: float, steps: int, delta: float
) -> dict[str, float]:
    """DP-SGD with exact clipping: tight PLD interval and the CLT (mu-GDP) approximation."""
    event = dpsgd_event(
        sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, steps=steps
    )
    interval = PldAccountant().compose(event).get_epsilon_interval(delta)
    clt = GdpCltAccountant().compose(event)
    return {
        "pld_lower": interval.lower,
        "pld_upper": interval.upper,
        "clt": float(clt.get_epsilon(delta)),
        "clt_mu": clt.mu,
    }


def _row(
    method: str, r: int | None, epoch: int, steps: int, lower: float, upper: float
) -> dict[str, Any]:
    return {
        "method": method,
        "r": r,
        "epoch": epoch,
        "steps": steps,
        "epsilon_lower": finite_or_none(lower),
        "epsilon_upper": finite_or_none(upper),
    }


@dataclasses.dataclass(frozen=True)
class EpsilonRun:
    """One curve of the figure, a spec for :func:`curve_rows`: DP-SGD-JL at ``r``, or vanilla
    DP-SGD (``r`` None: its tight PLD interval and its CLT approximation)."""

    config: EpsilonConfig
    r: int | None


def curve_rows(run: EpsilonRun) -> dict[str, Any]:
    """The rows of ``run``'s curve at every epoch of its profile (PLD arithmetic only: no RDP
    order grid, so no warning to silence), and the seconds they took."""
    config, r = run.config, run.r
    began = time.perf_counter()
    steps = epoch_steps(config)
    rows: list[dict[str, Any]] = []
    if r is None:
        clt_rows: list[dict[str, Any]] = []
        for epoch, count in zip(config.epochs, steps, strict=True):
            vanilla = vanilla_epsilons(
                sampling_probability=config.sampling_probability,
                noise_multiplier=config.noise_multiplier,
                steps=count,
                delta=config.delta,
            )
            rows.append(
                _row("dp_sgd_pld", None, epoch, count, vanilla["pld_lower"], vanilla["pld_upper"])
            )
            clt_rows.append(_row("dp_sgd_clt", None, epoch, count, vanilla["clt"], vanilla["clt"]))
        rows += clt_rows
    else:
        intervals = jl_epsilon_intervals(
            sampling_probability=config.sampling_probability,
            noise_multiplier=config.noise_multiplier,
            jl_dimension=r,
            steps=steps,
            delta=config.delta,
            bins=config.bins,
            grid_spacing=config.grid_spacing,
        )
        rows = [
            _row("dp_sgd_jl", r, epoch, count, lower, upper)
            for epoch, count, (lower, upper) in zip(config.epochs, steps, intervals, strict=True)
        ]
    return {"rows": rows, "seconds": round(time.perf_counter() - began, 2)}


def run_store(output: Output) -> RunStore:
    """Where the curves are kept (``<runs>/bu2021_jl_epsilon/``), keyed by the accountants' code
    and this module's: a change to either recomputes them."""
    return RunStore(output.store(STEM), code=code_fingerprint(*ACCOUNTANT_MODULES, __name__))


def compute(
    profile: str = "quick",
    *,
    config: EpsilonConfig | None = None,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Epsilon at each epoch of the profile for every r and for vanilla DP-SGD.

    Each curve (:class:`EpsilonRun`, independent) is a run of :func:`dpcore.runs.run_many`,
    kept in ``output``'s run store (:func:`run_store`: a full run cut off resumes there): here,
    one after another (``executor`` None or ``"local"``), or at once on ``executor``.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    start = time.perf_counter()
    runs = [EpsilonRun(config, None), *(EpsilonRun(config, r) for r in config.jl_dimensions)]
    curves = run_many(curve_rows, runs, executor=fanned, store=run_store(output))
    rows = [row for curve in curves for row in curve["rows"]]
    seconds = {
        str(run.r): curve["seconds"] for run, curve in zip(runs, curves, strict=True) if run.r
    }
    extra = {
        "seed": None,
        "hardware": "CPU (accounting only)",
        "runs_spread": spread(fanned),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "accountant_seconds_per_r": seconds,
        "sampling_probability": config.sampling_probability,
        "assumptions": [
            f"noise multiplier {config.noise_multiplier:g} and {config.epochs[-1]} epochs: not "
            "read from the paper",
        ],
    }
    output.save_results(STEM, config=config, rows=rows, extra=extra)


def _series(rows: list[dict[str, Any]], method: str, r: int | None = None) -> list[dict[str, Any]]:
    return [row for row in rows if row["method"] == method and row["r"] == r]


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``bu2021_jl_epsilon_vs_epochs.png`` and the README table, from the saved JSON.

    Reads and draws in ``output`` (default: figures/); the table goes to ``readme`` (default:
    this folder's README).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = output or Output()
    data = output.load_results(STEM)
    rows, config = data["rows"], data["config"]
    figure, axis = plt.subplots(figsize=(7, 4.6))
    colours = plt.get_cmap("viridis")
    dimensions = config["jl_dimensions"]
    for index, r in enumerate(dimensions):
        series = _series(rows, "dp_sgd_jl", r)
        colour = colours(index / max(1, len(dimensions) - 1))
        epochs = [row["epoch"] for row in series]
        upper = [row["epsilon_upper"] for row in series]
        lower = [row["epsilon_lower"] for row in series]
        finite = [(e, u) for e, u in zip(epochs, upper, strict=True) if u is not None]
        if finite:
            axis.plot(*zip(*finite, strict=True), "-o", ms=3, color=colour, label=f"JL r={r}")
        axis.plot(
            epochs,
            lower,
            ":",
            color=colour,
            label=f"JL r={r}, certified lower" + ("" if finite else " (upper = inf)"),
        )
    pld = _series(rows, "dp_sgd_pld")
    axis.plot(
        [row["epoch"] for row in pld],
        [row["epsilon_upper"] for row in pld],
        "k-",
        lw=2,
        label="DP-SGD (PLD upper)",
    )
    clt = _series(rows, "dp_sgd_clt")
    axis.plot(
        [row["epoch"] for row in clt],
        [row["epsilon_upper"] for row in clt],
        "k--",
        label="DP-SGD (CLT, approx.)",
    )
    axis.set_yscale("log")
    axis.set_xlabel("epoch")
    axis.set_ylabel(f"epsilon at delta = {config['delta']:g}")
    axis.set_title(
        f"DP-SGD-JL on IMDb: q = {config['lot_size']}/{config['dataset_size']}, "
        f"sigma = {config['noise_multiplier']:g} ({config['profile']})",
        fontsize=10,
    )
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(output.path("bu2021_jl_epsilon_vs_epochs.png"), dpi=150)
    plt.close(figure)
    paper.replace_between(readme or paper.README, TABLE, readme_table(data))


def _interval(row: dict[str, Any]) -> str:
    lower, upper = row["epsilon_lower"], row["epsilon_upper"]
    high = "inf" if upper is None else f"{upper:.3g}"
    return f"[{lower:.3g}, {high}]"


def readme_table(data: dict[str, Any]) -> str:
    """Epsilon after the first and the last epoch, per method, from the saved results only."""
    rows, config = data["rows"], data["config"]
    first, last = config["epochs"][0], config["epochs"][-1]
    lines = [
        f"Profile **{config['profile']}**, commit `{data['commit'][:12]}`, wall time "
        f"{data['wall_time_s']:.0f} s; q = {config['lot_size']}/{config['dataset_size']}, "
        f"sigma = {config['noise_multiplier']:g} (assumption), delta = {config['delta']:g}, "
        f"{config['bins']} shift-law bins. Intervals are certified [lower, upper].",
        "",
        f"| method | epsilon after {first} epoch(s) | epsilon after {last} epochs | paper |",
        "|---|---|---|---|",
    ]

    def at(series: list[dict[str, Any]], epoch: int) -> dict[str, Any]:
        return next(row for row in series if row["epoch"] == epoch)

    pld = _series(rows, "dp_sgd_pld")
    clt = _series(rows, "dp_sgd_clt")
    lines.append(
        f"| DP-SGD, tight PLD | {_interval(at(pld, first))} | {_interval(at(pld, last))} | "
        "not read |"
    )
    lines.append(
        f"| DP-SGD, CLT (approximation) | {at(clt, first)['epsilon_upper']:.3g} | "
        f"{at(clt, last)['epsilon_upper']:.3g} | not read |"
    )
    for r in config["jl_dimensions"]:
        series = _series(rows, "dp_sgd_jl", r)
        lines.append(
            f"| DP-SGD-JL, r = {r} | {_interval(at(series, first))} | "
            f"{_interval(at(series, last))} | not read |"
        )
    return "\n".join(lines)
