"""Sampler audit: is the sampler that dpcore trains with the Poisson sampler the accountant assumes?

The per-step white-box audits (:mod:`audits.dpsgd_whitebox`, :mod:`audits.planted_bugs`) trust the
sampler, so "shuffled fixed-size batches reported as Poisson" (Chua, Ghazi, Kamath, Kumar,
Manurangsi, Sinha, Zhang 2024, "How Private are DP-SGD Implementations?", arXiv 2403.17673)
passes them. This audit looks at the sampler's output instead (white-box over the sampler): one
canary record, and its number of inclusions c_e in each epoch e of k = round(1 / q) lots.

Under the claimed Poisson sampling each lot includes the record independently with probability
q, so c_1, ..., c_E are i.i.d. Bin(k, q): an epoch has exactly one inclusion with probability

    p_1 = k q (1 - q)^(k - 1)        (0.387 for q = 0.1),

and ``ones = #{e : c_e = 1} ~ Bin(E, p_1)``. A shuffled fixed-size sampler includes every record
exactly once per epoch (``ones = E``). An exact two-sided binomial test of ``ones`` against
Bin(E, p_1) gives a p-value; the sampler is flagged when p < 1 - confidence (a correct Poisson
sampler is then flagged with probability <= 5%). The test does not give an epsilon lower bound:
per-epoch epsilon lower bounds for the shuffled sampler above the Poisson claim need epochs of
many steps and e^eps-many trials (Chua et al. 2024, Sec. 4), beyond a quick profile.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
from scipy import stats

from audits.canaries import SamplerFactory, poisson_sampler, shuffled_sampler
from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import PldAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many


@dataclasses.dataclass(frozen=True)
class SamplerAuditConfig:
    """The sampler setting audited (quick profile by default)."""

    dataset_size: int = 100
    sampling_probability: float = 0.1
    epochs: int = 200
    canary: int = 0
    noise_multiplier: float = 1.0
    delta: float = 1e-5
    confidence: float = 0.95
    seeds: tuple[int, ...] = (0, 1, 2)


#: the samplers this audit compares
SAMPLERS: dict[str, SamplerFactory] = {"poisson": poisson_sampler, "shuffled": shuffled_sampler}

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "audits.canaries",
    "dpcore.accountants.pld",
    "dpcore.torch.samplers",
)


def make_sampler(kind: str, config: SamplerAuditConfig, seed: int) -> Any:
    """dpcore's ``PoissonSampler`` or ``ShuffledBatchSampler`` (batch round(q N), warning off)."""
    return SAMPLERS[kind](config.dataset_size, config.sampling_probability, seed)


def inclusion_counts(sampler: Any, config: SamplerAuditConfig) -> np.ndarray:
    """c_e: how many of epoch e's k = round(1 / q) lots contain the canary record."""
    k = max(1, round(1 / config.sampling_probability))
    counts = np.zeros(config.epochs, dtype=int)
    for epoch in range(config.epochs):
        for _ in range(k):
            counts[epoch] += int(bool((sampler.sample() == config.canary).any()))
    return counts


def poisson_test(counts: np.ndarray, sampling_probability: float) -> tuple[float, float]:
    """(p-value, p_1): exact two-sided binomial test of #{c_e = 1} against Bin(E, p_1)."""
    k = max(1, round(1 / sampling_probability))
    q = sampling_probability
    p_one = k * q * (1 - q) ** (k - 1)
    ones = int(np.sum(counts == 1))
    return float(stats.binomtest(ones, counts.size, p_one).pvalue), p_one


def audit_one(kind: str, config: SamplerAuditConfig, seed: int) -> dict[str, Any]:
    """One result row for one sampler and seed."""
    start = time.perf_counter()
    counts = inclusion_counts(make_sampler(kind, config, seed), config)
    p_value, p_one = poisson_test(counts, config.sampling_probability)
    k = max(1, round(1 / config.sampling_probability))
    event = dpsgd_event(
        sampling_probability=config.sampling_probability,
        noise_multiplier=config.noise_multiplier,
        steps=k,
    )
    claimed = PldAccountant().compose(event).get_epsilon_interval(config.delta)
    return {
        "audit": "sampler_audit",
        "setting": {
            "sampler": kind,
            "dataset_size": config.dataset_size,
            "sampling_probability": config.sampling_probability,
            "steps_per_epoch": k,
            "epochs": config.epochs,
            "noise_multiplier": config.noise_multiplier,
            "delta": config.delta,
        },
        # A hypothesis test, not an epsilon bound (see the module docstring).
        "epsilon_lower": None,
        "confidence": config.confidence,
        "epsilon_upper": {"pld (claimed, one epoch)": claimed.upper},
        "p_value": p_value,
        "flagged": bool(p_value < 1 - config.confidence),
        "epochs_with_one_inclusion": int(np.sum(counts == 1)),
        "expected_under_poisson": p_one * config.epochs,
        "inclusion_histogram": np.bincount(counts, minlength=4).tolist(),
        "seed": seed,
        "seconds": time.perf_counter() - start,
    }


