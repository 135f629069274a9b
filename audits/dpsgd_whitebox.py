"""White-box DP-SGD audit: a Dirac gradient canary in real dpcore training, per-step tests.

Following Nasr et al. 2023 (arXiv 2302.07956, "white-box, gradient canary" auditor, Sec. 5 and
the per-step analysis of Sec. 6): a logistic-regression model is trained with dpcore's
:class:`~dpcore.torch.per_example.fast.FastEngine`, :class:`~dpcore.torch.optimizers.DPOptimizer`
(SGD) and :class:`~dpcore.torch.samplers.PoissonSampler`. The auditor controls one extra
"example" whose per-example gradient is a Dirac vector ``4 C e_j`` on a weight coordinate j that
no real example touches (its feature is always 0). The canary is clipped by the engine's clipping
rule ``c = min(1, C / ||g||)`` like any real example (so an implementation that does not clip
shows), and in the "in" world it is added to every step's clipped sum; in the "out" world never.

The auditor is white-box: it knows everything but the noise and the canary bit, in particular
the clipped sum ``S_j`` of the real lot in coordinate j (here 0) and the claimed divisor q N.
From the gradient ``g_j`` the optimizer actually applied at step t it computes

    s_t = (g_j q N - S_j) / C,

which for a correct implementation is N(1, sigma^2) in and N(0, sigma^2) out: each step is a
Gaussian mechanism with mu = 1 / sigma (Dong, Roth, Su 2019). A threshold is chosen on a held-out
part of the steps; on the rest, false-positive and false-negative rates are bounded by
Clopper–Pearson (union bound, 95% overall) and turned into mu_lb = Phi^{-1}(1 - FPR_hi) -
Phi^{-1}(FNR_hi) (:func:`dpcore.auditing.gdp_lower_bound`). The empirical noise multiplier
sigma_emp = 1 / mu_lb is composed with the tight (PLD) accountant for the real run, i.e. the
*lower* end of the PLD interval for DP-SGD(q, sigma_emp, T) at delta is epsilon_lb.

What the bound means (95% confidence): "each step leaks at least as much as a Gaussian mechanism
with noise multiplier sigma_emp, hence, if sampling and composition are as the accountant
assumes, the run's epsilon is at least epsilon_lb". The last step trusts the claimed sampling;
sampling bugs need a test over the sampler (see :mod:`audits.planted_bugs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.canaries import CANARY_NORM, GradientCanaries, SamplerFactory, poisson_sampler
from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import GdpCltAccountant, PldAccountant, RdpAccountant
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.auditing.stepwise import composed_lower_bound, distinguish
from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, RunStore, SupportsSubmit, run_many
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.seeding import torch_seeded

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "audits.canaries",
    "dpcore.accountants.gdp_clt",
    "dpcore.accountants.pld",
    "dpcore.accountants.rdp",
    "dpcore.auditing.stepwise",
    "dpcore.calibration",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.base",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
)


@dataclasses.dataclass(frozen=True)
class WhiteboxConfig:
    """One training setting of the white-box audit (quick profile by default)."""

    epsilons: tuple[float, ...] = (2.0, 4.0, 8.0)
    delta: float = 1e-5
    dataset_size: int = 1000
    sampling_probability: float = 0.01
    steps: int = 2000
    runs: int = 5
    features: int = 8
    max_grad_norm: float = 1.0
    learning_rate: float = 0.5
    seeds: tuple[int, ...] = (0,)
    confidence: float = 0.95
    held_out_fraction: float = 0.2


@dataclasses.dataclass(frozen=True)
class Implementation:
    """The DP-SGD implementation under audit: its engine, optimizer and sampler.

    The default is dpcore's own; :mod:`audits.planted_bugs` replaces one part at a time. The
    canary (:class:`audits.canaries.GradientCanaries`) is hooked onto the engine, clipped by the
    engine's rule unless ``clip_canary`` is off.
    """

    name: str = "dpcore (correct)"
    engine: Callable[[nn.Module, float], PerExampleEngine] = dataclasses.field(
        default=lambda model, c: FastEngine(model, max_grad_norm=c)
    )
    optimizer: type[DPOptimizer] = DPOptimizer
    sampler: SamplerFactory = poisson_sampler
    clip_canary: bool = True


def _dataset(config: WhiteboxConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Linearly separable-ish data; feature 0 is identically 0 (the canary's coordinate)."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(config.dataset_size, config.features, generator=generator, dtype=torch.float64)
    x[:, 0] = 0.0
    truth = torch.randn(config.features, generator=generator, dtype=torch.float64)
    noise = 0.5 * torch.randn(config.dataset_size, generator=generator, dtype=torch.float64)
    y = ((x @ truth + noise) > 0).to(torch.float64)
    return x, y


def _loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(
        outputs.squeeze(-1), targets, reduction="none"
    )


def step_scores(
    implementation: Implementation,
    config: WhiteboxConfig,
    *,
    noise_multiplier: float,
    insert: bool,
    seed: int,
) -> np.ndarray:
    """Train one run; return s_t = (g_j q N - S_j) / C for every step t (see module doc)."""
    x, y = _dataset(config, seed)
    with torch_seeded(seed):
        model = nn.Linear(config.features, 1).to(torch.float64)
    engine = implementation.engine(model, config.max_grad_norm)
    canary = GradientCanaries(
        engine, norm=CANARY_NORM * config.max_grad_norm, clip=implementation.clip_canary
    )
    canary.coordinates = [0] if insert else []
    claimed_lot = config.sampling_probability * config.dataset_size
    optimizer = implementation.optimizer(
        torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        engine=engine,
        noise_multiplier=noise_multiplier,
        expected_batch_size=claimed_lot,
        noise=SeededGaussianNoise(seed),
    )
    sampler = implementation.sampler(config.dataset_size, config.sampling_probability, seed)
    weight = engine.parameters[0]
    scores = np.empty(config.steps)
    for t in range(config.steps):
        lot = sampler.sample()
        clipped = engine.clipped_sum(x[lot], y[lot], _loss)
        optimizer.step(clipped)
        assert weight.grad is not None
        applied = float(weight.grad.reshape(-1)[0])
        scores[t] = (applied * claimed_lot - canary.known_sum[0]) / config.max_grad_norm
    return scores


def upper_bounds(q: float, sigma: float, steps: int, delta: float) -> dict[str, float]:
    """Every accountant's epsilon for DP-SGD(q, sigma, T): RDP, PLD interval, CLT."""
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        rdp = float(RdpAccountant().compose(event).get_epsilon(delta))
    pld = PldAccountant().compose(event).get_epsilon_interval(delta)
    clt = float(GdpCltAccountant().compose(event).get_epsilon(delta))
    return {"rdp": rdp, "pld": pld.upper, "pld_lower": pld.lower, "gdp_clt (approximate)": clt}


