"""Tests for the structural DP-SGD bugs, from parameter traces with known lots.

The auditor knows the model, the loss, the data, the weights at every step and (from the
adapter) each lot, so it recomputes what a correct DP-SGD step adds (Abadi et al. 2016, Alg.
1): the lot's gradients clipped *together over every tensor* to C, summed, N(0, sigma^2 C^2)
noise on every coordinate, divided by the divisor b. :func:`analyse_run` reads, per step,

    r_t = -(theta_t - theta_{t-1}) b / (lr C) - S_t / C  ~  N(0, sigma^2 I) independently,

and the canary's exactly known clipped contribution g_t / C (per tensor). Each test below
states its null distribution (the correct DP-SGD the claim describes) and returns a p-value:

* :func:`canary_per_tensor_test`: the canary's contribution read back per tensor k,
  v_t,k = <u_t,k, e_t,k> with u_t the residual before the canary is subtracted and e_t,k the
  unit direction of g_t,k, is N(||g_t,k|| / C, sigma^2) at every step whose lot holds it; the
  sum of the deviations over n such steps is N(0, n sigma^2) exactly. Per-tensor clipping (each
  tensor to C: up to C sqrt(L)) and class weights applied after clipping shift it up.
* :func:`noise_per_tensor_test`: sum of r_t,k^2 / sigma^2 over a tensor (or a parameter group,
  ``weights`` / ``biases``) is chi^2 with as many degrees of freedom; two-sided (a group left
  without noise has a statistic near 0).
* :func:`noise_correlation_test`: lag-1 products r_t,j r_t+1,j have mean 0; the
  self-normalised sum is N(0, 1) asymptotically. A noise draw reused across steps gives
  z of order sqrt(count).
* :func:`empty_lot_test`: at steps whose lot is empty, r_t = -(theta_t - theta_{t-1}) b /
  (lr C) is N(0, sigma^2 I): chi^2, two-sided (an implementation that skips the noise of an
  empty lot but counts the step has r_t = 0).
* :func:`lots_sampler_test`: which sampler the lots came from (Poisson, shuffled epochs,
  lots replayed every epoch, fixed-size batches) and a p-value for the sampler the accounting
  assumes.

Several p-values of one test (tensors, groups) are combined by Bonferroni (the minimum times
their number), which is valid under any dependence.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special, stats

from dpcore.auditing.implementation import AuditTask, Claim, Observer, derived_divisor
from dpcore.auditing.models import clipped_sum
from dpcore.errors import StateError


class AuditNotApplicableError(StateError):
    """The adapter does not expose what this audit needs (e.g. lot membership)."""


@dataclasses.dataclass(frozen=True)
class RunAnalysis:
    """One run read back by the auditor (see the module doc); arrays have one row per step.

    ``residuals`` (T, P): r_t in units of C. ``canary_norms`` (T, L): ||g_t,k|| / C of the
    clipped canary per tensor; ``canary_reads`` (T, L): v_t,k; ``canary_total`` (T,): the
    projection of u_t on the whole canary direction (the per-step score); ``canary_size`` (T,):
    ||g_t|| / C; ``in_lot`` (T,): the canary was in the step's lot; ``empty`` (T,): empty lot.
    """

    residuals: np.ndarray
    canary_norms: np.ndarray
    canary_reads: np.ndarray
    canary_total: np.ndarray
    canary_size: np.ndarray
    in_lot: np.ndarray
    empty: np.ndarray
    offsets: tuple[tuple[int, int], ...]
    divisor: float


def analyse_run(
    task: AuditTask, claim: Claim, observer: Observer, *, slot: int | None = 0
) -> RunAnalysis:
    """Recompute every step of a run (module doc); ``slot`` is the canary read (None: none).

    Raises:
        AuditNotApplicableError: the adapter reported no lots.
    """
    if observer.lots is None:
        raise AuditNotApplicableError(
            f"{claim.implementation} does not report which records each step used"
        )
    spec = task.spec
    offsets = tuple(spec.offsets())
    weights = np.stack(observer.weights)
    x = task.features.astype(np.float64)
    y = task.targets
    c, lr = task.max_grad_norm, task.learning_rate
    divisor = derived_divisor(task, claim, observer)
    steps, layers = observer.steps, len(offsets)
    residuals = np.empty((steps, spec.size))
    norms = np.zeros((steps, layers))
    reads = np.zeros((steps, layers))
    total = np.zeros(steps)
    size = np.zeros(steps)
    in_lot = np.zeros(steps, dtype=bool)
    empty = np.zeros(steps, dtype=bool)
    row = None
    if slot is not None and slot in task.canary_slots:
        row = task.canary_rows[task.canary_slots.index(slot)]
    for t, lot in enumerate(observer.lots):
        parameters = spec.unflatten(weights[t])
        summed = np.concatenate(
            [s.reshape(-1) for s in clipped_sum(spec, parameters, x[lot], y[lot], c)]
        )
        step = weights[t + 1] - weights[t]
        residuals[t] = -step * divisor / (lr * c) - summed / c
        empty[t] = lot.size == 0
        if slot is None or task.canary_inputs is None or task.canary_targets is None:
            continue
        canary = (
            np.concatenate(
                [
                    s.reshape(-1)
                    for s in clipped_sum(
                        spec,
                        parameters,
                        task.canary_inputs[slot : slot + 1],
                        task.canary_targets[slot : slot + 1],
                        c,
                    )
                ]
            )
            / c
        )
        in_lot[t] = row is not None and bool(np.any(lot == row))
        before = residuals[t] + canary * in_lot[t]  # u_t: the canary not subtracted
        for k, (a, b) in enumerate(offsets):
            norm = float(np.linalg.norm(canary[a:b]))
            norms[t, k] = norm
            reads[t, k] = float(before[a:b] @ canary[a:b]) / norm if norm > 0 else 0.0
        size[t] = float(np.linalg.norm(canary))
        total[t] = float(before @ canary) / size[t] if size[t] > 0 else 0.0
    return RunAnalysis(residuals, norms, reads, total, size, in_lot, empty, offsets, divisor)


def _two_sided_chi2(statistic: float, dof: int) -> float:
    if dof == 0:
        return 1.0
    return float(min(1.0, 2 * min(stats.chi2.sf(statistic, dof), stats.chi2.cdf(statistic, dof))))


def _two_sided_normal(z: float) -> float:
    return float(min(1.0, 2 * stats.norm.sf(abs(z))))


def canary_per_tensor_test(
    runs: Sequence[RunAnalysis], noise_multiplier: float, names: Sequence[str]
) -> dict[str, Any]:
    """Per-tensor canary contributions against their exact values (module doc); Bonferroni."""
    norms = np.concatenate([r.canary_norms[r.in_lot] for r in runs])
    reads = np.concatenate([r.canary_reads[r.in_lot] for r in runs])
    n = norms.shape[0]
    if n == 0:
        return {"p_value": 1.0, "canary_steps": 0, "note": "the canary was in no lot"}
    z = (reads - norms).sum(axis=0) / (noise_multiplier * math.sqrt(n))
    p_each = [_two_sided_normal(float(v)) for v in z]
    ratio = reads.sum(axis=0) / np.maximum(norms.sum(axis=0), 1e-300)
    return {
        "p_value": min(1.0, len(p_each) * min(p_each)),
        "canary_steps": int(n),
        "tensors": {
            name: {
                "z": float(zk),
                "p_value": pk,
                "read_over_expected": float(rk),
                "expected_share_of_C": float(norms[:, k].mean()),
            }
            for k, (name, zk, pk, rk) in enumerate(zip(names, z, p_each, ratio, strict=True))
        },
    }


def noise_per_tensor_test(
    runs: Sequence[RunAnalysis],
    noise_multiplier: float,
    names: Sequence[str],
    groups: dict[str, tuple[int, ...]],
) -> dict[str, Any]:
    """chi^2 of the residual noise per tensor and per parameter group; Bonferroni over all."""
    residuals = np.concatenate([r.residuals for r in runs]) / noise_multiplier
    offsets = runs[0].offsets
    parts: dict[str, list[int]] = {name: [k] for k, name in enumerate(names)}
    if len(groups) > 1:
        parts.update({f"group {g}": list(members) for g, members in groups.items()})
    out: dict[str, dict[str, float]] = {}
    for label, members in parts.items():
        values = np.concatenate([residuals[:, offsets[k][0] : offsets[k][1]] for k in members], 1)
        chi2 = float(np.sum(values**2))
        out[label] = {
            "p_value": _two_sided_chi2(chi2, values.size),
            "noise_std_ratio": math.sqrt(chi2 / values.size) if values.size else math.nan,
        }
    smallest = min(v["p_value"] for v in out.values())
    return {"p_value": min(1.0, len(out) * smallest), "parts": out}


def noise_calibration_test(runs: Sequence[RunAnalysis], noise_multiplier: float) -> dict[str, Any]:
    """chi^2 of all the residual noise against N(0, sigma^2) (two-sided)."""
    noise = np.concatenate([r.residuals for r in runs]).reshape(-1) / noise_multiplier
    chi2 = float(np.sum(noise**2))
    return {
        "p_value": _two_sided_chi2(chi2, noise.size),
        "noise_std_ratio": math.sqrt(chi2 / noise.size),
        "residuals": int(noise.size),
    }


def noise_correlation_test(runs: Sequence[RunAnalysis]) -> dict[str, Any]:
    """Lag-1 correlation of the residual noise across steps (self-normalised, two-sided)."""
    products = np.concatenate(
        [(r.residuals[1:] * r.residuals[:-1]).reshape(-1) for r in runs if r.residuals.shape[0] > 1]
    )
    scale = math.sqrt(float(np.sum(products**2)))
    z = float(products.sum()) / scale if scale > 0 else 0.0
    squares = np.concatenate([r.residuals.reshape(-1) ** 2 for r in runs])
    correlation = (
        float(products.sum())
        / max(float(squares.sum()), 1e-300)
        * (squares.size / max(products.size, 1))
    )
    return {"p_value": _two_sided_normal(z), "z": z, "lag1_correlation": correlation}


def empty_lot_test(runs: Sequence[RunAnalysis], noise_multiplier: float) -> dict[str, Any]:
    """chi^2 of the parameter moves at empty lots against N(0, sigma^2) noise (two-sided)."""
    moves = [r.residuals[r.empty] for r in runs]
    values = np.concatenate([m.reshape(-1) for m in moves]) / noise_multiplier
    count = int(sum(m.shape[0] for m in moves))
    if count == 0:
        return {"p_value": 1.0, "empty_lots": 0, "note": "no empty lot was drawn"}
    chi2 = float(np.sum(values**2))
    return {
        "p_value": _two_sided_chi2(chi2, values.size),
        "empty_lots": count,
        "noise_std_ratio": math.sqrt(chi2 / values.size),
    }


#: The samplers :func:`classify_lots` names.
SAMPLER_KINDS = ("poisson", "shuffle", "replayed lots", "fixed-size batches")


def _epochs_partition(lots: Sequence[np.ndarray], period: int, dataset_size: int) -> bool:
    """Whether every full block of ``period`` lots uses each record at most once (and, when
    the block covers the data, exactly once)."""
    blocks = len(lots) // period
    for e in range(blocks):
        block = np.concatenate(lots[e * period : (e + 1) * period])
        if np.unique(block).size != block.size:
            return False
    return blocks > 0


def classify_lots(lots: Sequence[np.ndarray], dataset_size: int, q: float) -> str:
    """Which sampler drew these lots (one of :data:`SAMPLER_KINDS`).

    With B the largest lot: lots that partition every epoch of ceil(N / B) steps (the last lot
    of an epoch may be short) or of N // B steps of B each (last partial lot dropped) are
    ``shuffle``, unless each epoch repeats the previous one (``replayed lots``). Lots that
    repeat with the period of an epoch over at least two epochs (round(1 / q) steps for lots of
    varying size) are ``replayed lots``. Other lots of one size: ``fixed-size batches``; of
    varying size: ``poisson``.
    """
    sizes = np.array([lot.size for lot in lots])
    if sizes.size == 0 or sizes.max() == 0:
        return "poisson"
    largest = int(sizes.max())
    candidates = [math.ceil(dataset_size / largest), max(1, dataset_size // largest)]
    if not np.all(sizes == largest):
        candidates.append(max(1, round(1 / q)))
    for period in dict.fromkeys(candidates):
        repeats = all(np.array_equal(lots[t], lots[t - period]) for t in range(period, len(lots)))
        if len(lots) >= 2 * period and repeats:
            return "replayed lots"
    for period in candidates[:2]:
        block_sizes = sizes[: (len(lots) // period) * period].reshape(-1, period)
        shaped = bool(block_sizes.size) and bool(np.all(block_sizes[:, :-1] == largest))
        if shaped and _epochs_partition(lots, period, dataset_size):
            return "shuffle"
    return "fixed-size batches" if np.all(sizes == largest) else "poisson"


def lots_sampler_test(
    lots_of_runs: Sequence[Sequence[np.ndarray]], dataset_size: int, claim: Claim
) -> dict[str, Any]:
    """The sampler seen in the lots and a p-value for the one the accounting assumes.

    Poisson (each record independently with probability q per step): the lot sizes are
    Bin(N, q) and each record's count over T steps Bin(T, q); both dispersion statistics are
    approximately chi^2 (two-sided); lots repeating with an epoch's period have probability
    prod_t q^|L_t| (1 - q)^(N - |L_t|) under Poisson. Shuffle: lots of one size partitioning each
    epoch (p = 0 otherwise; a replayed epoch has probability (B!)^E / N! per repeat). Fixed:
    lots of one size. p-values of several runs are combined by Bonferroni. ``sampler_seen`` is
    the kind most runs show (a tie: the first in :data:`SAMPLER_KINDS`).
    """
    q = claim.sampling_probability
    n = dataset_size
    kinds = [classify_lots(lots, n, q) for lots in lots_of_runs]
    p_values = []
    for lots, kind in zip(lots_of_runs, kinds, strict=True):
        sizes = np.array([lot.size for lot in lots], dtype=np.float64)
        if claim.accounting_assumes == "poisson":
            variance = n * q * (1 - q)
            dispersion = float(np.sum((sizes - n * q) ** 2) / variance)
            counts = np.bincount(np.concatenate([*lots, np.zeros(0, np.int64)]), minlength=n)
            t = len(lots)
            record = float(np.sum((counts - t * q) ** 2) / (t * q * (1 - q)))
            p = min(1.0, 2 * min(_two_sided_chi2(dispersion, t), _two_sided_chi2(record, n)))
            if kind == "replayed lots":
                period = max(1, round(1 / q))
                log_p = sum(s * math.log(q) + (n - s) * math.log1p(-q) for s in sizes[period:])
                p = min(p, math.exp(max(log_p, -745.0)))
        elif claim.accounting_assumes == "shuffle":
            if kind == "shuffle":
                p = 1.0
            elif kind == "replayed lots" and sizes.size and sizes[0] > 0:
                b = int(sizes[0])
                epoch = max(1, n // b)
                repeats = len(lots) // epoch - 1
                log_one = epoch * special.gammaln(b + 1) - special.gammaln(n + 1)
                p = math.exp(max(repeats * float(log_one), -745.0))
            else:
                p = 0.0
        else:
            p = 1.0 if kind != "poisson" else 0.0
        p_values.append(p)
    # the most frequent kind; a tie goes to the first in SAMPLER_KINDS (max over a set would
    # depend on the string hash seed, so the label changed from one process to the next)
    seen = max(SAMPLER_KINDS, key=kinds.count)
    return {
        "p_value": min(1.0, len(p_values) * min(p_values)),
        "sampler_seen": seen,
        "samplers_per_run": kinds,
    }
