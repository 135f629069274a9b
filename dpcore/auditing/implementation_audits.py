"""Audit a DP-SGD implementation through its adapter (:mod:`dpcore.auditing.implementation`).

:func:`audit_implementation` runs every audit below on ``seeds`` seeds and decides them together
(:mod:`dpcore.auditing.verdicts`: seeds combined by Fisher, audits by Holm at ``level``, so a
correct implementation is flagged anywhere with probability at most ``level``). Every audit
gives a p-value; the epsilon audits also give an epsilon lower bound where its assumptions hold.

* ``whitebox_per_step`` and the structural tests (:func:`whitebox_audit`), on the settings'
  task (an MLP with biases and a rare class by default; ``task="linear"`` for the one-tensor
  regression): ``runs`` runs with canary 0 in the dataset and ``runs`` without, plus
  ``tiny_runs`` runs on a tiny dataset (``tiny_records`` records, so that lots are often empty).
  The auditor recomputes every step (:mod:`dpcore.auditing.structural`); the canary's read-back
  s_t (N(1[canary in lot], sigma^2) per step when clipped) at the steps whose lot held it are the
  positives, every step of the canary-free runs the negatives. The GDP route with Gaussian
  scores (:func:`dpcore.auditing.gaussian_scores.gaussian_mu_lower_bound`: exact t and chi^2
  intervals) gives mu_lb, and the claimed Poisson sampling composes it to epsilon_lb (Nasr et
  al. 2023, arXiv 2302.07956); the held-out threshold route's bound is kept beside it
  (``epsilon_lower_threshold``). Its p-value (the threshold route's) tests mu <= mu*, the
  per-step mu whose composition is the claimed epsilon; ``runs`` sets the compute. The
  epsilon bounds are printed only when the steps are independent (the noise correlation test
  does not reject at 1 - confidence) and the lots were Poisson as the accounting assumes;
  otherwise the row keeps its p-value and says "not an ε bound".
  Rows: ``noise_calibration``, ``noise_per_tensor``, ``canary_per_tensor``,
  ``noise_correlation``, ``empty_lots``, ``sampler_lots`` (which sampler the lots came from).
* :func:`one_run_audit` — Steinke, Nasr, Jagielski 2023 (arXiv 2305.08846, Thm 5.2) on the
  linear task: m canaries each in the dataset with probability 1/2, one run, score_i = sum_t
  s_t,i; "in" for the highest, "out" for the lowest. It trusts nothing (its bound holds whatever
  the sampler); its p-value is the theorem's p(epsilon) at the claimed epsilon. Beside it,
  ``epsilon_lower_fdp``: the f-DP (Gaussian) one-run bound of Mahloujifar, Melis, Chaudhuri
  (ICML 2025; :func:`dpcore.auditing.one_run_fdp.one_run_gdp_lower_bound`) on the same guesses,
  a bound for mechanisms that are mu-GDP for some mu.
* :func:`sampler_audit` — one canary and a probe run at sigma = 0.01: s_t shows, step by step,
  whether the canary was used, with no access to the sampler. Under Poisson sampling the
  inclusion count in each window of k = round(1/q) steps is Bin(k, q), so ``ones`` (windows
  with exactly one inclusion) ~ Bin(E, k q (1 - q)^(k-1)): an exact two-sided binomial test.
  It names what it saw: ``shuffle`` (one use per window), ``replayed lots`` (inclusions
  repeating with the window's period) or ``poisson-like``.

The audits live in their own modules (all their names importable from here):
:mod:`~dpcore.auditing.audit_settings` (:class:`AuditSettings`, the defaults, the certified
epsilon), :mod:`~dpcore.auditing.audit_runs` (training an adapter, the task, a row),
:mod:`~dpcore.auditing.per_step_claim` (mu* and the per-step p-value),
:mod:`~dpcore.auditing.implementation_whitebox`, :mod:`~dpcore.auditing.implementation_one_run`
and :mod:`~dpcore.auditing.implementation_sampler`; this module runs them together.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dpcore.auditing.audit_runs import _task as _task
from dpcore.auditing.audit_runs import _train as _train
from dpcore.auditing.audit_settings import (
    ONE_RUN_SETTINGS,
    PER_STEP_SETTINGS,
    AuditSettings,
    _open_unit,
    certified_epsilon,
)
from dpcore.auditing.implementation import Implementation
from dpcore.auditing.implementation_one_run import one_run_audit
from dpcore.auditing.implementation_sampler import sampler_audit
from dpcore.auditing.implementation_whitebox import whitebox_audit
from dpcore.auditing.per_step_claim import per_step_p_value as per_step_p_value
from dpcore.auditing.shipping import check_shippable
from dpcore.auditing.structural import AuditNotApplicableError
from dpcore.auditing.verdicts import FLAGGED, WHITEBOX_AUDITS, AuditReport, summarise
from dpcore.errors import InvalidParameterError
from dpcore.runs.executors import ExecutorChoice, open_executor
from dpcore.validation import check_count

__all__ = [
    "FLAGGED",
    "ONE_RUN_SETTINGS",
    "PER_STEP_SETTINGS",
    "AuditNotApplicableError",
    "AuditSettings",
    "audit_implementation",
    "audit_seed",
    "certified_epsilon",
    "one_run_audit",
    "sampler_audit",
    "whitebox_audit",
]


def _not_applicable(
    name: str, audits: Iterable[str], seed: int, reason: str
) -> list[dict[str, Any]]:
    return [
        {"implementation": name, "audit": audit, "seed": seed, "not_applicable": reason}
        for audit in audits
    ]


def audit_seed(
    implementation: Implementation,
    *,
    per_step: AuditSettings = PER_STEP_SETTINGS,
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seed: int = 0,
    executor: Any = None,
) -> list[dict[str, Any]]:
    """Every audit of one implementation at one seed (a "not applicable" row where one cannot
    run): the per-step and structural rows, the one-run row and the sampler row.

    The one-run and sampler audits run in the one-run setting (sigma, T), on the linear task.
    ``executor`` trains the per-step audit's runs (see :func:`whitebox_audit`).
    """
    check_count("seed", seed)
    rows: list[dict[str, Any]] = []
    try:
        rows += whitebox_audit(implementation, per_step, seed=seed, executor=executor)
    except AuditNotApplicableError as reason:
        rows += _not_applicable(implementation.name, WHITEBOX_AUDITS, seed, str(reason))
    rows.append(one_run_audit(implementation, one_run, seed=seed))
    rows.append(sampler_audit(implementation, one_run, seed=seed))
    return rows


@contextlib.contextmanager
def _opened(executor: Any) -> Iterator[Any]:
    """A named executor opened for the call (None for in-process), an object as it is."""
    if isinstance(executor, str | ExecutorChoice):
        with open_executor(executor) as opened:
            yield opened
    else:
        yield executor


def _progress(items: Sequence[int], show: bool) -> Iterable[int]:
    if not show:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - the progress extra is missing
        return items
    bar: Iterable[int] = tqdm(items, desc="implementation audit", unit="seed")
    return bar


def audit_implementation(
    implementation: Implementation,
    *,
    per_step: AuditSettings = PER_STEP_SETTINGS,
    one_run: AuditSettings = ONE_RUN_SETTINGS,
    seeds: int = 1,
    seed_offset: int = 0,
    level: float = 0.05,
    progress: bool = False,
    on_seed: Callable[[int, list[dict[str, Any]]], None] | None = None,
    executor: Any = None,
) -> AuditReport:
    """Audit an implementation: every audit on seeds ``seed_offset .. seed_offset + seeds - 1``.

    Returns an :class:`~dpcore.auditing.verdicts.AuditReport`: one summary row per audit (a
    list of dicts), decided together by Holm at ``level`` (a correct implementation gets any
    flag with probability at most ``level``), and every seed's rows in ``seed_rows``. Each row
    has ``implementation``, ``audit``, ``claimed_epsilon`` (the implementation's own, None if it
    reports none), ``certified_epsilon`` (dpcore's PLD upper bound for the claimed q, sigma, T),
    ``epsilon_lower`` (95 % lower bound of the first seed, None for the p-value audits and where
    the bound's assumptions fail: ``bound_note`` says why), ``p_value``, ``verdict``, ``seeds``
    and ``false_alarm_rate`` (the default call's, measured on correct implementations).

    Args:
        implementation: the adapter (:class:`~dpcore.auditing.implementation.Implementation`).
        per_step: setting of the per-step and structural audits.
        one_run: setting of the one-run and sampler audits.
        seeds: how many seeds (>= 1).
        seed_offset: the first seed (>= 0), so that calls can split or resume seeds.
        level: family-wise error of the call, in (0, 1).
        progress: show a progress bar over the seeds (tqdm, if installed).
        on_seed: called with (seed, that seed's rows) as each seed finishes.
        executor: where the per-step audit's training runs go (:func:`dpcore.runs.run_many`'s
            choices: None in this process, ``"processes:N"``, ``"dask[:ADDRESS]"``,
            ``"ray[:ADDRESS]"``, ``"slurm"``, or an object with ``submit()``), opened once for
            the call. The rows are the same whatever runs them (each run has its own seed); a
            named executor pickles ``implementation`` into its workers.

    Raises:
        InvalidParameterError: a parameter out of range (naming it), ``executor`` not a valid
            choice, or an implementation that does not pickle for a named executor.
        EngineMissingError: the named engine is not installed.

    Example: see "Audit your own DP-SGD" in the guide's Audits page (``docs/guide/audits.md``).
    """
    check_count("seeds", seeds, minimum=1)
    check_count("seed_offset", seed_offset)
    _open_unit("level", level)
    for name, value in (("per_step", per_step), ("one_run", one_run)):
        if not isinstance(value, AuditSettings):
            raise InvalidParameterError(name, "an AuditSettings", value)
    check_shippable(implementation, executor)
    rows: list[dict[str, Any]] = []
    with _opened(executor) as opened:
        for seed in _progress(range(seed_offset, seed_offset + seeds), progress):
            seed_rows = audit_seed(
                implementation, per_step=per_step, one_run=one_run, seed=seed, executor=opened
            )
            rows += seed_rows
            if on_seed is not None:
                on_seed(seed, seed_rows)
    from dpcore.auditing.false_alarms import MEASURED

    return AuditReport(summarise(rows, level, MEASURED), rows, level, MEASURED)