def world_seeds(runs: int, seed: int, insert: bool) -> list[int]:
    """The seeds of one world's runs in the audit at ``seed``: 1000 seed + 2 r (+ 1 when in)."""
    return [1000 * seed + 2 * r + int(insert) for r in range(runs)]


def summarise(
    negative: np.ndarray,
    positive: np.ndarray,
    config: WhiteboxConfig,
    *,
    noise_multiplier: float,
    seed: int,
) -> dict[str, Any]:
    """Distinguish the worlds' scores per step and compose: a result row without its seconds."""
    mu_lower, threshold = distinguish(
        negative,
        positive,
        delta=config.delta,
        confidence=config.confidence,
        held_out_fraction=config.held_out_fraction,
        seed=seed,
    )
    q, steps = config.sampling_probability, config.steps
    return {
        "mu_lower": mu_lower,
        "mu_claimed": 1 / noise_multiplier,
        "sigma_empirical": (1 / mu_lower) if mu_lower > 0 else None,
        "epsilon_lower": composed_lower_bound(q, mu_lower, steps, config.delta),
        "confidence": config.confidence,
        "epsilon_upper": upper_bounds(q, noise_multiplier, steps, config.delta),
        "seed": seed,
        "threshold": threshold,
        "steps_observed_per_world": int(negative.size),
    }


