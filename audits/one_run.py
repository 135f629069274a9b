"""One-run audit (Steinke, Nasr, Jagielski 2023, arXiv 2305.08846) inside one real dpcore run.

m white-box gradient canaries are records of the training set with Dirac gradients
``4 C e_{j_i}`` on m weight coordinates that no real example touches (clipped to C by the
engine's rule like any example). Each canary is included in the dataset with probability 1/2
(secret bits). dpcore's :class:`~dpcore.torch.samplers.PoissonSampler` samples the real records
and the canaries alike (one sampler over N + m indices; a sampled canary that is not included
is ignored, which is the same law as sampling a dataset without it). After T steps of
:class:`~dpcore.torch.per_example.fast.FastEngine` + :class:`~dpcore.torch.optimizers.
DPOptimizer`, the white-box auditor scores canary i by

    score_i = sum_t (g_{t, j_i} q N - S_{t, j_i}) / C  ~  B_i + N(0, T sigma^2),

with B_i ~ Bin(T, q) if included and 0 otherwise (S: the real lot's clipped sum there, 0). It
guesses "in" for the k+ highest and "out" for the k- lowest scores (k± fixed in advance) and
counts the correct guesses v; Thm 5.2 of Steinke et al. turns (m, r = k+ + k-, v) into
eps_lb (:func:`dpcore.auditing.one_run_epsilon_lower_bound`, 95%).

The *ideal* game is simulated exactly from the law above (Bin(T, q) + Gaussian noise). The real
run must agree with it: its v must lie inside the central 95% band of the simulated v's (a gap
points to a bug in clipping, noise or sampling).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.canaries import CANARY_NORM, GradientCanaries
from audits.dpsgd_whitebox import _loss, single_thread, torch_seeded
from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import PldAccountant
from dpcore.auditing import one_run_epsilon_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.samplers import PoissonSampler


@dataclasses.dataclass(frozen=True)
class OneRunConfig:
    """The one-run setting (quick profile by default)."""

    canaries: int = 1000
    guesses_each_side: int = 100
    dataset_size: int = 100
    features: int = 8
    sampling_probability: float = 0.1
    steps: int = 500
    noise_multiplier: float = 2.0
    max_grad_norm: float = 1.0
    learning_rate: float = 0.5
    delta: float = 1e-5
    confidence: float = 0.95
    simulations: int = 400
    seed: int = 0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)


def real_scores(
    config: OneRunConfig, included: np.ndarray, *, noise_scale: float = 1.0, clip: bool = True
) -> np.ndarray:
    """Train one run with the included canaries; score_i for every canary (see module doc).

    ``noise_scale`` and ``clip`` plant bugs for the tests (noise sigma C noise_scale; no
    clipping of the canaries) while the scores still assume the claimed ones.
    """
    seed, m, c = config.seed, config.canaries, config.max_grad_norm
    generator = torch.Generator().manual_seed(10_000 + seed)
    width = m + config.features
    x = torch.randn(config.dataset_size, width, generator=generator, dtype=torch.float64)
    x[:, :m] = 0.0  # the canaries' coordinates: no real example touches them
    truth = torch.randn(width, generator=generator, dtype=torch.float64)
    y = ((x @ truth) > 0).to(torch.float64)
    with torch_seeded(seed):
        model = nn.Linear(width, 1).to(torch.float64)
    engine = FastEngine(model, max_grad_norm=c)
    canaries = GradientCanaries(engine, norm=CANARY_NORM * c, clip=clip)
    claimed_lot = config.sampling_probability * config.dataset_size
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        engine=engine,
        noise_multiplier=config.noise_multiplier * noise_scale,
        expected_batch_size=claimed_lot,
        noise=SeededGaussianNoise(seed),
    )
    sampler = PoissonSampler(
        config.dataset_size + m, sampling_probability=config.sampling_probability, seed=seed
    )
    weight = engine.parameters[0]
    totals = np.zeros(m)
    for _ in range(config.steps):
        lot = sampler.sample()
        real = lot[lot < config.dataset_size]
        sampled = (lot[lot >= config.dataset_size] - config.dataset_size).numpy()
        canaries.coordinates = [int(i) for i in sampled if included[i]]
        clipped = engine.clipped_sum(x[real], y[real], _loss)
        known = canaries.known_sum[:m]
        optimizer.step(clipped)
        assert weight.grad is not None
        applied = weight.grad.reshape(-1)[:m].detach().numpy()
        totals += (applied * claimed_lot - known) / c
    return totals


def ideal_scores(config: OneRunConfig, included: np.ndarray, rng: np.random.Generator) -> Any:
    """The ideal game's scores: Bin(T, q) [if included] + N(0, T sigma^2)."""
    t, q, sigma = config.steps, config.sampling_probability, config.noise_multiplier
    signal = rng.binomial(t, q, size=included.size) * included
    return signal + sigma * np.sqrt(t) * rng.standard_normal(included.size)


