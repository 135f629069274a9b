"""White-box DP-SGD audit of learned positions at lot size == sequence length.

The fast path once took a position table's ``(T, d)`` output for T examples whenever a lot had T
examples, so one example's influence on the released sum was not bounded by C. This audit trains
a model whose only trainable parameter is a learned position table (``nn.Embedding(T, d)`` on
``torch.arange(T)``, added to frozen token embeddings, sum over time, frozen head) with lots of
exactly T examples, and asks the per-step white-box question of
:mod:`audits.dpsgd_whitebox` (Nasr et al. 2023): can the released gradient tell whether a canary
example was in the lot?

In the "in" world the lot is T - 1 real examples and the canary (token 0, which no real example
uses, labelled against the head's prediction: its gradient is far above C, so clipping binds;
the real examples are labelled as the head predicts, so theirs are small); in the "out" world
T real examples. The auditor knows every
real example and the parameters, computes the real examples' clipped contributions with a
trusted one-example-at-a-time autograd loop, and scores step t by

    s_t = < g_applied q N - S_real, u > / C,

with u the unit direction of the canary's gradient in the position table. A correct engine gives
s_t ~ N(c <g_canary, u> / C, sigma^2) in and N(0, sigma^2) out, at most mu = 1 / sigma per step;
the lower bound mu_lb (95%) is composed over the run with the claimed sampling rate q = T / N
(the PLD interval's lower end) and set against the accountants' epsilon.

A planted bug replays the old defect (a batch-independent call taken as batched when its first
dimension equals the lot size): the audit must flag it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.dpsgd_whitebox import calibrated_sigma, single_thread, torch_seeded, upper_bounds
from audits.results_io import RESULTS, load, run_store, save
from dpcore.auditing.stepwise import composed_lower_bound, distinguish
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.dataflow import BatchDataflow
from dpcore.torch.per_example.fast import FastEngine, _Layer

CANARY_TOKEN = 0  # a token no real example uses

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "audits.dpsgd_whitebox",
    "dpcore.accountants.gdp_clt",
    "dpcore.accountants.pld",
    "dpcore.accountants.rdp",
    "dpcore.auditing.stepwise",
    "dpcore.calibration",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.dataflow",
    "dpcore.torch.per_example.fast",
)


@dataclasses.dataclass(frozen=True)
class PositionsConfig:
    """The audit's setting (quick: a minute or two on 2 cores)."""

    target_epsilon: float = 4.0
    delta: float = 1e-5
    length: int = 16  # T, and the lot size
    width: int = 4
    vocabulary: int = 12
    dataset_size: int = 800
    steps: int = 600
    runs: int = 3
    max_grad_norm: float = 1.0
    learning_rate: float = 0.05
    seed: int = 0
    confidence: float = 0.95
    held_out_fraction: float = 0.2


class PositionModel(nn.Module):
    """Frozen token embeddings + a trainable ``nn.Embedding(T, d)`` position table, sum, head."""

    def __init__(self, config: PositionsConfig) -> None:
        super().__init__()
        dtype = torch.float64
        self.tokens = nn.Embedding(config.vocabulary, config.width, dtype=dtype)
        self.positions = nn.Embedding(config.length, config.width, dtype=dtype)
        self.head = nn.Linear(config.width, 2, dtype=dtype)
        self.tokens.requires_grad_(False)
        self.head.requires_grad_(False)
        with torch.no_grad():
            self.head.weight.mul_(10.0)  # a confident head: the canary's loss gradient is large

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(torch.tanh(self.tokens(tokens) + positions).sum(1))


class ShapeTrustingEngine(FastEngine):
    """Planted bug: a layer call counts as batched when its first dimension is the lot size."""

    name = "fast (shape-trusting, planted bug)"

    def _before(
        self, layer: _Layer, dataflow: BatchDataflow, module: nn.Module, args: Any, kwargs: Any
    ) -> Any:
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        batched = first is not None and first.dim() > 0 and first.shape[0] == self._lot_size
        layer.batched.append(batched)
        if batched:
            assert first is not None
            dataflow.mark_batched(first)  # the table's indices are taken for examples too
            dataflow.enter_layer()
        return None

    def _after(
        self,
        layer: _Layer,
        dataflow: BatchDataflow,
        module: nn.Module,
        args: Any,
        kwargs: Any,
        output: Any,
    ) -> None:
        if layer.batched[-1]:
            dataflow.mark_batched(output)  # so that no meeting is recorded downstream
        super()._after(layer, dataflow, module, args, kwargs, output)

    def prepare(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Any) -> None:
        self.prepared = True  # the old engine had no trial lots

    def _clipped_sum(self, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: Any) -> Any:
        self._lot_size = inputs.shape[0]
        self._verified = True  # nor a check that could see this
        return super()._clipped_sum(inputs, targets, loss_fn)


