"""Tradeoff curves of DP-SGD: tight numerical composition vs the CLT's G_mu vs RDP's curve.

Two settings: the paper's MNIST run (sigma = 1.3, lot 256 of 60,000, 15 epochs; Bu et al. 2019,
Sec. 5, where the CLT is accurate) and a short run with a large sampling rate, where the CLT's
G_mu lies *above* the tight curve, i.e. it understates the privacy loss (it is an approximation,
not a bound). :func:`compute` saves the curves; :func:`plot` draws only from the saved file.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import numpy as np

from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning, RdpAccountant
from dpcore.events import dpsgd_event
from dpcore.runs import run_many
from dpcore.tradeoff import (
    GaussianTradeoff,
    PiecewiseLinearTradeoff,
    from_epsilon_delta_curve,
    minimum_hull,
)
from reproductions.harness import Executor, Output, fanned_store, fanning_out, spread

STEM = "bu2019_tradeoff_curves"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One DP-SGD run: Poisson rate, noise multiplier, steps."""

    label: str
    sampling_probability: float
    noise_multiplier: float
    steps: int


@dataclasses.dataclass(frozen=True)
class TradeoffConfig:
    """The settings drawn and the resolution of the curves."""

    settings: tuple[Setting, ...] = (
        Setting(
            "MNIST (Bu et al. 2019): sigma 1.3, lot 256/60000, 15 epochs",
            256 / 60_000,
            1.3,
            math.ceil(15 * 60_000 / 256),
        ),
        Setting("short run: sigma 1, q 0.05, 100 steps", 0.05, 1.0, 100),
    )
    alphas: int = 400
    grid_spacing: float = 2e-4


def _tight_curve(setting: Setting, alphas: np.ndarray, spacing: float) -> np.ndarray:
    """Lower envelope of the remove and add tradeoff curves of the pessimistic composed PLDs."""
    accountant = PldAccountant(value_discretization_interval=spacing).compose(
        dpsgd_event(
            sampling_probability=setting.sampling_probability,
            noise_multiplier=setting.noise_multiplier,
            steps=setting.steps,
        )
    )
    remove, add = (
        PiecewiseLinearTradeoff.from_points(*upper.tradeoff_vertices())
        for upper, _ in accountant.composed_pmfs(spacing)
    )
    # Under add/remove both pairs occur; the guarantee is the hull of their minimum.
    return np.asarray(minimum_hull(remove, add)(alphas))


def _rdp_curve(setting: Setting, alphas: np.ndarray) -> np.ndarray:
    accountant = RdpAccountant().compose(
        dpsgd_event(
            sampling_probability=setting.sampling_probability,
            noise_multiplier=setting.noise_multiplier,
            steps=setting.steps,
        )
    )
    deltas = np.geomspace(1e-12, 0.9, 200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)  # the bound stays valid
        epsilons = np.array([accountant.get_epsilon(float(d)) for d in deltas])
    return np.asarray(from_epsilon_delta_curve(epsilons, deltas)(alphas))


@dataclasses.dataclass(frozen=True)
class CurveRun:
    """One setting's three curves, a spec for :func:`curve_run`."""

    setting: Setting
    alphas: int
    grid_spacing: float


def curve_run(run: CurveRun) -> dict[str, Any]:
    """The tight, CLT and RDP-implied curves of ``run.setting`` on ``run.alphas`` type-I errors
    (``rows``) and how far the CLT's lies above the tight one (``summary``)."""
    setting = run.setting
    alphas = np.unique(
        np.concatenate(
            [np.geomspace(1e-6, 1.0, run.alphas // 2), np.linspace(0.0, 1.0, run.alphas // 2)]
        )
    )
    mu = (
        GdpCltAccountant()
        .compose(
            dpsgd_event(
                sampling_probability=setting.sampling_probability,
                noise_multiplier=setting.noise_multiplier,
                steps=setting.steps,
            )
        )
        .mu
    )
    clt = GaussianTradeoff(mu)(alphas)
    tight = _tight_curve(setting, alphas, run.grid_spacing)
    rdp = _rdp_curve(setting, alphas)
    # Where the CLT curve lies above the tight one it claims more privacy than holds.
    overstated = float(np.max(clt - tight))
    summary = {
        "label": setting.label,
        "mu_clt": float(mu),
        "max_clt_minus_tight": overstated,
        "clt_understates_privacy_loss": overstated > 1e-4,
    }
    rows = [
        {
            "setting": setting.label,
            "alpha": float(alpha),
            "tight": float(t),
            "clt": float(c),
            "rdp_implied": float(r),
        }
        for alpha, t, c, r in zip(alphas, tight, clt, rdp, strict=True)
    ]
    return {"summary": summary, "rows": rows}


#: The code the curves depend on: a change here computes them afresh in the run store.
CODE_MODULES = ("dpcore.accountants", "dpcore.pld", "dpcore.events", "dpcore.tradeoff", __name__)


def compute(
    config: TradeoffConfig = TradeoffConfig(),
    *,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Compute the three curves per setting; save JSON + CSV to ``output`` (default: figures/).

    Each setting's curves (:class:`CurveRun`, independent) are a run of
    :func:`dpcore.runs.run_many`: here, one after another (``executor`` None or ``"local"``), or
    at once on ``executor``, then kept in the run store (``<runs>/<STEM>``, keyed by
    :data:`CODE_MODULES`), where a later run reads them back.

    Raises:
        InvalidParameterError: ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    fanned = fanning_out(executor)
    output = output or Output()
    store = fanned_store(fanned, output, STEM, *CODE_MODULES)
    runs = [CurveRun(setting, config.alphas, config.grid_spacing) for setting in config.settings]
    curves = run_many(curve_run, runs, executor=fanned, store=store)
    rows = [row for curve in curves for row in curve["rows"]]
    extra = {"summary": [curve["summary"] for curve in curves], "runs_spread": spread(fanned)}
    output.save_results(STEM, config=config, rows=rows, extra=extra)


def plot(*, output: Output | None = None) -> None:
    """Draw ``<STEM>.png`` from the results saved in ``output`` (default: figures/)."""
    output = output or Output()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(STEM)
    labels = [summary["label"] for summary in data["summary"]]
    figure, panels = plt.subplots(1, len(labels), figsize=(5 * len(labels), 4.5))
    for axes, summary in zip(np.atleast_1d(panels), data["summary"], strict=True):
        rows = [row for row in data["rows"] if row["setting"] == summary["label"]]
        alpha = [row["alpha"] for row in rows]
        axes.plot(
            alpha, [row["tight"] for row in rows], "k-", label="tight (numerical composition)"
        )
        axes.plot(
            alpha,
            [row["clt"] for row in rows],
            "b--",
            label=f"CLT G_mu, mu = {summary['mu_clt']:.3f} (approximate)",
        )
        axes.plot(alpha, [row["rdp_implied"] for row in rows], "g:", label="implied by RDP")
        axes.plot([0, 1], [1, 0], color="0.7", lw=0.8, label="perfect privacy")
        axes.set_xlabel("type I error")
        axes.set_ylabel("type II error")
        axes.set_title(summary["label"], fontsize=9)
        axes.set_aspect("equal")
        axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(output.path(f"{STEM}.png"), dpi=150)
    plt.close(figure)
