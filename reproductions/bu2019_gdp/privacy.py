"""Privacy side of Bu, Dong, Long, Su (2020): every reported setting under five accountants.

For each :data:`~reproductions.bu2019_gdp.settings.SETTINGS` row (Poisson rate q = lot / n,
T = ceil(epochs * n / lot) steps; the paper's own scripts use the unrounded epochs * n / lot):

- mu of the CLT accountant, mu = q sqrt(T (e^{1/sigma^2} - 1)) (Bu et al. 2020, Thm 5 /
  Cor. 5), and its epsilon at the setting's delta -- an approximation, not a bound;
- the moments accountant as the paper computed it: TF Privacy's RDP of the sampled Gaussian on
  orders 1.1, 1.2, ..., 10.9, 12, ..., 63 with eps = min_a RDP(a) + log(1/delta) / (a - 1)
  (the ``compute_epsilon`` of the authors' ``gdp_accountant.py``), and dpcore's
  :class:`~dpcore.accountants.MomentsAccountant` (Abadi et al. 2016, integer lambda <= 32);
- RDP with dpcore's default orders and conversion;
- the certified PLD interval [lower, upper] (tight up to the interval's width).

A setting is flagged "CLT understates" when eps_CLT < the PLD *lower* bound: the CLT then
claims more privacy than the mechanism has. Settings trained on substitute data (Adult's UCI
split, MovieLens-100K) are accounted for at our n and lot as well. :func:`compute` also saves,
per dataset, the trade-off curves of its longest setting (CLT G_mu, tight, RDP-implied; via
:mod:`reproductions.bu2019_gdp.tradeoff_curves`). :func:`plot` reads only the saved JSON.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpcore.accountants import GdpCltAccountant, MomentsAccountant, RdpAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.errors import InvalidParameterError
from dpcore.events import DpEvent, dpsgd_event
from dpcore.runs import run_many
from dpcore.runs.markers import write_between_markers
from dpcore.tradeoff import GaussianTradeoff
from reproductions.bu2019_gdp import tradeoff_curves
from reproductions.bu2019_gdp.settings import SETTINGS, Setting
from reproductions.common import finite_or_none, profile_config
from reproductions.harness import Executor, Output, fanned_store, fanning_out, spread

STEM = "bu2019_privacy"
README = Path(__file__).with_name("README.md")
TABLE_START, TABLE_END = "<!-- privacy-table:start -->", "<!-- privacy-table:end -->"
DATASETS = ("mnist", "imdb", "adult", "movielens")
#: RDP orders of TF Privacy's tutorials, which the paper's moments-accountant column used.
#: A tight curve more than this below the RDP-implied curve is too loose to draw.
TIGHT_CHECK_TOLERANCE = 1e-2
_REJECTED = (
    "pessimistic tight curve more than 0.01 below the RDP-implied curve (grid too coarse at "
    "this mu); next-longest setting drawn"
)
PAPER_MA_ORDERS = tuple([1 + x / 10 for x in range(1, 100)] + list(range(12, 64)))


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """Resolution of the accounting; the profiles differ only in the curves' sampling."""

    profile: str = "quick"
    #: Points on the type-I-error axis of each trade-off curve.
    alphas: int = 200
    #: Loss-grid spacing of the tight curve (tradeoff_curves' default).
    grid_spacing: float = 2e-4
    #: Relative width of the certified PLD epsilon interval.
    pld_relative_tolerance: float = 0.005


PROFILES = {
    "quick": PrivacyConfig(),
    "full": PrivacyConfig(profile="full", alphas=400),
}


def paper_moments_epsilon(event: DpEvent, delta: float) -> float:
    """Epsilon as the paper's "MA" column: TF Privacy's orders and classic RDP conversion.

    Example (MNIST, sigma 1.3, 15 epochs; the paper prints 1.19):
        >>> event = dpsgd_event(sampling_probability=256 / 60_000, noise_multiplier=1.3,
        ...                     steps=3516)
        >>> round(paper_moments_epsilon(event, 1e-5), 2)
        1.19
    """
    accountant = RdpAccountant(orders=PAPER_MA_ORDERS).compose(event)
    values = accountant.rdp + math.log(1 / delta) / (accountant.orders - 1)
    return float(np.min(values))


def clt_understates(eps_clt: float, pld_lower: float | None) -> bool:
    """True when the CLT epsilon lies below the certified lower bound on the true epsilon.

    >>> clt_understates(0.83, 0.86), clt_understates(0.9, 0.86), clt_understates(5.0, None)
    (True, False, False)
    """
    return pld_lower is not None and eps_clt < pld_lower


