"""Audit of objective perturbation on the lecture's median example: D = {0, 100} vs {0, 101}.

Naive variant (absolute loss, lambda = 0, noise as if CMS Alg. 2 applied): the test "output is
101" never fires on D and fires with probability P[-2 < b < 0] = (1 - e^{-eps})/2 on D', so the
Clopper-Pearson lower bound on epsilon grows with the number of trials, whatever the claimed
epsilon. Correct variant (Huber-smoothed loss, lambda > 0, CMS Alg. 2's split): the best of a few
thresholds fixed in advance (Bonferroni-paid) gives a bound at or below the claimed epsilon.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpcore.auditing.statistics import epsilon_lower_bound, threshold_sweep_lower_bound
from dpcore.erm.median import naive_median_release, smooth_median_release
from dpcore.runs import run_many
from reproductions.common import profile_config
from reproductions.harness import Executor, Output, fanned_store, fanning_out, spread

STEM = "erm_median_audit"


@dataclasses.dataclass(frozen=True)
class MedianAuditConfig:
    """Trials per dataset, claimed epsilons and the correct variant's parameters."""

    profile: str = "quick"
    trials: int = 100_000
    epsilons: tuple[float, ...] = (0.1, 0.5, 1.0, 2.0, 5.0)
    dataset: tuple[float, ...] = (0.0, 100.0)
    neighbour: tuple[float, ...] = (0.0, 101.0)
    delta: float = 1e-6
    confidence: float = 0.95
    domain_radius: float = 1000.0
    regularisation: float = 0.01
    huber_width: float = 50.0
    thresholds: tuple[float, ...] = (-100.0, 0.0, 50.0, 100.0, 100.5, 101.0, 150.0)
    seed: int = 2011


PROFILES = {
    "quick": MedianAuditConfig(),
    "full": MedianAuditConfig(profile="full", trials=2_000_000),
}


#: The code the rows depend on: a change here computes them afresh in the run store.
CODE_MODULES = ("dpcore.erm", "dpcore.auditing", __name__)


def audit_rows(config: MedianAuditConfig) -> list[dict[str, Any]]:
    """Both variants at every claimed epsilon of ``config``: one run (its trials all draw from
    one generator seeded by ``config.seed``, so the epsilons are not independent runs)."""
    rng = np.random.default_rng(config.seed)
    rows = []
    for epsilon in config.epsilons:
        naive_d = naive_median_release(
            config.dataset,
            epsilon=epsilon,
            domain_radius=config.domain_radius,
            rng=rng,
            size=config.trials,
        )
        naive_d2 = naive_median_release(
            config.neighbour,
            epsilon=epsilon,
            domain_radius=config.domain_radius,
            rng=rng,
            size=config.trials,
        )
        marker = config.neighbour[-1]
        false_positives = int(np.sum(naive_d == marker))
        true_positives = int(np.sum(naive_d2 == marker))
        naive = epsilon_lower_bound(
            false_positives=false_positives,
            negatives=config.trials,
            false_negatives=config.trials - true_positives,
            positives=config.trials,
            delta=config.delta,
            confidence=config.confidence,
        )
        options = {
            "epsilon": epsilon,
            "regularisation": config.regularisation,
            "huber_width": config.huber_width,
            "rng": rng,
            "size": config.trials,
        }
        smooth = threshold_sweep_lower_bound(
            scores_negative=smooth_median_release(config.dataset, **options),
            scores_positive=smooth_median_release(config.neighbour, **options),
            thresholds=config.thresholds,
            delta=config.delta,
            confidence=config.confidence,
        )
        rows.append(
            {
                "claimed_epsilon": epsilon,
                "naive_false_positive_rate": false_positives / config.trials,
                "naive_true_positive_rate": true_positives / config.trials,
                "naive_predicted_tpr": 0.5 * (1 - float(np.exp(-epsilon))),
                "naive_epsilon_lower": naive.epsilon_lower,
                "correct_epsilon_lower": smooth.epsilon_lower,
                "correct_threshold": smooth.threshold,
            }
        )
    return rows


def compute(
    profile: str = "quick",
    *,
    config: MedianAuditConfig | None = None,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Run both variants at every claimed epsilon; save the audit bounds to ``output`` (default:
    figures/).

    The audit is one run (:func:`audit_rows`) through :func:`dpcore.runs.run_many`: here
    (``executor`` None or ``"local"``), or on ``executor``, its rows then kept in the run store
    (``<runs>/<STEM>``, keyed by :data:`CODE_MODULES`), where a later run reads them back.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: the run still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    store = fanned_store(fanned, output, STEM, *CODE_MODULES)
    (rows,) = run_many(audit_rows, [config], executor=fanned, store=store, progress=False)
    output.save_results(STEM, config=config, rows=rows, extra={"runs_spread": spread(fanned)})


def plot(*, output: Output | None = None) -> None:
    """Draw ``erm_median_audit.png`` from the results saved in ``output`` (default: figures/)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = output or Output()
    data = output.load_results(STEM)
    rows, config = data["rows"], data["config"]
    claimed = [row["claimed_epsilon"] for row in rows]
    figure, axes = plt.subplots(figsize=(5.5, 4))
    axes.plot(claimed, claimed, "k--", label="claimed epsilon (no violation below)")
    axes.plot(
        claimed,
        [row["naive_epsilon_lower"] for row in rows],
        "o-",
        color="tab:red",
        label="naive (|w - x|, lambda = 0): epsilon_lb",
    )
    axes.plot(
        claimed,
        [row["correct_epsilon_lower"] for row in rows],
        "s-",
        color="tab:green",
        label="CMS Alg. 2 (Huber, lambda > 0): epsilon_lb",
    )
    axes.set_xscale("log")
    axes.set_xlabel("claimed epsilon")
    axes.set_ylabel(
        f"audit lower bound ({config['confidence']:.0%} conf., delta={config['delta']:g})"
    )
    axes.set_title(f"median example, D={{0,100}} vs {{0,101}}, {config['trials']:,} trials each")
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output.path(f"{STEM}.png"), dpi=150)
    plt.close(figure)
