"""Planted bugs: mutation testing of the white-box DP-SGD audit (:mod:`audits.dpsgd_whitebox`).

Each mutant replaces one part of dpcore's DP-SGD *inside this module only* (dpcore itself is
untouched) while still claiming the epsilon that the PLD accountant gives for the correct
algorithm. The per-step white-box audit (Nasr et al. 2023, arXiv 2302.07956) is run on each,
and on the correct implementation, in one tiny-data setting (N = 20, q = 0.2, so realised lot
sizes vary a lot). A mutant is *flagged* when epsilon_lb > claimed epsilon, where epsilon_lb is
a 95% lower bound (each row's bound fails with probability <= 5%).

Mutants:

1. ``halved noise``: the noise standard deviation is sigma C / 2 (claim: sigma C).
2. ``no clipping``: examples (and the 4C Dirac canary) are not clipped; noise is still sigma C.
3. ``realised lot size``: the noisy sum is divided by the realised lot size |L| rather than
   q N. The canary's influence becomes C / |L| and the noise scale sigma C / |L| reveals |L|.
4. ``shuffled as Poisson``: fixed-size shuffled batches while the accountant assumes Poisson.
5. ``noise per worker``: k = 4 data-parallel workers each draw N(0, sigma^2 C^2) and the
   all-reduce averages the noises (while summing the gradients): effective sigma / sqrt(k).

The per-step audit composes the per-step Gaussian with the *claimed* Poisson sampling, so it
cannot see mutant 4 (the canary is in every step of the "in" world); it is reported, not hidden.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import torch
from torch import nn

from audits import dpsgd_whitebox
from audits.canaries import shuffled_sampler
from audits.dpsgd_whitebox import (
    Implementation,
    TrainingRun,
    WhiteboxConfig,
    audit_rows,
    calibrated_sigma,
    train,
)
from audits.results_io import RESULTS, load, run_store, save
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import ClippedBatch, LossFunction
from dpcore.torch.per_example.fast import FastEngine

#: Data-parallel workers of the per-worker-noise mutant.
WORKERS = 4


class HalvedNoiseOptimizer(DPOptimizer):
    """Mutant 1: noise standard deviation sigma C / 2."""

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.engine.max_grad_norm / 2


class RealisedLotSizeOptimizer(DPOptimizer):
    """Mutant 3: divides the noisy sum by the realised lot size (at least 1), not q N."""

    def privatise(self, clipped: ClippedBatch) -> list[torch.Tensor]:
        realised = max(1, int(clipped.clip_factors.numel()))
        return [g * self.expected_batch_size / realised for g in super().privatise(clipped)]


class PerWorkerNoiseOptimizer(DPOptimizer):
    """Mutant 5: each of k workers adds N(0, sigma^2 C^2); the all-reduce averages the noises."""

    def privatise(self, clipped: ClippedBatch) -> list[torch.Tensor]:
        noisy = []
        for parameter, summed in zip(self.engine.parameters, clipped.summed, strict=True):
            noise = sum(
                self.noise.standard_normal(
                    parameter.shape, dtype=parameter.dtype, device=parameter.device
                )
                for _ in range(WORKERS)
            )
            noisy.append(
                (summed.detach() + self.noise_std * noise / WORKERS) / self.expected_batch_size
            )
        return noisy


class UnclippedEngine(FastEngine):
    """Mutant 2: clips at 1e12 (never) while it computes, but reports C, so the noise assumes C."""

    def _clipped_sum(
        self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFunction
    ) -> ClippedBatch:
        claimed, self.max_grad_norm = self.max_grad_norm, 1e12
        try:
            return super()._clipped_sum(inputs, targets, loss_fn)
        finally:
            self.max_grad_norm = claimed


def _unclipped_engine(model: nn.Module, c: float) -> Any:
    return UnclippedEngine(model, max_grad_norm=c)


IMPLEMENTATIONS: tuple[Implementation, ...] = (
    Implementation(),
    Implementation(name="halved noise", optimizer=HalvedNoiseOptimizer),
    Implementation(name="no clipping", engine=_unclipped_engine, clip_canary=False),
    Implementation(name="realised lot size", optimizer=RealisedLotSizeOptimizer),
    Implementation(name="shuffled as Poisson", sampler=shuffled_sampler),
    Implementation(name="noise per worker", optimizer=PerWorkerNoiseOptimizer),
)

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (sys.modules[__name__], *dpsgd_whitebox.SOURCES)


@dataclasses.dataclass(frozen=True)
class PlantedBugsConfig:
    """The tiny-data setting every implementation is audited in."""

    target_epsilon: float = 4.0
    audit: WhiteboxConfig = dataclasses.field(
        default_factory=lambda: WhiteboxConfig(
            dataset_size=20, sampling_probability=0.2, steps=500, runs=16, learning_rate=0.1
        )
    )
    seeds: tuple[int, ...] = (0,)


def execute(spec: TrainingRun) -> dict[str, Any]:
    """:func:`~audits.dpsgd_whitebox.train` the implementation that ``spec`` names.

    Raises:
        InvalidParameterError: ``spec.implementation`` names none of :data:`IMPLEMENTATIONS`.
    """
    by_name = {implementation.name: implementation for implementation in IMPLEMENTATIONS}
    if spec.implementation not in by_name:
        raise InvalidParameterError(
            "implementation", f"one of {sorted(by_name)}", spec.implementation
        )
    return train(by_name[spec.implementation], spec)


def run(
    config: PlantedBugsConfig = PlantedBugsConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit the correct implementation and every mutant; save ``planted_bugs.json``.

    Each training run (``config.audit.runs`` per world, per implementation and seed) is one run
    of :func:`dpcore.runs.run_many` (one torch thread each), kept in the audit's run store
    (``results/runs/planted_bugs``): a killed audit resumes where it stopped. The per-step
    tests run here, from the stored scores.

    Args:
        config: the claim, the tiny-data setting and the seeds.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    audit = config.audit
    sigma = calibrated_sigma(
        config.target_epsilon, audit.delta, audit.sampling_probability, audit.steps
    )
    keys = [(i.name, sigma, seed) for i in IMPLEMENTATIONS for seed in config.seeds]
    store = run_store("planted_bugs", *SOURCES)
    summaries = audit_rows(execute, keys, audit, executor=executor, store=store)
    rows = []
    for (name, _, _), row in zip(keys, summaries, strict=True):
        setting = {
            "implementation": name,
            "target_epsilon": config.target_epsilon,
            "noise_multiplier": sigma,
            "sampling_probability": audit.sampling_probability,
            "steps": audit.steps,
            "dataset_size": audit.dataset_size,
            "runs_per_world": audit.runs,
            "delta": audit.delta,
        }
        row["flagged"] = bool(row["epsilon_lower"] > config.target_epsilon)
        rows.append({"audit": "planted_bugs", "setting": setting, **row})
    save("planted_bugs", rows, dataclasses.asdict(config))
    return rows


def write_report() -> None:
    """``results/planted_bugs.md`` and ``.png`` from the saved rows."""
    rows = load("planted_bugs")
    first = rows[0]["setting"]
    bugs = [r for r in rows if r["setting"]["implementation"] != Implementation().name]
    caught = sum(r["flagged"] for r in bugs)
    lines = [
        "# Audit: planted bugs (mutation testing of the white-box DP-SGD audit)",
        "",
        f"Setting: N = {first['dataset_size']}, q = {first['sampling_probability']:g}, "
        f"T = {first['steps']}, sigma = {first['noise_multiplier']:.4f} (PLD-calibrated for "
        f"ε = {first['target_epsilon']:g}, δ = {first['delta']:g}), "
        f"{first['runs_per_world']} runs per world. Flagged: ε_lb (95%) > claimed ε.",
        "",
        "| implementation | claimed ε | μ_lb (claim 1/sigma) | ε_lb (95%) | flagged | RDP ε "
        "| PLD ε interval | CLT ε (approx.) | seed | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, u = row["setting"], row["epsilon_upper"]
        lines.append(
            f"| {s['implementation']} | {s['target_epsilon']:g} "
            f"| {row['mu_lower']:.3f} ({row['mu_claimed']:.3f}) | {row['epsilon_lower']:.3f} "
            f"| {row['flagged']} | {u['rdp']:.3f} | [{u['pld_lower']:.3f}, {u['pld']:.3f}] "
            f"| {u['gdp_clt (approximate)']:.3f} | {row['seed']} | {row['seconds']:.1f} |"
        )
    lines += [
        "",
        f"{caught} of {len(bugs)} planted bugs flagged. The per-step audit composes with the "
        "claimed Poisson sampling, so a sampler bug (shuffled as Poisson) is outside what it "
        "tests.",
    ]
    (RESULTS / "planted_bugs.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    names = [r["setting"]["implementation"] for r in rows]
    values = [r["epsilon_lower"] for r in rows]
    colours = ["tab:red" if r["flagged"] else "tab:green" for r in rows]
    axes.bar(range(len(rows)), values, color=colours)
    axes.axhline(first["target_epsilon"], color="k", lw=0.8, label="claimed ε")
    axes.set_xticks(range(len(rows)), names, rotation=25, ha="right", fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("ε_lb (95%)")
    axes.set_title("Planted bugs: red = flagged (ε_lb > claimed ε)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "planted_bugs.png", dpi=150)
    plt.close(figure)