@dataclasses.dataclass(frozen=True)
class SamplerRun:
    """One unit of the sampler audit: one sampler and seed in one setting."""

    sampler: str  # a key of SAMPLERS
    seed: int
    dataset_size: int
    sampling_probability: float
    epochs: int
    canary: int
    noise_multiplier: float
    delta: float
    confidence: float


def execute(spec: SamplerRun) -> dict[str, Any]:
    """:func:`audit_one` for the spec's sampler and seed.

    Raises:
        InvalidParameterError: ``spec.sampler`` is not a key of :data:`SAMPLERS`.
    """
    if spec.sampler not in SAMPLERS:
        raise InvalidParameterError("sampler", f"one of {sorted(SAMPLERS)}", spec.sampler)
    config = SamplerAuditConfig(
        dataset_size=spec.dataset_size,
        sampling_probability=spec.sampling_probability,
        epochs=spec.epochs,
        canary=spec.canary,
        noise_multiplier=spec.noise_multiplier,
        delta=spec.delta,
        confidence=spec.confidence,
        seeds=(spec.seed,),
    )
    return audit_one(spec.sampler, config, spec.seed)


def specs(config: SamplerAuditConfig) -> list[SamplerRun]:
    """The audit's units in the order of its rows: Poisson's seeds, then the shuffled ones."""
    return [
        SamplerRun(
            sampler=kind,
            seed=seed,
            dataset_size=config.dataset_size,
            sampling_probability=config.sampling_probability,
            epochs=config.epochs,
            canary=config.canary,
            noise_multiplier=config.noise_multiplier,
            delta=config.delta,
            confidence=config.confidence,
        )
        for kind in ("poisson", "shuffled")
        for seed in config.seeds
    ]


def run(
    config: SamplerAuditConfig = SamplerAuditConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit dpcore's Poisson and shuffled samplers; save ``sampler_audit.json``.

    Each (sampler, seed) is one run of :func:`dpcore.runs.run_many`, kept in the audit's run
    store (``results/runs/sampler_audit``): a killed audit resumes where it stopped.

    Args:
        config: the setting and the seeds.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    store = run_store("sampler_audit", *SOURCES)
    rows: list[dict[str, Any]] = run_many(execute, specs(config), executor=executor, store=store)
    save("sampler_audit", rows, dataclasses.asdict(config))
    return rows


def write_report() -> None:
    """``results/sampler_audit.md`` and ``.png`` from the saved rows."""
    rows = load("sampler_audit")
    first = rows[0]["setting"]
    lines = [
        "# Audit: the sampler (shuffled fixed-size batches reported as Poisson, Chua et al. 2024)",
        "",
        f"N = {first['dataset_size']}, q = {first['sampling_probability']:g}, k = "
        f"{first['steps_per_epoch']} lots per epoch, {first['epochs']} epochs; one canary "
        "record's inclusions per epoch, exact binomial test of #{epochs with exactly one "
        "inclusion} against the Poisson law Bin(E, k q (1 - q)^(k - 1)). Flagged: p < 0.05.",
        "",
        "| sampler | epochs with 1 inclusion | expected (Poisson) | inclusions histogram 0/1/2/3+ "
        "| p-value | flagged | claimed ε per epoch (PLD) | seed | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, hist = row["setting"], row["inclusion_histogram"]
        shown = [*hist[:3], sum(hist[3:])]
        lines.append(
            f"| {s['sampler']} | {row['epochs_with_one_inclusion']} "
            f"| {row['expected_under_poisson']:.1f} | {'/'.join(map(str, shown))} "
            f"| {row['p_value']:.3g} | {row['flagged']} "
            f"| {row['epsilon_upper']['pld (claimed, one epoch)']:.3f} | {row['seed']} "
            f"| {row['seconds']:.2f} |"
        )
    (RESULTS / "sampler_audit.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    width = 0.4
    for offset, kind in ((-width / 2, "poisson"), (width / 2, "shuffled")):
        row = next(r for r in rows if r["setting"]["sampler"] == kind)
        hist = row["inclusion_histogram"]
        shown = [*hist[:3], sum(hist[3:])]
        axes.bar(np.arange(4) + offset, shown, width, label=f"{kind} (seed {row['seed']})")
    k, q = first["steps_per_epoch"], first["sampling_probability"]
    expected = [first["epochs"] * stats.binom.pmf(c, k, q) for c in range(3)]
    expected.append(first["epochs"] * stats.binom.sf(2, k, q))
    axes.plot(np.arange(4), expected, "k_", markersize=20, label="Poisson: expected")
    axes.set_xticks(range(4), ["0", "1", "2", "3+"])
    axes.set_xlabel("canary inclusions in an epoch")
    axes.set_ylabel("epochs")
    axes.set_title("Sampler audit: inclusions per epoch")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "sampler_audit.png", dpi=150)
    plt.close(figure)
