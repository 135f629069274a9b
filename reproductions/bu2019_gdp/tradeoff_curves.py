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

import numpy as np
from tqdm import tqdm

from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning, RdpAccountant
from dpcore.events import dpsgd_event
from dpcore.tradeoff import (
    GaussianTradeoff,
    PiecewiseLinearTradeoff,
    from_epsilon_delta_curve,
    minimum_hull,
)
from reproductions.harness import Output

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


def compute(config: TradeoffConfig = TradeoffConfig(), *, output: Output | None = None) -> None:
    """Compute the three curves per setting; save JSON + CSV to ``output`` (default: figures/)."""
    output = output or Output()
    alphas = np.unique(
        np.concatenate(
            [np.geomspace(1e-6, 1.0, config.alphas // 2), np.linspace(0.0, 1.0, config.alphas // 2)]
        )
    )
    rows = []
    summaries = []
    for setting in tqdm(config.settings, desc="Bu et al. tradeoff curves", unit="setting"):
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
        tight = _tight_curve(setting, alphas, config.grid_spacing)
        rdp = _rdp_curve(setting, alphas)
        # Where the CLT curve lies above the tight one it claims more privacy than holds.
        overstated = float(np.max(clt - tight))
        summaries.append(
            {
                "label": setting.label,
                "mu_clt": mu,
                "max_clt_minus_tight": overstated,
                "clt_understates_privacy_loss": overstated > 1e-4,
            }
        )
        for alpha, t, c, r in zip(alphas, tight, clt, rdp, strict=True):
            rows.append(
                {
                    "setting": setting.label,
                    "alpha": float(alpha),
                    "tight": float(t),
                    "clt": float(c),
                    "rdp_implied": float(r),
                }
            )
    output.save_results(STEM, config=config, rows=rows, extra={"summary": summaries})


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