def correct_guesses(scores: np.ndarray, included: np.ndarray, each_side: int) -> int:
    """v: "in" for the ``each_side`` highest scores, "out" for the lowest, others abstain."""
    order = np.argsort(scores)
    return int(included[order[-each_side:]].sum() + (1 - included[order[:each_side]]).sum())


def epsilon_from(config: OneRunConfig, correct: int) -> float:
    """eps_lb of Steinke et al., Thm 5.2, at ``config.confidence``."""
    return one_run_epsilon_lower_bound(
        canaries=config.canaries,
        guesses=2 * config.guesses_each_side,
        correct=correct,
        delta=config.delta,
        confidence=config.confidence,
    ).epsilon_lower


def audit(config: OneRunConfig, **bug: Any) -> dict[str, Any]:
    """One real run and ``config.simulations`` ideal games with the same secret bits."""
    start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    included = rng.integers(0, 2, size=config.canaries)
    with single_thread():
        real = correct_guesses(
            real_scores(config, included, **bug), included, config.guesses_each_side
        )
    simulated = np.array(
        [
            correct_guesses(ideal_scores(config, included, rng), included, config.guesses_each_side)
            for _ in range(config.simulations)
        ]
    )
    low, high = np.quantile(simulated, [0.025, 0.975])
    event = dpsgd_event(
        sampling_probability=config.sampling_probability,
        noise_multiplier=config.noise_multiplier,
        steps=config.steps,
    )
    pld = PldAccountant().compose(event).get_epsilon_interval(config.delta)
    return {
        "correct": real,
        "simulated_band": [float(low), float(high)],
        "simulated_median": float(np.median(simulated)),
        "agrees": bool(low <= real <= high),
        "epsilon_lower": epsilon_from(config, real),
        "epsilon_lower_simulated_median": epsilon_from(config, int(np.median(simulated))),
        "confidence": config.confidence,
        "epsilon_upper": {"pld": pld.upper, "pld_lower": pld.lower},
        "seed": config.seed,
        "seconds": time.perf_counter() - start,
    }


#: Planted bugs (inside this module only) the agreement check should catch.
BUGS: dict[str, dict[str, Any]] = {
    "dpcore (correct)": {},
    "halved noise": {"noise_scale": 0.5},
    "no clipping": {"clip": False},
}

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "audits.canaries",
    "audits.dpsgd_whitebox",
    "dpcore.accountants.pld",
    "dpcore.auditing.statistics",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.base",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
)


@dataclasses.dataclass(frozen=True)
class OneRunUnit:
    """One unit of the one-run audit: one implementation (a key of :data:`BUGS`) at one seed.

    ``config`` is the audit's setting with ``seed`` set to the unit's seed and ``seeds``
    emptied, so that adding a seed leaves the stored units of the others valid.
    """

    implementation: str
    config: OneRunConfig