_ACCOUNT_KEYS = (
    "mu_clt",
    "eps_clt",
    "eps_moments_paper",
    "eps_moments",
    "eps_rdp",
    "pld_lower",
    "pld_upper",
    "clt_understates",
)


def account(
    sampling_probability: float, noise_multiplier: float, steps: int, delta: float, tolerance: float
) -> dict[str, Any]:
    """Every accountant's answer for one DP-SGD run (None stands for an infinite epsilon)."""
    if not 0 < sampling_probability <= 1:
        raise InvalidParameterError("sampling_probability", "in (0, 1]", sampling_probability)
    event = dpsgd_event(
        sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, steps=steps
    )
    clt = GdpCltAccountant().compose(event)
    with warnings.catch_warnings():
        # An RDP optimum at the edge of the order grid leaves the bound valid (only possibly
        # loose); every other warning still reaches the caller.
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        interval = (
            PldAccountant(relative_tolerance=tolerance).compose(event).get_epsilon_interval(delta)
        )
        eps_clt = float(clt.get_epsilon(delta))
        lower = finite_or_none(interval.lower)
        result: dict[str, Any] = {
            "mu_clt": float(clt.mu),
            "eps_clt": eps_clt,
            "eps_moments_paper": finite_or_none(paper_moments_epsilon(event, delta)),
            "eps_moments": finite_or_none(MomentsAccountant().compose(event).get_epsilon(delta)),
            "eps_rdp": finite_or_none(RdpAccountant().compose(event).get_epsilon(delta)),
            "pld_lower": lower,
            "pld_upper": finite_or_none(interval.upper),
            "clt_understates": clt_understates(eps_clt, lower),
        }
    return result


def setting_row(setting: Setting, tolerance: float) -> dict[str, Any]:
    """One table row: the setting, the paper's printed values, ours at the paper's n and at ours."""
    row: dict[str, Any] = {
        "name": setting.name,
        "dataset": setting.dataset,
        "n": setting.n,
        "lot_size": setting.lot_size,
        "noise_multiplier": setting.noise_multiplier,
        "epochs": setting.epochs,
        "q": setting.sampling_probability,
        "steps": setting.steps,
        "delta": setting.delta,
        "paper_mu_clt": setting.paper_mu_clt,
        "paper_eps_clt": setting.paper_eps_clt,
        "paper_eps_moments": setting.paper_eps_moments,
        "assumed": ", ".join(setting.assumed),
    }
    row.update(
        account(
            setting.sampling_probability,
            setting.noise_multiplier,
            setting.steps,
            setting.delta,
            tolerance,
        )
    )
    row["our_n"], row["our_lot_size"] = setting.local_n, setting.local_lot_size
    # Every row has the same keys (one CSV); "ours_*" is None where our data is the paper's.
    ours: dict[str, Any] = dict.fromkeys(_ACCOUNT_KEYS)
    if setting.our_n is not None or setting.our_lot_size is not None:
        ours = account(
            setting.local_sampling_probability,
            setting.noise_multiplier,
            setting.local_steps,
            setting.delta,
            tolerance,
        )
    row.update({f"ours_{key}": value for key, value in ours.items()})
    return row


