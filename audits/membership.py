"""Black-box membership inference with input canaries in one training run.

m canary records (real examples held out of the base training set) are each included in the
training set independently with probability 1/2; one model is trained (non-privately, or with
dpcore's DP-SGD at a claimed epsilon); the attacker sees only the final model's outputs. Two
scores per canary:

- **loss threshold** (Yeom, Giacomelli, Fredrikson, Jha 2018): ``-loss(x, y)``;
- **offline LiRA** (Carlini, Chien, Nasr, Song, Terzis, Tramèr 2022, Sec. IV, offline variant):
  K shadow models trained on the base set plus their own random halves of the canaries give,
  per canary, the logit-scaled confidence ``phi = log(p / (1 - p))`` of the true label when it
  was *out*; the score is ``(phi_target - mean_out) / sd_out``.

Reported per score: ROC AUC, TPR at FPR <= 1e-2 (with m/2 non-members, FPR = 1e-3 would rest on
less than one false positive, so it is reported as unresolved unless m/2 >= 3000), and a valid
lower bound on epsilon: because the inclusion bits are independent fair coins, this *is* the
one-run game of Steinke, Nasr, Jagielski 2023 with black-box input canaries — guess "in" for
the k highest scores and "out" for the k lowest (k fixed in advance) and apply Thm 5.2
(:func:`dpcore.auditing.one_run_epsilon_lower_bound`, 95%). Black-box bounds from one run are
expected to be far below the accountants' epsilon.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.dpsgd_whitebox import calibrated_sigma, single_thread, torch_seeded
from audits.results_io import RESULTS, load, run_store, save
from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.auditing import one_run_epsilon_lower_bound
from dpcore.data import load_adult_features
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer

#: the code that determines a run's result (its fingerprint keys the run store)
SOURCES = (
    sys.modules[__name__],
    "dpcore.accountants.pld",
    "dpcore.accountants.rdp",
    "dpcore.auditing.statistics",
    "dpcore.calibration",
    "dpcore.data.adult",
    "dpcore.torch.noise",
    "dpcore.torch.optimizers",
    "dpcore.torch.per_example.fast",
    "dpcore.torch.samplers",
    "dpcore.torch.training",
)


@dataclasses.dataclass(frozen=True)
class MembershipConfig:
    """One audit: data source, sizes, training recipe and the claimed epsilons."""

    dataset: str = "adult"  # "adult" (unit-norm rows with an intercept, as in ERM) or "generated"
    base_size: int = 2000
    canaries: int = 1000
    guesses_each_side: int = 100
    hidden: int = 64
    nonprivate_epochs: int = 300
    shadows: int = 8
    epsilons: tuple[float, ...] = (1.0, 8.0)
    sampling_probability: float = 0.1
    dp_steps: int = 300
    max_grad_norm: float = 1.0
    lr: float = 0.5
    delta: float = 1e-5
    confidence: float = 0.95
    seed: int = 0


def _data(config: MembershipConfig) -> tuple[np.ndarray, np.ndarray]:
    """Features (rows of norm <= 1) and labels in {0, 1}: base set first, then canaries."""
    need = config.base_size + config.canaries
    if config.dataset == "adult":
        (x, y), _ = load_adult_features(intercept=True, unit_norm=True)
        rng = np.random.default_rng(config.seed)
        chosen = rng.permutation(len(y))[:need]
        return x[chosen].astype(np.float32), (y[chosen] == 1).astype(np.int64)
    rng = np.random.default_rng(config.seed)
    x = rng.normal(size=(need, 20)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    flip = rng.random(need) < 0.2  # label noise gives a model something to memorise
    y = ((x[:, 0] > 0) ^ flip).astype(np.int64)
    return x, y


def _model(config: MembershipConfig, inputs: int, seed: int) -> nn.Module:
    with torch_seeded(seed):
        return nn.Sequential(
            nn.Linear(inputs, config.hidden), nn.ReLU(), nn.Linear(config.hidden, 2)
        )


def _train(
    config: MembershipConfig,
    x: np.ndarray,
    y: np.ndarray,
    members: np.ndarray,
    *,
    noise_multiplier: float | None,
    seed: int,
) -> nn.Module:
    """Train on base + included canaries: full-batch Adam (non-private) or dpcore DP-SGD."""
    keep = np.concatenate([np.ones(config.base_size, bool), members.astype(bool)])
    inputs, targets = torch.from_numpy(x[keep]), torch.from_numpy(y[keep])
    model = _model(config, x.shape[1], seed)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    if noise_multiplier is None:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(config.nonprivate_epochs):
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).mean().backward()
            optimizer.step()
        return model
    trainer = DPTrainer.dp_sgd(
        model,
        lr=config.lr,
        inputs=inputs,
        targets=targets,
        loss_fn=loss_fn,
        noise_multiplier=noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(
            len(targets), sampling_probability=config.sampling_probability, seed=seed
        ),
        engine="fast",
        seed=seed,
    )
    trainer.train(steps=config.dp_steps, delta=config.delta, progress=False)
    return model


def _phi(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Logit-scaled confidence of the true label, log(p / (1 - p)), and its loss is -log p."""
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).double()
        log_p = torch.log_softmax(logits, dim=1)
    true = log_p[torch.arange(len(y)), torch.from_numpy(y)]
    other = log_p[torch.arange(len(y)), torch.from_numpy(1 - y)]
    return (true - other).numpy()  # two classes: log(p / (1 - p)) = logit difference


