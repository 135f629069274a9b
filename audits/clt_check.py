"""CLT check: does the audit reject the CLT's mu where the CLT understates epsilon?

Setting (few steps, large sampling rate): q = 0.2, sigma = 1, T = 5, delta = 1e-5. The canary's
gradient is a unit vector in its own coordinate (the worst case for Poisson-sampled DP-SGD):
each step releases N(0, sigma^2) plus 1 when the canary is sampled. The attack scores a run by
its exact log-likelihood ratio. The threshold is chosen on a held-out fifth of the runs by the
GDP lower bound, then evaluated once on the rest:

* mu_lb > mu_CLT rejects the claim "the run is mu_CLT-GDP" at the stated confidence (under that
  claim FNR >= G_mu(FPR) would hold, so mu_lb <= mu_CLT);
* the Clopper–Pearson epsilon lower bound (valid for any mechanism) must stay below the tight
  PLD upper bound -- otherwise the accountant or the sampler is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any

import numpy as np

from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import GdpCltAccountant, PldAccountant
from dpcore.auditing import threshold_sweep_lower_bound
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "dpcore.accountants.gdp_clt",
    "dpcore.accountants.pld",
    "dpcore.auditing.statistics",
    "dpcore.events",
)


@dataclasses.dataclass(frozen=True)
class CltCheckConfig:
    """The short, heavily sampled run where the CLT is known to be off."""

    sampling_probability: float = 0.2
    noise_multiplier: float = 1.0
    steps: int = 5
    delta: float = 1e-5
    runs: int = 1_000_000
    seeds: tuple[int, ...] = (0, 1, 2)
    confidence: float = 0.95
    held_out_fraction: float = 0.2


def _scores(with_canary: bool, config: CltCheckConfig, rng: np.random.Generator) -> np.ndarray:
    """Log-likelihood ratio of each simulated run (canary sampled w.p. q at every step)."""
    q, sigma = config.sampling_probability, config.noise_multiplier
    noise = rng.normal(0.0, sigma, (config.runs, config.steps))
    if with_canary:
        noise += rng.random((config.runs, config.steps)) < q
    step_llr = np.logaddexp(np.log1p(-q), np.log(q) + (2 * noise - 1) / (2 * sigma**2))
    return np.asarray(step_llr.sum(axis=1))


@dataclasses.dataclass(frozen=True)
class CltRun:
    """One unit of the CLT check: the simulated runs of one seed, in the one setting."""

    seed: int
    sampling_probability: float
    noise_multiplier: float
    steps: int
    delta: float
    runs: int
    confidence: float
    held_out_fraction: float


@functools.cache
def _claims(q: float, sigma: float, steps: int, delta: float) -> tuple[float, float, float, float]:
    """(mu_CLT, CLT epsilon, tight PLD interval's lower and upper end) of DP-SGD(q, sigma, T)."""
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    clt = GdpCltAccountant().compose(event)
    tight = PldAccountant().compose(event).get_epsilon_interval(delta)
    return clt.mu, float(clt.get_epsilon(delta)), tight.lower, tight.upper


def execute(spec: CltRun) -> dict[str, Any]:
    """The check for one seed (generator seeded by ``spec.seed``); one result row."""
    config = CltCheckConfig(
        sampling_probability=spec.sampling_probability,
        noise_multiplier=spec.noise_multiplier,
        steps=spec.steps,
        delta=spec.delta,
        runs=spec.runs,
        seeds=(spec.seed,),
        confidence=spec.confidence,
        held_out_fraction=spec.held_out_fraction,
    )
    mu_clt, clt_epsilon, tight_lower, tight_upper = _claims(
        config.sampling_probability, config.noise_multiplier, config.steps, config.delta
    )
    start = time.perf_counter()
    rng = np.random.default_rng(spec.seed)
    negative, positive = _scores(False, config, rng), _scores(True, config, rng)
    cut = int(config.held_out_fraction * config.runs)
    # Thresholds at false-positive rates across both tails (the CLT is off where few
    # canary runs score low, i.e. at high false-positive rates).
    levels = np.concatenate([np.geomspace(2e-5, 0.5, 30), 1 - np.geomspace(2e-5, 0.5, 30)])
    grid = np.quantile(negative[:cut], 1 - levels)
    chosen = threshold_sweep_lower_bound(
        scores_negative=negative[:cut],
        scores_positive=positive[:cut],
        thresholds=grid,
        delta=config.delta,
        confidence=config.confidence,
        route="gdp",
    )
    threshold = [chosen.threshold if chosen.threshold is not None else float(grid[0])]
    gdp = threshold_sweep_lower_bound(
        scores_negative=negative[cut:],
        scores_positive=positive[cut:],
        thresholds=threshold,
        delta=config.delta,
        confidence=config.confidence,
        route="gdp",
    )
    generic = threshold_sweep_lower_bound(
        scores_negative=negative[cut:],
        scores_positive=positive[cut:],
        thresholds=threshold,
        delta=config.delta,
        confidence=config.confidence,
    )
    return {
        "audit": "clt_check",
        "setting": dataclasses.asdict(config) | {"seeds": None},
        "epsilon_lower": generic.epsilon_lower,
        "mu_lower": gdp.mu_lower,
        "mu_clt": mu_clt,
        "clt_rejected": bool(gdp.mu_lower is not None and gdp.mu_lower > mu_clt),
        "confidence": config.confidence,
        "epsilon_upper": {
            "pld": tight_upper,
            "pld_lower": tight_lower,
            "gdp_clt (approximate)": clt_epsilon,
        },
        "seed": spec.seed,
        "seconds": time.perf_counter() - start,
        "threshold": threshold[0],
    }


def specs(config: CltCheckConfig) -> list[CltRun]:
    """The check's units, one per seed, in the order of its rows."""
    return [
        CltRun(
            seed=seed,
            sampling_probability=config.sampling_probability,
            noise_multiplier=config.noise_multiplier,
            steps=config.steps,
            delta=config.delta,
            runs=config.runs,
            confidence=config.confidence,
            held_out_fraction=config.held_out_fraction,
        )
        for seed in config.seeds
    ]


def run(
    config: CltCheckConfig = CltCheckConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Run the check for every seed; save ``clt_check.json``.

    Each seed is one run of :func:`dpcore.runs.run_many`, kept in the audit's run store
    (``results/runs/clt_check``): a killed check resumes where it stopped.

    Args:
        config: the setting and the seeds.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    store = run_store("clt_check", *SOURCES)
    rows: list[dict[str, Any]] = run_many(execute, specs(config), executor=executor, store=store)
    save("clt_check", rows, dataclasses.asdict(config))
    return rows


def write_report() -> None:
    """``results/clt_check.md`` from the saved rows."""
    rows = load("clt_check")
    lines = [
        "# Audit: CLT check (q = 0.2, sigma = 1, T = 5, delta = 1e-5)",
        "",
        "| seed | mu_lb (95%) | mu_CLT | CLT rejected | ε_lb (95%, any mechanism) "
        "| ε CLT (approx.) | tight ε (PLD) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        upper = row["epsilon_upper"]
        clt_epsilon = upper["gdp_clt (approximate)"]
        lines.append(
            f"| {row['seed']} | {row['mu_lower']:.3f} | {row['mu_clt']:.3f} "
            f"| {row['clt_rejected']} | {row['epsilon_lower']:.3f} | {clt_epsilon:.3f} "
            f"| [{upper['pld_lower']:.3f}, {upper['pld']:.3f}] |"
        )
    (RESULTS / "clt_check.md").write_text("\n".join(lines) + "\n")