def _curves(setting: Setting, config: PrivacyConfig) -> dict[str, Any]:
    alphas = np.unique(
        np.concatenate(
            [
                np.geomspace(1e-12, 1.0, config.alphas // 2),
                np.linspace(0.0, 1.0, config.alphas // 2),
            ]
        )
    )
    run = tradeoff_curves.Setting(
        setting.name, setting.sampling_probability, setting.noise_multiplier, setting.steps
    )
    mu = (
        GdpCltAccountant()
        .compose(
            dpsgd_event(
                sampling_probability=run.sampling_probability,
                noise_multiplier=run.noise_multiplier,
                steps=run.steps,
            )
        )
        .mu
    )
    clt = np.asarray(GaussianTradeoff(mu)(alphas))
    tight = tradeoff_curves._tight_curve(run, alphas, config.grid_spacing)
    rdp = tradeoff_curves._rdp_curve(run, alphas)
    return {
        "setting": setting.name,
        "dataset": setting.dataset,
        "mu_clt": float(mu),
        "max_clt_minus_tight": float(np.max(clt - tight)),
        "min_tight_minus_rdp": float(np.min(np.asarray(tight) - np.asarray(rdp))),
        "alpha": alphas.tolist(),
        "clt": clt.tolist(),
        "tight": np.asarray(tight).tolist(),
        "rdp_implied": np.asarray(rdp).tolist(),
    }


#: The code the rows and curves depend on: a change here computes them afresh in the run store.
CODE_MODULES = (
    "dpcore.accountants",
    "dpcore.pld",
    "dpcore.events",
    "dpcore.tradeoff",
    "reproductions.bu2019_gdp.settings",
    "reproductions.bu2019_gdp.tradeoff_curves",
    __name__,
)


@dataclasses.dataclass(frozen=True)
class SettingRun:
    """One setting's table row, a spec for :func:`setting_run`."""

    setting: Setting
    tolerance: float


def setting_run(run: SettingRun) -> dict[str, Any]:
    """:func:`setting_row` of ``run``'s setting at its PLD tolerance."""
    return setting_row(run.setting, run.tolerance)


@dataclasses.dataclass(frozen=True)
class CurveRun:
    """One dataset's trade-off curves, a spec for :func:`curve_run`: its settings, longest
    first, and the profile's resolution."""

    dataset: str
    candidates: tuple[Setting, ...]
    config: PrivacyConfig


def curve_run(run: CurveRun) -> dict[str, Any]:
    """The curves of the longest of ``run.candidates`` whose tight curve keeps its resolution
    (``curve``, None when none does) and the settings passed over (``rejected``)."""
    rejected = []
    for setting in run.candidates:
        curve = _curves(setting, run.config)
        if curve["min_tight_minus_rdp"] >= -TIGHT_CHECK_TOLERANCE:
            return {"curve": curve, "rejected": rejected}
        # Both curves are valid lower bounds on the true one; a pessimistic tight curve far
        # below the RDP one has lost its resolution (seen at mu ~ 5): draw the next one.
        rejected.append({"setting": setting.name, "reason": _REJECTED})
    return {"curve": None, "rejected": rejected}


def compute(
    profile: str = "quick",
    *,
    config: PrivacyConfig | None = None,
    catalogue: Sequence[Setting] = SETTINGS,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Account for every setting and draw-ready curves; save ``bu2019_privacy.{json,csv}``.

    ``output`` (default :class:`~reproductions.harness.Output`: the repository's ``figures/``)
    receives the files; ``config`` and ``catalogue`` replace the profile and the settings.
    Each setting's row (:class:`SettingRun`) and each dataset's curves (:class:`CurveRun`) are
    independent runs of :func:`dpcore.runs.run_many`: here, one after another (``executor``
    None or ``"local"``), or at once on ``executor``, then kept in the run store
    (``<runs>/<STEM>``, keyed by :data:`CODE_MODULES`), where a later run reads them back.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    store = fanned_store(fanned, output, STEM, *CODE_MODULES)
    start = time.perf_counter()
    runs = [SettingRun(setting, config.pld_relative_tolerance) for setting in catalogue]
    rows = run_many(setting_run, runs, executor=fanned, store=store)
    curve_runs = [
        CurveRun(
            dataset,
            tuple(
                sorted(
                    (s for s in catalogue if s.dataset == dataset),
                    key=lambda s: s.steps,
                    reverse=True,
                )
            ),
            config,
        )
        for dataset in DATASETS
        if any(s.dataset == dataset for s in catalogue)
    ]
    found = run_many(curve_run, curve_runs, executor=fanned, store=store)
    extra = {
        "seed": None,
        "hardware": "CPU (numerical accounting only)",
        "runs_spread": spread(fanned),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "curves": [item["curve"] for item in found if item["curve"] is not None],
        "curves_rejected": [entry for item in found for entry in item["rejected"]],
    }
    output.save_results(STEM, config=config, rows=rows, extra=extra)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``bu2019_privacy_tradeoff.png`` (one panel per dataset) and the README table.

    Reads ``output``'s saved results (default: the repository's ``figures/``) and rewrites the
    table of ``readme`` (default: this folder's README).
    """
    output = output or Output()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(STEM)
    curves = data["curves"]
    figure, panels = plt.subplots(
        2, len(curves), figsize=(4.2 * len(curves), 8.4), squeeze=False, layout="constrained"
    )
    for column, curve in enumerate(curves):
        alpha = np.asarray(curve["alpha"])
        lines = {
            "tight (PLD)": (np.asarray(curve["tight"]), "k-"),
            f"CLT G_mu, mu = {curve['mu_clt']:.2f} (approximate)": (
                np.asarray(curve["clt"]),
                "b--",
            ),
            "implied by RDP": (np.asarray(curve["rdp_implied"]), "g:"),
        }
        top, bottom = panels[:, column]
        rdp = np.asarray(curve["rdp_implied"])
        for label, (beta, style) in lines.items():
            top.plot(alpha, beta, style, label=label)
            keep = (alpha > 0) & (1 - beta > 0)
            if style == "k-":
                # Where the pessimistic grid is looser than the RDP curve it says nothing.
                keep &= beta >= rdp
            bottom.plot(alpha[keep], 1 - beta[keep], style, label=label)
        top.plot([0, 1], [1, 0], color="0.7", lw=0.8, label="perfect privacy")
        top.set_aspect("equal")
        top.set_title(f"{curve['dataset']}: {curve['setting']}", fontsize=9)
        top.set_xlabel("type I error")
        top.legend(fontsize=7)
        bottom.set_xscale("log")
        bottom.set_yscale("log")
        bottom.set_xlabel("type I error (log)")
    panels[0, 0].set_ylabel("type II error")
    panels[1, 0].set_ylabel("power = 1 - type II error (log)")
    figure.suptitle(
        "Bu et al. 2020: trade-off curves of the longest (numerically checked) setting per "
        "dataset, paper's n and lot; bottom: log-log view of the tail, where the CLT can "
        "claim too much privacy"
    )
    figure.savefig(output.path(f"{STEM}_tradeoff.png"), dpi=150)
    plt.close(figure)
    write_readme_table(data, readme=readme)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "inf" if value is None else f"{value:.{digits}f}"


def _pair(paper: float | None, ours: float | None) -> str:
    return f"{_fmt(ours)} ({'-' if paper is None else f'{paper:g}'})"


def readme_table(data: dict[str, Any]) -> str:
    """The "paper vs ours" markdown tables, from the saved results only."""
    rows = data["rows"]
    lines = [
        f"Profile **{data['config']['profile']}**, commit `{data['commit'][:12]}`, wall time "
        f"{data['wall_time_s']:.0f} s. Ours (paper's value in brackets; - = not printed). "
        "MA (paper) = RDP on TF Privacy's orders with the classic conversion, as the paper "
        "computed its moments-accountant column; MA (dpcore) = Abadi et al.'s integer orders "
        "<= 32. **CLT understates** = eps_CLT below the certified PLD lower bound.",
        "",
        "| setting | q | T | delta | mu_CLT | eps_CLT | eps MA (paper) | eps MA (dpcore) "
        "| eps RDP | eps PLD [lower, upper] | CLT understates | not from the paper |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['name']} | {row['q']:.5f} | {row['steps']} | {row['delta']:g} "
            f"| {_pair(row['paper_mu_clt'], row['mu_clt'])} "
            f"| {_pair(row['paper_eps_clt'], row['eps_clt'])} "
            f"| {_pair(row['paper_eps_moments'], row['eps_moments_paper'])} "
            f"| {_fmt(row['eps_moments'])} | {_fmt(row['eps_rdp'])} "
            f"| [{_fmt(row['pld_lower'])}, {_fmt(row['pld_upper'])}] "
            f"| {'**yes**' if row['clt_understates'] else 'no'} | {row['assumed'] or '-'} |"
        )
    local = [row for row in rows if row.get("ours_mu_clt") is not None]
    if local:
        lines += [
            "",
            "On the data we train on (same sigma and epochs):",
            "",
            "| setting | our n | our lot | mu_CLT | eps_CLT | eps RDP | eps PLD [lower, upper] "
            "| CLT understates |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in local:
            lines.append(
                f"| {row['name']} | {row['our_n']} | {row['our_lot_size']} "
                f"| {_fmt(row['ours_mu_clt'])} | {_fmt(row['ours_eps_clt'])} "
                f"| {_fmt(row['ours_eps_rdp'])} "
                f"| [{_fmt(row['ours_pld_lower'])}, {_fmt(row['ours_pld_upper'])}] "
                f"| {'**yes**' if row['ours_clt_understates'] else 'no'} |"
            )
    return "\n".join(lines)


def write_readme_table(data: dict[str, Any], *, readme: Path | None = None) -> None:
    """Replace the table between the markers of ``readme`` (default: this folder's README; left
    alone if they are absent)."""
    write_between_markers(readme or README, TABLE_START, TABLE_END, readme_table(data))