def audit_one(
    implementation: Implementation,
    config: WhiteboxConfig,
    *,
    noise_multiplier: float,
    seed: int,
) -> dict[str, Any]:
    """Run ``config.runs`` runs per world, distinguish per step, compose; one result row."""
    start = time.perf_counter()
    negative, positive = (
        np.concatenate(
            [
                step_scores(
                    implementation,
                    config,
                    noise_multiplier=noise_multiplier,
                    insert=insert,
                    seed=run_seed,
                )
                for run_seed in world_seeds(config.runs, seed, insert)
            ]
        )
        for insert in (False, True)
    )
    row = summarise(negative, positive, config, noise_multiplier=noise_multiplier, seed=seed)
    return {**row, "seconds": time.perf_counter() - start}


@functools.cache
def calibrated_sigma(epsilon: float, delta: float, q: float, steps: int) -> float:
    """The noise multiplier the PLD accountant gives DP-SGD(q, T) for ``(epsilon, delta)``."""
    return calibrate_noise(
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=q,
        steps=steps,
        accountant="pld",
    )


@dataclasses.dataclass(frozen=True)
class TrainingRun:
    """One training run of a white-box audit: one world (canary in or out) at one run seed.

    ``config`` is the audit's setting with ``epsilons`` and ``seeds`` emptied, so that adding a
    target or a seed leaves the stored runs of the others valid.
    """

    implementation: str  # the name of the Implementation trained
    noise_multiplier: float
    insert: bool
    seed: int
    config: WhiteboxConfig


def train(implementation: Implementation, spec: TrainingRun) -> dict[str, Any]:
    """Train one run (one torch thread); its per-step scores and seconds, as JSON values."""
    start = time.perf_counter()
    with single_thread():
        scores = step_scores(
            implementation,
            spec.config,
            noise_multiplier=spec.noise_multiplier,
            insert=spec.insert,
            seed=spec.seed,
        )
    return {"scores": scores.tolist(), "seconds": time.perf_counter() - start}


def execute(spec: TrainingRun) -> dict[str, Any]:
    """:func:`train` dpcore's DP-SGD, the implementation this audit trains.

    Raises:
        InvalidParameterError: ``spec.implementation`` is not dpcore's.
    """
    correct = Implementation()
    if spec.implementation != correct.name:
        raise InvalidParameterError("implementation", repr(correct.name), spec.implementation)
    return train(correct, spec)


#: one row of a white-box audit: (implementation's name, noise multiplier, audit seed)
RowKey = tuple[str, float, int]