def _loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def _data(config: PositionsConfig, seed: int) -> torch.Tensor:
    """Random token sequences (the canary's token 0 excluded)."""
    generator = torch.Generator().manual_seed(20_000 + seed)
    shape = (config.dataset_size, config.length)
    return torch.randint(1, config.vocabulary, shape, generator=generator)


def _canary(model: PositionModel, config: PositionsConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The canary token sequence, labelled against the head's prediction (large loss gradient)."""
    tokens = torch.full((1, config.length), CANARY_TOKEN)
    with torch.no_grad():
        label = 1 - model(tokens).argmax(1)
    return tokens, label


def _clipped_gradients(
    model: PositionModel, tokens: torch.Tensor, labels: torch.Tensor, c: float
) -> torch.Tensor:
    """Trusted: sum of each example's clipped position-table gradient, one example at a time."""
    table = model.positions.weight
    total = torch.zeros_like(table)
    for i in range(tokens.shape[0]):
        loss = _loss(model(tokens[i : i + 1]), labels[i : i + 1]).sum()
        (gradient,) = torch.autograd.grad(loss, table)
        total += gradient * min(1.0, c / float(gradient.norm()))
    return total


def step_scores(
    config: PositionsConfig,
    engine_class: type[FastEngine],
    *,
    sigma: float,
    insert: bool,
    seed: int,
) -> np.ndarray:
    """One run: the score s_t of every step (see the module docstring)."""
    with torch_seeded(seed):
        model = PositionModel(config)
    tokens = _data(config, seed)
    with (
        torch.no_grad()
    ):  # real examples agree with the head: small gradients, the canary stands out
        labels = model(tokens).argmax(1)
    canary_tokens, canary_label = _canary(model, config)
    engine = engine_class(model, max_grad_norm=config.max_grad_norm)
    engine.prepare(tokens[:16], labels[:16], _loss)
    q = config.length / config.dataset_size
    claimed_lot = q * config.dataset_size
    optimizer = DPOptimizer(
        torch.optim.SGD([model.positions.weight], lr=config.learning_rate),
        engine=engine,
        noise_multiplier=sigma,
        expected_batch_size=claimed_lot,
        noise=SeededGaussianNoise(seed),
    )
    rng = np.random.default_rng(seed)
    table = model.positions.weight
    scores = np.empty(config.steps)
    for t in range(config.steps):
        real = torch.as_tensor(
            rng.choice(config.dataset_size, config.length - int(insert), replace=False)
        )
        lot_tokens, lot_labels = tokens[real], labels[real]
        known = _clipped_gradients(model, lot_tokens, lot_labels, config.max_grad_norm)
        loss = _loss(model(canary_tokens), canary_label).sum()
        (direction,) = torch.autograd.grad(loss, table)
        direction = direction / direction.norm()
        if insert:
            lot_tokens = torch.cat([lot_tokens, canary_tokens])
            lot_labels = torch.cat([lot_labels, canary_label])
        optimizer.step(engine.clipped_sum(lot_tokens, lot_labels, _loss))
        assert table.grad is not None
        released = table.grad * claimed_lot - known
        scores[t] = float((released * direction).sum()) / config.max_grad_norm
    return scores


def world_seeds(config: PositionsConfig, insert: bool) -> list[int]:
    """The seeds of one world's runs: 1000 seed + 2 r (+ 1 with the canary)."""
    return [1000 * config.seed + 2 * r + int(insert) for r in range(config.runs)]


def summarise(
    config: PositionsConfig,
    engine_class: type[FastEngine],
    worlds: list[np.ndarray],
    *,
    sigma: float,
) -> dict[str, Any]:
    """Per-step mu_lb from the two worlds' scores and the composed epsilon_lb (no seconds)."""
    mu_lower, threshold = distinguish(
        worlds[0],
        worlds[1],
        delta=config.delta,
        confidence=config.confidence,
        held_out_fraction=config.held_out_fraction,
        seed=config.seed,
    )
    q = config.length / config.dataset_size
    upper = upper_bounds(q, sigma, config.steps, config.delta)
    lower = composed_lower_bound(q, mu_lower, config.steps, config.delta)
    return {
        "engine": engine_class.name,
        "mu_lower": mu_lower,
        "mu_claimed": 1 / sigma,
        "epsilon_lower": lower,
        "epsilon_upper": upper,
        "consistent": lower <= upper["pld"],
        "threshold": threshold,
        "mean_score_in": float(worlds[1].mean()),
        "mean_score_out": float(worlds[0].mean()),
        "steps_observed_per_world": int(worlds[0].size),
    }


def audit_one(
    config: PositionsConfig, engine_class: type[FastEngine], *, sigma: float
) -> dict[str, Any]:
    """Both worlds, ``config.runs`` runs each; per-step mu_lb and the composed epsilon_lb."""
    start = time.perf_counter()
    worlds = [
        np.concatenate(
            [
                step_scores(config, engine_class, sigma=sigma, insert=insert, seed=seed)
                for seed in world_seeds(config, insert)
            ]
        )
        for insert in (False, True)
    ]
    row = summarise(config, engine_class, worlds, sigma=sigma)
    return {**row, "seconds": time.perf_counter() - start}


#: the engines audited, by the name a unit of the audit carries
ENGINES: dict[str, type[FastEngine]] = {
    "fast": FastEngine,
    "shape-trusting (planted bug)": ShapeTrustingEngine,
}


@dataclasses.dataclass(frozen=True)
class PositionsRun:
    """One training run of the positions audit: one engine (a key of :data:`ENGINES`), one
    world (canary in or out) at one run seed, in the setting ``config``."""

    engine: str
    insert: bool
    seed: int
    sigma: float
    config: PositionsConfig


def execute(spec: PositionsRun) -> dict[str, Any]:
    """Train one run (one torch thread); its per-step scores and seconds, as JSON values.

    Raises:
        InvalidParameterError: ``spec.engine`` is not a key of :data:`ENGINES`.
    """
    if spec.engine not in ENGINES:
        raise InvalidParameterError("engine", f"one of {sorted(ENGINES)}", spec.engine)
    start = time.perf_counter()
    with single_thread():
        scores = step_scores(
            spec.config, ENGINES[spec.engine], sigma=spec.sigma, insert=spec.insert, seed=spec.seed
        )
    return {"scores": scores.tolist(), "seconds": time.perf_counter() - start}


def specs(config: PositionsConfig, sigma: float) -> dict[str, list[PositionsRun]]:
    """Every engine's training runs: the "out" world's, then the "in" world's."""
    return {
        name: [
            PositionsRun(engine=name, insert=insert, seed=seed, sigma=sigma, config=config)
            for insert in (False, True)
            for seed in world_seeds(config, insert)
        ]
        for name in ENGINES
    }


def run(
    config: PositionsConfig = PositionsConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Audit the fast path and the planted shape-trusting bug; save ``dpsgd_positions.json``.

    Each training run (``config.runs`` per world and engine) is one run of
    :func:`dpcore.runs.run_many`, kept in the audit's run store
    (``results/runs/dpsgd_positions``): a killed audit resumes where it stopped. The per-step
    tests run here, from the stored scores.

    Args:
        config: the setting.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    q = config.length / config.dataset_size
    sigma = calibrated_sigma(config.target_epsilon, config.delta, q, config.steps)
    setting = {
        "target_epsilon": config.target_epsilon,
        "noise_multiplier": sigma,
        "sampling_probability": q,
        "lot_size": config.length,
        "sequence_length": config.length,
        "steps": config.steps,
        "runs_per_world": config.runs,
        "delta": config.delta,
    }
    units = specs(config, sigma)
    every = [unit for runs in units.values() for unit in runs]
    store = run_store("dpsgd_positions", *SOURCES)
    stored = run_many(execute, every, executor=executor, store=store)
    results = dict(zip(every, stored, strict=True))
    rows = []
    for name, runs in units.items():
        start = time.perf_counter()
        worlds = [
            np.concatenate([np.asarray(results[u]["scores"]) for u in runs if u.insert == insert])
            for insert in (False, True)
        ]
        row = summarise(config, ENGINES[name], worlds, sigma=sigma)
        spent = sum(results[u]["seconds"] for u in runs) + time.perf_counter() - start
        rows.append({"audit": "dpsgd_positions", "setting": setting, **row, "seconds": spent})
    save("dpsgd_positions", rows, dataclasses.asdict(config))
    return rows


def write_report() -> None:
    """``results/dpsgd_positions.md`` from the saved rows."""
    rows = load("dpsgd_positions")
    lines = [
        "# Audit: learned positions at lot size == sequence length (white-box, per step)",
        "",
        "Only the position table is trainable; lots of exactly T examples; the canary's gradient "
        "lies in the position table. ε_lb: 95% lower bound (per-step μ_lb composed with the PLD "
        "accountant at the claimed q, lower end). Consistent: ε_lb ≤ the PLD upper bound.",
        "",
        "| engine | sigma | q | T = lot | steps | μ_lb (claim 1/sigma) | ε_lb (95%) "
        "| PLD ε interval | consistent | mean score in / out | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s, u = row["setting"], row["epsilon_upper"]
        lines.append(
            f"| {row['engine']} | {s['noise_multiplier']:.4f} | {s['sampling_probability']:g} "
            f"| {s['lot_size']} | {s['steps']} | {row['mu_lower']:.3f} ({row['mu_claimed']:.3f}) "
            f"| {row['epsilon_lower']:.3f} | [{u['pld_lower']:.3f}, {u['pld']:.3f}] "
            f"| {row['consistent']} | {row['mean_score_in']:.2f} / {row['mean_score_out']:.2f} "
            f"| {row['seconds']:.1f} |"
        )
    (RESULTS / "dpsgd_positions.md").write_text("\n".join(lines) + "\n")
