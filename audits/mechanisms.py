"""Mechanism audits: Gaussian and Laplace releases of dpcore, 10^6 samples per side.

For each target epsilon (delta = 1e-5) the noise is calibrated exactly (analytic Gaussian;
Laplace scale 1/epsilon), D and D' differ by the full sensitivity, and the audit distinguishes
the two release distributions. The Gaussian audit chooses its threshold on a held-out fifth of
the samples and bounds epsilon on the rest by the GDP route (Nasr et al. 2023); the Laplace
audit uses the test "release > sensitivity", fixed before sampling (it is the optimal test).
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from typing import Any

import numpy as np
from scipy import optimize

from audits.results_io import run_store, save
from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.auditing import threshold_sweep_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.events import GaussianEvent, LaplaceEvent
from dpcore.mechanisms.gaussian import gdp_delta
from dpcore.mechanisms.noise import gaussian_release, laplace_release
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "dpcore.accountants.pld",
    "dpcore.accountants.rdp",
    "dpcore.auditing.statistics",
    "dpcore.mechanisms.gaussian",
    "dpcore.mechanisms.noise",
)


@dataclasses.dataclass(frozen=True)
class MechanismAuditConfig:
    """Targets and sample sizes of the mechanism audits."""

    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    delta: float = 1e-5
    samples: int = 1_000_000
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    confidence: float = 0.95
    held_out_fraction: float = 0.2


def _sigma_for(epsilon: float, delta: float) -> float:
    """Noise multiplier whose exact Gaussian epsilon at ``delta`` is ``epsilon``."""
    return float(
        optimize.brentq(
            lambda s: gdp_delta(mu=1 / s, epsilon=epsilon) - delta, 1e-3, 1e3, xtol=1e-12
        )
    )


def _upper_bounds(event: Any, delta: float) -> dict[str, float]:
    """Every applicable accountant's epsilon for one release."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)  # pure-DP-like curves sit at the edge
        rdp = float(RdpAccountant().compose(event).get_epsilon(delta))
    return {"rdp": rdp, "pld": PldAccountant().compose(event).get_epsilon(delta)}


def _held_out_threshold(
    negative: np.ndarray, positive: np.ndarray, grid: np.ndarray, delta: float, confidence: float
) -> float:
    """The threshold whose GDP lower bound is largest on the held-out samples.

    Maximising the *bound* rather than the point estimate prefers thresholds whose rates are
    well estimated; the chosen threshold is then evaluated once on fresh samples.
    """
    best, best_bound = float(grid[0]), -1.0
    for threshold in grid:
        bound = threshold_sweep_lower_bound(
            scores_negative=negative,
            scores_positive=positive,
            thresholds=[threshold],
            delta=delta,
            confidence=confidence,
            route="gdp",
        )
        if bound.mu_lower is not None and bound.mu_lower > best_bound:
            best, best_bound = float(threshold), bound.mu_lower
    return best


@dataclasses.dataclass(frozen=True)
class MechanismRun:
    """One unit of the mechanism audit: one mechanism at one target epsilon and seed."""

    mechanism: str  # "gaussian" or "laplace"
    epsilon: float
    seed: int
    delta: float
    samples: int
    confidence: float
    held_out_fraction: float


def execute(spec: MechanismRun) -> dict[str, Any]:
    """Audit one release (``spec.samples`` per side, generator seeded by ``spec.seed``); one row.

    Raises:
        InvalidParameterError: ``spec.mechanism`` is neither ``"gaussian"`` nor ``"laplace"``.
    """
    if spec.mechanism not in ("gaussian", "laplace"):
        raise InvalidParameterError("mechanism", "'gaussian' or 'laplace'", spec.mechanism)
    start = time.perf_counter()
    epsilon, rng = spec.epsilon, np.random.default_rng(spec.seed)
    if spec.mechanism == "gaussian":
        sigma = _sigma_for(epsilon, spec.delta)
        negative = gaussian_release(0.0, noise_multiplier=sigma, size=spec.samples, rng=rng)
        positive = gaussian_release(1.0, noise_multiplier=sigma, size=spec.samples, rng=rng)
        cut = int(spec.held_out_fraction * spec.samples)
        grid = np.linspace(-2 * sigma, 1 + 4 * sigma, 61)
        # Choose the threshold on the held-out part, bound on the rest (no selection bias).
        threshold = _held_out_threshold(
            negative[:cut], positive[:cut], grid, spec.delta, spec.confidence
        )
        bound = threshold_sweep_lower_bound(
            scores_negative=negative[cut:],
            scores_positive=positive[cut:],
            thresholds=[threshold],
            delta=spec.delta,
            confidence=spec.confidence,
            route="gdp",
        )
        event: Any = GaussianEvent(sigma)
        setting = {"mechanism": "gaussian", "target_epsilon": epsilon, "noise_multiplier": sigma}
        uppers = {**_upper_bounds(event, spec.delta), "gdp_exact": epsilon}
    else:
        negative = laplace_release(0.0, noise_multiplier=1 / epsilon, size=spec.samples, rng=rng)
        positive = laplace_release(1.0, noise_multiplier=1 / epsilon, size=spec.samples, rng=rng)
        bound = threshold_sweep_lower_bound(
            scores_negative=negative,
            scores_positive=positive,
            thresholds=[1.0],
            delta=spec.delta,
            confidence=spec.confidence,
        )
        event = LaplaceEvent(1 / epsilon)
        setting = {
            "mechanism": "laplace",
            "target_epsilon": epsilon,
            "noise_multiplier": 1 / epsilon,
        }
        uppers = {**_upper_bounds(event, spec.delta), "pure": epsilon}
    return {
        "audit": "mechanisms",
        "setting": setting,
        "epsilon_lower": bound.epsilon_lower,
        "confidence": bound.confidence,
        "epsilon_upper": uppers,
        "seed": spec.seed,
        "seconds": time.perf_counter() - start,
        "threshold": bound.threshold,
    }


def specs(config: MechanismAuditConfig) -> list[MechanismRun]:
    """The audit's units, in the order of its rows: mechanism, then target, then seed."""
    return [
        MechanismRun(
            mechanism=kind,
            epsilon=epsilon,
            seed=seed,
            delta=config.delta,
            samples=config.samples,
            confidence=config.confidence,
            held_out_fraction=config.held_out_fraction,
        )
        for kind in ("gaussian", "laplace")
        for epsilon in config.epsilons
        for seed in config.seeds
    ]


def run(
    config: MechanismAuditConfig = MechanismAuditConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit both mechanisms at every target and seed; save ``mechanisms.json``.

    Each (mechanism, target, seed) is one run of :func:`dpcore.runs.run_many`, kept in the
    audit's run store (``results/runs/mechanisms``): a killed audit resumes where it stopped.

    Args:
        config: the targets, seeds and sample sizes.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    store = run_store("mechanisms", *SOURCES)
    rows: list[dict[str, Any]] = run_many(execute, specs(config), executor=executor, store=store)
    save("mechanisms", rows, dataclasses.asdict(config))
    return rows
