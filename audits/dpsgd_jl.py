"""White-box DP-SGD-JL audit: a Dirac gradient canary clipped by JL-estimated norms, per step.

DP-SGD-JL (Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat 2021, arXiv 2102.03013, Alg. 1)
clips each example by a norm *estimated* from r random projections shared by the lot,
``M^2 = (1/r) sum_j <g, v_j>^2 ~ ||g||^2 X / r`` with ``X ~ chi^2_r``. An example's clipped
contribution therefore has the random norm (their Lemma 4.1)

    ||c g|| = min(||g||, C sqrt(r / X)),

which exceeds C with positive probability; the worst case of their Thm 4.1 is ``||g|| -> inf``,
where the contribution is ``C sqrt(r / X)``: a Gaussian mechanism whose sensitivity is a
heavy-tailed random variable (for r = 1, ``P[sqrt(1/X) > t] ~ 0.8 / t``). The paper hopes that
natural gradients, of moderate norm, leak less than this worst case ("more private than proven").

The audit trains logistic regression with dpcore's real :class:`~dpcore.torch.per_example.jl.
JLEngine`, :class:`~dpcore.torch.optimizers.DPOptimizer` and
:class:`~dpcore.torch.samplers.PoissonSampler`, and inserts, as in
:mod:`audits.dpsgd_whitebox` (Nasr et al. 2023, arXiv 2302.07956), a Dirac canary
``n C e_j`` on a coordinate no real example touches. The canary's norm is estimated with *the
same* directions the engine drew for the lot (``M = n C sqrt(mean_j v_j[e_j]^2)``) and it is
clipped by ``min(1, C / M)``. The white-box score of step t is

    s_t = (g_j q N - S_j) / C  =  min(n, sqrt(r / X_t)) + sigma Z_t   (in),  sigma Z_t   (out).

Because the per-step mechanism is not Gaussian (a scale mixture with a heavy tail), the GDP route
of :mod:`audits.dpsgd_whitebox` does not apply; the threshold route does: a threshold is chosen
on a held-out part of the steps (Bonferroni sweep), and on the rest FPR and FNR are bounded by
Clopper–Pearson (95% overall), giving (Kairouz et al. 2015, Jagielski et al. 2020)

    eps_lb = log((1 - delta - FNR_hi) / FPR_hi)

for *one step* (q = 1, T = 1) at the per-step delta. It is compared with the JL accountant's
interval for ``JLGaussianEvent(sigma, r)`` (``PoissonSampledEvent`` with q = 1, T = 1), which it
must never exceed, and with DP-SGD's per-step epsilon (PLD, Gaussian, sensitivity C).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.canaries import GradientCanaries, NormEstimate
from audits.dpsgd_whitebox import WhiteboxConfig, _dataset, _loss, single_thread, torch_seeded
from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import JlAccountant, PldAccountant
from dpcore.auditing.stepwise import held_out_threshold_bound
from dpcore.errors import InvalidParameterError
from dpcore.events import GaussianEvent, JLGaussianEvent, PoissonSampledEvent
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.samplers import PoissonSampler

#: Canary norms in units of C: at the clipping norm, twice it ("natural", moderate), and the
#: worst case of Bu et al.'s Thm 4.1 (``||g|| -> inf``; 1e6 C is indistinguishable from it:
#: ``P[sqrt(r / X) > 1e6] < 1e-6`` for every r >= 1).
CANARY_NORMS: tuple[float, ...] = (1.0, 2.0, 1e6)

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "audits.canaries",
    "audits.dpsgd_whitebox",
    "dpcore.accountants.jl",
    "dpcore.accountants.pld",
    "dpcore.auditing.stepwise",
    "dpcore.pld.jl_pairs",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.base",
    "dpcore.torch.per_example.jl",
    "dpcore.torch.samplers",
)


@dataclasses.dataclass(frozen=True)
class JlAuditConfig:
    """One setting of the JL audit (quick profile by default)."""

    jl_dimensions: tuple[int, ...] = (1, 4, 16)
    canary_norms: tuple[float, ...] = CANARY_NORMS
    noise_multiplier: float = 1.0
    delta: float = 1e-2
    dataset_size: int = 50
    sampling_probability: float = 0.1
    steps: int = 2500
    features: int = 8
    max_grad_norm: float = 1.0
    learning_rate: float = 0.5
    seed: int = 0
    confidence: float = 0.95
    held_out_fraction: float = 0.3


class RecordingSource(NoiseSource):
    """A seeded Gaussian source that remembers its draws since the last :meth:`clear`."""

    name = "recording"

    def __init__(self, seed: int) -> None:
        self.inner = SeededGaussianNoise(seed)
        self.draws: list[torch.Tensor] = []

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        draw = self.inner.standard_normal(shape, dtype=dtype, device=device)
        self.draws.append(draw)
        return draw

    def clear(self) -> None:
        """Forget the recorded draws (called at the start of every lot)."""
        self.draws = []


def jl_norm_estimate(source: RecordingSource) -> NormEstimate:
    """The norm :class:`JLEngine` sees for a Dirac canary: from the lot's r shared directions.

    For the Dirac gradient ``n C e_j``, ``<g, v_k> = n C v_k[j]`` and the estimate is
    ``M = n C sqrt(mean_k v_k[j]^2)`` (the engine's own draws, recorded), so the canary is clipped
    like a real example of the lot: it adds ``min(1, C / M) n C`` to coordinate j.
    """

    def estimate(engine: PerExampleEngine, coordinate: int, norm: float) -> float:
        if not source.draws:  # an empty real lot: the canary's lot still draws directions
            assert isinstance(engine, JLEngine)
            engine._draw_directions()
        # _draw_directions draws one (r, *shape) tensor per trainable parameter, in order; the
        # canary lives in parameter 0.
        tangent = source.draws[0]
        r = tangent.shape[0]
        return float(norm * tangent.reshape(r, -1)[:, coordinate].square().mean().sqrt())

    return estimate


def step_scores(
    config: JlAuditConfig, *, jl_dimension: int, canary_norm: float | None, seed: int
) -> np.ndarray:
    """Train one DP-SGD-JL run; return s_t = (g_j q N - S_j) / C per step (``None``: no canary)."""
    data = WhiteboxConfig(dataset_size=config.dataset_size, features=config.features)
    x, y = _dataset(data, seed)
    with torch_seeded(seed):
        model = nn.Linear(config.features, 1).to(torch.float64)
    c = config.max_grad_norm
    source = RecordingSource(2 * seed + 1)
    engine = JLEngine(model, max_grad_norm=c, jl_dimension=jl_dimension, directions=source)
    canary = GradientCanaries(
        engine, norm=(canary_norm or 1.0) * c, estimate=jl_norm_estimate(source)
    )
    canary.coordinates = [0] if canary_norm is not None else []
    claimed_lot = config.sampling_probability * config.dataset_size
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=config.learning_rate),
        engine=engine,
        noise_multiplier=config.noise_multiplier,
        expected_batch_size=claimed_lot,
        noise=SeededGaussianNoise(2 * seed),
    )
    sampler = PoissonSampler(
        config.dataset_size, sampling_probability=config.sampling_probability, seed=seed
    )
    weight = engine.parameters[0]
    scores = np.empty(config.steps)
    for t in range(config.steps):
        lot = sampler.sample()
        source.clear()  # the canary's norm estimate reads this lot's directions only
        optimizer.step(engine.clipped_sum(x[lot], y[lot], _loss))
        assert weight.grad is not None
        applied = float(weight.grad.reshape(-1)[0])
        scores[t] = (applied * claimed_lot - canary.known_sum[0]) / c
    return scores


def upper_tail_grid(held_out: np.ndarray) -> np.ndarray:
    """The upper tail of the held-out negatives and, for the heavy-tailed positive scores,
    points beyond their maximum (FPR 0 there)."""
    levels = np.geomspace(1.0 / held_out.size, 0.5, 30)
    spread = float(np.std(held_out))
    return np.concatenate(
        [np.quantile(held_out, 1 - levels), held_out.max() + spread * np.geomspace(0.1, 30, 20)]
    )


def distinguish(
    negative: np.ndarray,
    positive: np.ndarray,
    *,
    delta: float,
    confidence: float,
    held_out_fraction: float,
    seed: int,
) -> tuple[float, float]:
    """(eps_lb, threshold) by the Clopper–Pearson route, threshold from :func:`upper_tail_grid`
    on held-out scores (:func:`dpcore.auditing.stepwise.held_out_threshold_bound`)."""
    bound, threshold = held_out_threshold_bound(
        negative,
        positive,
        delta=delta,
        confidence=confidence,
        held_out_fraction=held_out_fraction,
        seed=seed,
        grid=upper_tail_grid,
        route="clopper_pearson",
    )
    return float(bound.epsilon_lower), threshold


@functools.cache
def step_upper_bounds(sigma: float, jl_dimension: int, delta: float) -> dict[str, float]:
    """Per-step epsilon (q = 1, T = 1): JL accountant interval and DP-SGD's (PLD, Gaussian)."""
    step = PoissonSampledEvent(1.0, JLGaussianEvent(sigma, jl_dimension))
    # bins=100: about 15 s for r <= 4 instead of 45 s; the interval is wider, still certified.
    jl = JlAccountant(bins=100).compose(step).get_epsilon_interval(delta)
    pld = PldAccountant().compose(GaussianEvent(sigma)).get_epsilon_interval(delta)
    return {"jl": jl.upper, "jl_lower": jl.lower, "dpsgd_pld": pld.upper}


def _finite(value: float) -> float | None:
    """JSON has no infinity: an unbounded accountant epsilon is saved as ``null``."""
    return value if math.isfinite(value) else None


@dataclasses.dataclass(frozen=True)
class JlBound:
    """One unit of the JL audit: the per-step accountants' epsilon at one JL dimension."""

    noise_multiplier: float
    jl_dimension: int
    delta: float


@dataclasses.dataclass(frozen=True)
class JlTraining:
    """One unit of the JL audit: one training run at one r (``canary_norm`` None: "out").

    ``config`` is the audit's setting with ``jl_dimensions`` and ``canary_norms`` emptied, so
    that adding an r or a norm leaves the stored units of the others valid.
    """

    jl_dimension: int
    canary_norm: float | None
    seed: int
    config: JlAuditConfig


def execute(spec: JlBound | JlTraining) -> dict[str, Any]:
    """One unit, as JSON values with its seconds: the accountants' epsilon (``null`` for an
    unbounded one) or one run's per-step scores (one torch thread).

    Raises:
        InvalidParameterError: ``spec`` is neither a :class:`JlBound` nor a :class:`JlTraining`.
    """
    start = time.perf_counter()
    if isinstance(spec, JlBound):
        upper = step_upper_bounds(spec.noise_multiplier, spec.jl_dimension, spec.delta)
        finite = {k: _finite(v) for k, v in upper.items()}
        return {"epsilon_upper": finite, "seconds": time.perf_counter() - start}
    if not isinstance(spec, JlTraining):
        raise InvalidParameterError("spec", "a JlBound or a JlTraining", spec)
    with single_thread():
        scores = step_scores(
            spec.config,
            jl_dimension=spec.jl_dimension,
            canary_norm=spec.canary_norm,
            seed=spec.seed,
        )
    return {"scores": scores.tolist(), "seconds": time.perf_counter() - start}


def specs(config: JlAuditConfig) -> dict[int, list[JlBound | JlTraining]]:
    """Every r's units: its accountants, its "out" world, then one "in" world per canary norm.

    The "out" world (seed ``config.seed``) is shared by the canary norms of r; the "in" world
    of the i-th norm has seed ``config.seed + 1 + i``.
    """
    setting = dataclasses.replace(config, jl_dimensions=(), canary_norms=())
    units: dict[int, list[JlBound | JlTraining]] = {}
    for r in config.jl_dimensions:
        units[r] = [
            JlBound(config.noise_multiplier, r, config.delta),
            JlTraining(r, None, config.seed, setting),
        ]
        units[r] += [
            JlTraining(r, norm, config.seed + 1 + index, setting)
            for index, norm in enumerate(config.canary_norms)
        ]
    return units


def run(
    config: JlAuditConfig = JlAuditConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit every (r, canary norm) at one sigma; save ``dpsgd_jl.json``.

    The accountants of each r and each training run are runs of :func:`dpcore.runs.run_many`,
    kept in the audit's run store (``results/runs/dpsgd_jl``): a killed audit resumes where it
    stopped. The threshold tests run here, from the stored scores; a row's seconds are its
    "in" run's and test's plus its share of the "out" run's and the accountants'.

    Args:
        config: the setting, JL dimensions and canary norms.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    units = specs(config)
    every = [unit for per_r in units.values() for unit in per_r]
    store = run_store("dpsgd_jl", *SOURCES)
    stored = run_many(execute, every, executor=executor, store=store)
    results = dict(zip(every, stored, strict=True))
    rows = []
    for r, (bound, out, *ins) in units.items():
        negative = np.asarray(results[out]["scores"])
        shared = (results[out]["seconds"] + results[bound]["seconds"]) / len(ins)
        for unit in ins:
            assert isinstance(unit, JlTraining)
            start = time.perf_counter()
            positive = np.asarray(results[unit]["scores"])
            epsilon_lower, threshold = distinguish(
                negative,
                positive,
                delta=config.delta,
                confidence=config.confidence,
                held_out_fraction=config.held_out_fraction,
                seed=unit.seed,
            )
            setting = {
                "jl_dimension": r,
                "canary_norm_over_c": unit.canary_norm,
                "noise_multiplier": config.noise_multiplier,
                "per_step_delta": config.delta,
                "steps_per_world": config.steps,
                "dataset_size": config.dataset_size,
                "sampling_probability": config.sampling_probability,
            }
            spent = results[unit]["seconds"] + time.perf_counter() - start + shared
            rows.append(
                {
                    "audit": "dpsgd_jl",
                    "setting": setting,
                    "epsilon_lower": epsilon_lower,
                    "confidence": config.confidence,
                    "epsilon_upper": results[bound]["epsilon_upper"],
                    "seed": unit.seed,
                    "threshold": threshold,
                    "positive_mean": float(positive.mean()),
                    "positive_max": float(positive.max()),
                    "seconds": spent,
                }
            )
    save("dpsgd_jl", rows, dataclasses.asdict(config))
    return rows


def _fmt(value: float | None) -> str:
    return "∞" if value is None else f"{value:.3f}"


def write_report() -> None:
    """``results/dpsgd_jl.md`` and ``.png`` from the saved rows."""
    rows = load("dpsgd_jl")
    first = rows[0]["setting"]
    lines = [
        "# Audit: white-box DP-SGD-JL (Dirac canary clipped by JL-estimated norms, per step)",
        "",
        f"One step (q = 1, T = 1) of real dpcore JL training, sigma = "
        f"{first['noise_multiplier']:g}, per-step δ = {first['per_step_delta']:g}, "
        f"{first['steps_per_world']} steps per world (threshold route, Clopper-Pearson, 95%). "
        "Canary norm n C; n = 1e6 is the worst case ||g|| → ∞ of Bu et al. (2021), Thm 4.1.",
        "",
        "| r | canary norm / C | ε_lb (95%) | JL accountant ε interval | DP-SGD ε (PLD) "
        "| ε_lb ≤ JL upper | ε_lb > DP-SGD ε | mean score (in) | seed | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, u = row["setting"], row["epsilon_upper"]
        jl_upper = math.inf if u["jl"] is None else u["jl"]
        lines.append(
            f"| {s['jl_dimension']} | {s['canary_norm_over_c']:g} | {row['epsilon_lower']:.3f} "
            f"| [{_fmt(u['jl_lower'])}, {_fmt(u['jl'])}] | {_fmt(u['dpsgd_pld'])} "
            f"| {row['epsilon_lower'] <= jl_upper} "
            f"| {row['epsilon_lower'] > u['dpsgd_pld']} | {row['positive_mean']:.3f} "
            f"| {row['seed']} | {row['seconds']:.1f} |"
        )
    exceed = [
        f"(r = {r['setting']['jl_dimension']}, n = {r['setting']['canary_norm_over_c']:g})"
        for r in rows
        if r["epsilon_lower"] > r["epsilon_upper"]["dpsgd_pld"]
    ]
    unsound = [
        r
        for r in rows
        if r["epsilon_upper"]["jl"] is not None and r["epsilon_lower"] > r["epsilon_upper"]["jl"]
    ]
    lines += [
        "",
        f"ε_lb above the JL accountant's ε: {len(unsound)} of {len(rows)} rows. "
        "Canaries certified (95%) to leak more than a DP-SGD step (ε_lb > DP-SGD ε): "
        f"{', '.join(exceed) or 'none'}. A canary of norm n C contributes "
        "min(n, sqrt(r / X)) C, so n ≤ 1 can never leak more than a DP-SGD step, and for "
        "n > 1 the excess sensitivity is at most n; only the worst case n → ∞ with small r has "
        "the heavy tail that makes the JL accountant's per-step ε large (∞ for r = 1).",
    ]
    (RESULTS / "dpsgd_jl.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    dims = sorted({r["setting"]["jl_dimension"] for r in rows})
    for norm, marker in zip(CANARY_NORMS, "osD", strict=True):
        chosen = [r for r in rows if r["setting"]["canary_norm_over_c"] == norm]
        axes.plot(
            [r["setting"]["jl_dimension"] for r in chosen],
            [r["epsilon_lower"] for r in chosen],
            marker,
            label=f"ε_lb, canary {norm:g} C",
        )
    uppers = [next(r for r in rows if r["setting"]["jl_dimension"] == d) for d in dims]
    axes.plot(
        dims,
        [r["epsilon_upper"]["jl_lower"] or np.nan for r in uppers],
        "k^",
        label="JL accountant ε (lower end; upper may be ∞)",
    )
    axes.axhline(uppers[0]["epsilon_upper"]["dpsgd_pld"], color="k", lw=0.8, label="DP-SGD ε")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("JL dimension r")
    axes.set_ylabel(f"per-step ε (δ = {first['per_step_delta']:g})")
    axes.set_title("DP-SGD-JL white-box audit (one step)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "dpsgd_jl.png", dpi=150)
    plt.close(figure)