def _summary(scores: np.ndarray, included: np.ndarray, config: MembershipConfig) -> dict[str, Any]:
    members, others = scores[included == 1], scores[included == 0]
    auc = float((members[:, None] > others[None, :]).mean())
    # TPR at the largest threshold whose empirical FPR is <= 1e-2 (descriptive, not a bound).
    cut = np.quantile(others, 1 - 1e-2)
    order = np.argsort(scores)
    k = config.guesses_each_side
    correct = int(included[order[-k:]].sum() + (1 - included[order[:k]]).sum())
    bound = one_run_epsilon_lower_bound(
        canaries=config.canaries,
        guesses=2 * k,
        correct=correct,
        delta=config.delta,
        confidence=config.confidence,
    )
    return {
        "auc": auc,
        "tpr_at_fpr_1e-2": float((members > cut).mean()),
        "tpr_at_fpr_1e-3": None
        if len(others) < 3000
        else float((members > np.quantile(others, 1 - 1e-3)).mean()),
        "correct_guesses": correct,
        "guesses": 2 * k,
        "epsilon_lower": bound.epsilon_lower,
    }


def _offline_lira(
    config: MembershipConfig,
    target_phi: np.ndarray,
    shadows: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """(phi_target - mean_out) / sd_out from the shadow models' (inclusion bits, phi)."""
    out_sums = np.zeros(config.canaries)
    out_squares = np.zeros(config.canaries)
    out_counts = np.zeros(config.canaries)
    for bits, phi in shadows:
        out = bits == 0
        out_sums[out] += phi[out]
        out_squares[out] += phi[out] ** 2
        out_counts[out] += 1
    counts = np.maximum(out_counts, 1)
    mean = out_sums / counts
    spread = np.sqrt(np.maximum(out_squares / counts - mean**2, 0.0))
    # A canary never out in any shadow keeps a neutral score; global spread avoids 0 / 0.
    spread = np.maximum(
        spread, float(np.median(spread[out_counts > 1])) if (out_counts > 1).any() else 1.0
    )
    return np.where(out_counts > 0, (target_phi - mean) / spread, 0.0)


def inclusion_bits(config: MembershipConfig, shadow: int | None) -> np.ndarray:
    """The canaries' inclusion bits of the target model (``shadow`` None) or of one shadow.

    The target's come from a generator seeded by ``config.seed``; shadow k's are the (k + 1)-th
    draw of one seeded by ``config.seed + 1000`` (so each model can be trained on its own).
    """
    if shadow is None:
        return np.random.default_rng(config.seed).integers(0, 2, size=config.canaries)
    rng = np.random.default_rng(config.seed + 1000)
    for _ in range(shadow):
        rng.integers(0, 2, size=config.canaries)
    return rng.integers(0, 2, size=config.canaries)


def noise_multiplier_for(config: MembershipConfig, epsilon: float | None) -> float | None:
    """DP-SGD's PLD-calibrated sigma for the claim ``epsilon`` (None: non-private training)."""
    if epsilon is None:
        return None
    return calibrated_sigma(epsilon, config.delta, config.sampling_probability, config.dp_steps)


def model_phi(
    config: MembershipConfig,
    x: np.ndarray,
    y: np.ndarray,
    epsilon: float | None,
    shadow: int | None,
) -> np.ndarray:
    """Train the target model (``shadow`` None) or one shadow; phi of every canary."""
    bits = inclusion_bits(config, shadow)
    seed = config.seed if shadow is None else config.seed + 100 + shadow
    sigma = noise_multiplier_for(config, epsilon)
    model = _train(config, x, y, bits, noise_multiplier=sigma, seed=seed)
    return _phi(model, x[config.base_size :], y[config.base_size :])


def summarise(
    config: MembershipConfig,
    epsilon: float | None,
    target_phi: np.ndarray,
    shadow_phis: list[np.ndarray],
) -> dict[str, Any]:
    """The result row of one target model from its phi and its shadows' (without seconds)."""
    n_train = config.base_size + config.canaries / 2  # the expected training-set size
    sigma = noise_multiplier_for(config, epsilon)
    upper: dict[str, float | None] = {"pld": None, "rdp": None}
    q, steps = config.sampling_probability, config.dp_steps
    if sigma is not None:
        event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
        upper = {
            "pld": PldAccountant().compose(event).get_epsilon(config.delta),
            "rdp": RdpAccountant().compose(event).get_epsilon(config.delta),
        }
    included = inclusion_bits(config, None)
    rows = {"loss_threshold": _summary(target_phi, included, config)}  # -loss rises with phi
    if config.shadows > 0:
        shadows = [(inclusion_bits(config, k), phi) for k, phi in enumerate(shadow_phis)]
        rows["offline_lira"] = _summary(
            _offline_lira(config, target_phi, shadows), included, config
        )
    setting = {
        "dataset": config.dataset,
        "training": "non-private" if epsilon is None else f"DP-SGD, claimed eps {epsilon:g}",
        "noise_multiplier": sigma,
        "training_set_size_expected": n_train,
        "canaries": config.canaries,
        "shadows": config.shadows,
    }
    return {
        "audit": "membership",
        "setting": setting,
        "attacks": rows,
        "epsilon_lower": max(r["epsilon_lower"] for r in rows.values()),
        "confidence": config.confidence,
        "epsilon_upper": {
            k: (v if v is None or math.isfinite(v) else None) for k, v in upper.items()
        }
        if epsilon is not None
        else {"pld": None, "rdp": None, "note": "non-private: no finite epsilon"},
        "seed": config.seed,
    }


def audit_one(config: MembershipConfig, epsilon: float | None) -> dict[str, Any]:
    """Train the target model (non-private if ``epsilon`` is None) and score every canary."""
    start = time.perf_counter()
    x, y = _data(config)
    phis = [model_phi(config, x, y, epsilon, None)]
    phis += [model_phi(config, x, y, epsilon, k) for k in range(config.shadows)]
    row = summarise(config, epsilon, phis[0], phis[1:])
    return {**row, "seconds": time.perf_counter() - start}


@dataclasses.dataclass(frozen=True)
class MembershipTraining:
    """One model of the membership audit: the target (``shadow`` None) or one shadow model,
    trained for the claim ``epsilon`` (None: non-private).

    ``config`` is the audit's setting with ``epsilons`` emptied, so that adding a claim leaves
    the stored models of the others valid.
    """

    epsilon: float | None
    shadow: int | None
    config: MembershipConfig


def execute(spec: MembershipTraining) -> dict[str, Any]:
    """Train one model (one torch thread); phi of every canary and the seconds, as JSON values."""
    start = time.perf_counter()
    x, y = _data(spec.config)
    with single_thread():
        phi = model_phi(spec.config, x, y, spec.epsilon, spec.shadow)
    return {"phi": phi.tolist(), "seconds": time.perf_counter() - start}


def specs(config: MembershipConfig) -> list[list[MembershipTraining]]:
    """Every row's models, rows in order (non-private, then each claim): target, then shadows."""
    setting = dataclasses.replace(config, epsilons=())
    return [
        [MembershipTraining(epsilon, shadow, setting) for shadow in (None, *range(config.shadows))]
        for epsilon in (None, *config.epsilons)
    ]


def run(
    config: MembershipConfig = MembershipConfig(),
    *,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Non-private target, then DP-SGD targets at the claimed epsilons; saves membership.json.

    Each model (every target and its shadows) is one run of :func:`dpcore.runs.run_many`, kept
    in the audit's run store (``results/runs/membership``): a killed audit resumes where it
    stopped. The attacks are scored here, from the stored phi; a row's seconds are its models'
    and its scoring's.

    Args:
        config: the data, recipe and claimed epsilons.
        executor: where the runs go (see :func:`dpcore.runs.run_many`); the rows are the same
            for every executor.

    Raises:
        RunsFailedError: some runs still failed after a retry.
    """
    units = specs(config)
    every = [unit for models in units for unit in models]
    store = run_store("membership", *SOURCES)
    results = dict(
        zip(every, run_many(execute, every, executor=executor, store=store), strict=True)
    )
    rows = []
    for epsilon, (target, *shadows) in zip((None, *config.epsilons), units, strict=True):
        start = time.perf_counter()
        phis = [np.asarray(results[model]["phi"]) for model in (target, *shadows)]
        row = summarise(config, epsilon, phis[0], phis[1:])
        spent = sum(results[model]["seconds"] for model in (target, *shadows))
        rows.append({**row, "seconds": spent + time.perf_counter() - start})
    save("membership", rows, dataclasses.asdict(config))
    return rows


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "inf"


def write_report() -> None:
    """Markdown table from the saved results."""
    rows = load("membership")
    lines = [
        "# Membership inference with input canaries (one run, black-box)",
        "",
        "| training | attack | AUC | TPR @ FPR 1e-2 | TPR @ FPR 1e-3 | correct / guesses |"
        " eps_lb (95%) | PLD eps | RDP eps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for name, attack in row["attacks"].items():
            tpr3 = attack["tpr_at_fpr_1e-3"]
            upper = row["epsilon_upper"]
            lines.append(
                f"| {row['setting']['training']} | {name} | {attack['auc']:.3f} | "
                f"{attack['tpr_at_fpr_1e-2']:.3f} | "
                f"{'unresolved (< 3000 non-members)' if tpr3 is None else f'{tpr3:.3f}'} | "
                f"{attack['correct_guesses']} / {attack['guesses']} | "
                f"{attack['epsilon_lower']:.3f} | {_number(upper.get('pld'))} | "
                f"{_number(upper.get('rdp'))} |"
            )
    lines += [
        "",
        "Input canaries are included with probability 1/2 each, so the bound is Steinke et al.'s",
        "one-run bound (Thm 5.2) with k guesses on each side fixed in advance; TPR values are",
        "descriptive (empirical rates at an empirical threshold), not bounds.",
    ]
    (RESULTS / "membership.md").write_text("\n".join(lines) + "\n")