def execute(spec: OneRunUnit) -> dict[str, Any]:
    """:func:`audit` of one implementation at ``spec.config.seed``; one result row.

    Raises:
        InvalidParameterError: ``spec.implementation`` is not a key of :data:`BUGS`.
    """
    if spec.implementation not in BUGS:
        raise InvalidParameterError("implementation", f"one of {sorted(BUGS)}", spec.implementation)
    config = spec.config
    keys = ("canaries", "guesses_each_side", "sampling_probability", "steps", "noise_multiplier")
    setting = {"implementation": spec.implementation, **{k: getattr(config, k) for k in keys}}
    setting.update(dataset_size=config.dataset_size, delta=config.delta)
    setting["simulations"] = config.simulations
    row = audit(config, **BUGS[spec.implementation])
    return {"audit": "one_run", "setting": setting, **row}


def specs(config: OneRunConfig) -> list[OneRunUnit]:
    """The audit's units in the order of its rows: dpcore at every seed, each bug at the first."""
    return [
        OneRunUnit(implementation=name, config=dataclasses.replace(config, seed=seed, seeds=()))
        for name, bug in BUGS.items()
        for seed in (config.seeds if not bug else config.seeds[:1])
    ]


def run(
    config: OneRunConfig = OneRunConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """The one-run audit of dpcore's DP-SGD (every seed) and of two planted bugs (first seed).

    Each (implementation, seed) is one run of :func:`dpcore.runs.run_many`, kept in the audit's
    run store (``results/runs/one_run``): a killed audit resumes where it stopped.

    Args:
        config: the setting and the seeds.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    store = run_store("one_run", *SOURCES)
    rows: list[dict[str, Any]] = run_many(execute, specs(config), executor=executor, store=store)
    save("one_run", rows, dataclasses.asdict(config))
    return rows


def write_report() -> None:
    """``results/one_run.md`` and ``.png`` from the saved rows."""
    rows = load("one_run")
    lines = [
        "# Audit: one-run (Steinke, Nasr, Jagielski 2023), white-box gradient canaries",
        "",
        "v: correct guesses of the real run; band: central 95% of v over ideal simulated games "
        "with the same secret bits. ε_lb: Thm 5.2 at 95%.",
        "",
        "| implementation | m | guesses | q | T | sigma | v (real) | simulated band [median] "
        "| agrees | ε_lb (real) | ε_lb (sim. median) | PLD ε interval | seed | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, u, band = row["setting"], row["epsilon_upper"], row["simulated_band"]
        lines.append(
            f"| {s['implementation']} | {s['canaries']} | {2 * s['guesses_each_side']} "
            f"| {s['sampling_probability']:g} "
            f"| {s['steps']} | {s['noise_multiplier']:g} | {row['correct']} "
            f"| [{band[0]:g}, {band[1]:g}] [{row['simulated_median']:g}] | {row['agrees']} "
            f"| {row['epsilon_lower']:.3f} | {row['epsilon_lower_simulated_median']:.3f} "
            f"| [{u['pld_lower']:.3f}, {u['pld']:.3f}] | {row['seed']} | {row['seconds']:.1f} |"
        )
    (RESULTS / "one_run.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for index, row in enumerate(rows):
        low, high = row["simulated_band"]
        axes.plot([low, high], [index, index], color="tab:blue", lw=6, alpha=0.4)
        axes.plot(row["correct"], index, "o", color="tab:green" if row["agrees"] else "tab:red")
    labels = [f"{r['setting']['implementation']} (seed {r['seed']})" for r in rows]
    axes.set_yticks(range(len(rows)), labels, fontsize=7)
    axes.set_xlabel("correct guesses v (bar: ideal game's 95% band; dot: real run)")
    axes.set_title("One-run audit: real dpcore runs vs the ideal game")
    figure.tight_layout()
    figure.savefig(RESULTS / "one_run.png", dpi=150)
    plt.close(figure)