def audit_rows(
    execute_run: Callable[[TrainingRun], dict[str, Any]],
    keys: list[RowKey],
    config: WhiteboxConfig,
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None,
    store: RunStore,
) -> list[dict[str, Any]]:
    """Every row's training runs through :func:`dpcore.runs.run_many`, then each row summarised.

    The rows are those of :func:`audit_one` for each key (the same numbers; ``seconds`` is the
    runs' seconds plus the summary's).

    Args:
        execute_run: a module-level function training one run (:func:`train` of the named
            implementation).
        keys: the rows, in order.
        config: the setting every row is audited in.
        executor: where the runs go (see :func:`dpcore.runs.run_many`).
        store: where the runs are kept.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    setting = dataclasses.replace(config, epsilons=(), seeds=())
    runs = [
        [
            TrainingRun(name, sigma, insert, run_seed, setting)
            for insert in (False, True)
            for run_seed in world_seeds(config.runs, seed, insert)
        ]
        for name, sigma, seed in keys
    ]
    every = [unit for units in runs for unit in units]
    stored = run_many(execute_run, every, executor=executor, store=store)
    results = dict(zip(every, stored, strict=True))
    rows = []
    for (_, sigma, seed), units in zip(keys, runs, strict=True):
        start = time.perf_counter()
        negative, positive = (
            np.concatenate([np.asarray(results[u]["scores"]) for u in units if u.insert == insert])
            for insert in (False, True)
        )
        row = summarise(negative, positive, config, noise_multiplier=sigma, seed=seed)
        spent = sum(results[u]["seconds"] for u in units)
        rows.append({**row, "seconds": spent + time.perf_counter() - start})
    return rows


def run(
    config: WhiteboxConfig = WhiteboxConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit dpcore's DP-SGD at every target epsilon and seed; save ``dpsgd_whitebox.json``.

    Each training run (``config.runs`` per world, per target and seed) is one run of
    :func:`dpcore.runs.run_many` (one torch thread each), kept in the audit's run store
    (``results/runs/dpsgd_whitebox``): a killed audit resumes where it stopped. The per-step
    test and the composition run here, from the stored scores.

    Args:
        config: the setting, targets and seeds.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    q, delta, steps = config.sampling_probability, config.delta, config.steps
    targets = [(eps, calibrated_sigma(eps, delta, q, steps)) for eps in config.epsilons]
    keys = [(Implementation().name, sigma, seed) for _, sigma in targets for seed in config.seeds]
    store = run_store("dpsgd_whitebox", *SOURCES)
    summaries = audit_rows(execute, keys, config, executor=executor, store=store)
    rows = []
    for (epsilon, sigma), row in zip(
        [target for target in targets for _ in config.seeds], summaries, strict=True
    ):
        setting = {
            "target_epsilon": epsilon,
            "noise_multiplier": sigma,
            "sampling_probability": q,
            "steps": steps,
            "dataset_size": config.dataset_size,
            "runs_per_world": config.runs,
            "delta": delta,
        }
        rows.append({"audit": "dpsgd_whitebox", "setting": setting, **row})
    save("dpsgd_whitebox", rows, dataclasses.asdict(config))
    return rows


class _SingleThread:
    """How many blocks of this process are inside :func:`single_thread`, and the setting before."""

    lock = threading.Lock()
    inside = 0
    threads = 1


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """One torch thread: the lots are tiny, and intra-op threads only contend on 2 cores.

    Runs fanned out on the threads of one process may enter it together: the first to enter
    sets one thread, the last to leave restores the number there was before the first.
    """
    with _SingleThread.lock:
        if _SingleThread.inside == 0:
            _SingleThread.threads = torch.get_num_threads()
            torch.set_num_threads(1)
        _SingleThread.inside += 1
    try:
        yield
    finally:
        with _SingleThread.lock:
            _SingleThread.inside -= 1
            if _SingleThread.inside == 0:
                torch.set_num_threads(_SingleThread.threads)


def write_report() -> None:
    """``results/dpsgd_whitebox.md`` and ``.png`` from the saved rows."""
    rows = load("dpsgd_whitebox")
    lines = [
        "# Audit: white-box DP-SGD (Dirac gradient canary, per-step, Nasr et al. 2023)",
        "",
        "ε_lb: 95% lower bound (per-step μ_lb composed with the PLD accountant, lower end); "
        "the accountants' ε are for the claimed sigma. Goal: ε_lb ≥ 0.75 ε.",
        "",
        "| target ε | sigma | q | T | runs/world | μ_lb (claim 1/sigma) | ε_lb (95%) | ε_lb / ε "
        "| RDP ε | PLD ε interval | CLT ε (approx.) | goal met | seed | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, u = row["setting"], row["epsilon_upper"]
        ratio = row["epsilon_lower"] / s["target_epsilon"]
        lines.append(
            f"| {s['target_epsilon']:g} | {s['noise_multiplier']:.4f} "
            f"| {s['sampling_probability']:g} | {s['steps']} | {s['runs_per_world']} "
            f"| {row['mu_lower']:.3f} ({row['mu_claimed']:.3f}) | {row['epsilon_lower']:.3f} "
            f"| {ratio:.3f} | {u['rdp']:.3f} | [{u['pld_lower']:.3f}, {u['pld']:.3f}] "
            f"| {u['gdp_clt (approximate)']:.3f} | {ratio >= 0.75} | {row['seed']} "
            f"| {row['seconds']:.1f} |"
        )
    (RESULTS / "dpsgd_whitebox.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    targets = [r["setting"]["target_epsilon"] for r in rows]
    axes.plot(targets, [r["epsilon_lower"] for r in rows], "o", label="ε_lb (95%)")
    axes.plot(targets, [r["epsilon_upper"]["rdp"] for r in rows], "x", label="RDP ε")
    axes.plot(targets, [r["epsilon_upper"]["pld"] for r in rows], "+", label="PLD ε (upper)")
    top = max(targets)
    axes.plot([0, top], [0, top], "k-", lw=0.8, label="claimed ε")
    axes.plot([0, top], [0, 0.75 * top], "k:", lw=0.8, label="0.75 · claimed ε")
    axes.set_xlabel("claimed ε (δ = 1e-5)")
    axes.set_ylabel("ε")
    axes.set_title("White-box DP-SGD audit (Dirac canary, per step)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "dpsgd_whitebox.png", dpi=150)
    plt.close(figure)
