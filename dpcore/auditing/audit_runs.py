"""What the implementation audits share: train an adapter on a task (checking its steps),
build the audited task from the settings, and one seed's result row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpcore.auditing.audit_settings import (
    AuditSettings,
    certified_epsilon,
)
from dpcore.auditing.implementation import (
    AuditTask,
    Claim,
    Implementation,
    Observer,
    make_mlp_task,
    make_task,
)
from dpcore.auditing.structural import AuditNotApplicableError
from dpcore.auditing.verdicts import FLAGGED
from dpcore.errors import InvalidParameterError


def _train(implementation: Implementation, task: AuditTask) -> tuple[Observer, Claim]:
    observer = Observer(task.initial_weight, task.spec)
    claim = implementation.train(task, observer)
    if observer.steps != task.steps:
        raise InvalidParameterError("observed steps", f"= {task.steps}", observer.steps)
    return observer, claim


def _task(
    settings: AuditSettings, canaries: Sequence[bool], seed: int, **changes: Any
) -> AuditTask:
    arguments: dict[str, Any] = {
        "real_records": settings.real_records,
        "real_features": settings.real_features,
        "canaries": canaries,
        "sampling_probability": settings.sampling_probability,
        "noise_multiplier": settings.noise_multiplier,
        "max_grad_norm": settings.max_grad_norm,
        "learning_rate": settings.learning_rate,
        "steps": settings.steps,
        "delta": settings.delta,
        "seed": seed,
    }
    arguments.update(changes)
    if arguments.pop("kind", settings.task) == "mlp":
        arguments.update(
            hidden=settings.hidden, classes=settings.classes, rare_records=settings.rare_records
        )
        arguments["rare_records"] = min(arguments["rare_records"], arguments["real_records"])
        return make_mlp_task(**arguments)
    return make_task(**arguments)


def _reference(claim: Claim) -> float:
    """The epsilon a bound is compared with: the implementation's own, else dpcore's."""
    return claim.epsilon if claim.epsilon is not None else certified_epsilon(claim)["pld"]


def _row(
    audit: str,
    claim: Claim,
    settings: AuditSettings,
    seed: int,
    *,
    p_value: float,
    lower: float | None = None,
    **details: Any,
) -> dict[str, Any]:
    """One seed's row: the claim, dpcore's certified epsilon, the p-value and a raw verdict
    (the p-value against 1 - confidence alone; the call's decision is Holm's)."""
    certified = certified_epsilon(claim)
    return {
        "implementation": claim.implementation,
        "audit": audit,
        "claimed_epsilon": claim.epsilon,
        "claimed_accountant": claim.accountant,
        "certified_epsilon": certified["pld"],
        "certified": certified,
        "epsilon_lower": lower,
        "p_value": float(p_value),
        "confidence": settings.confidence,
        "verdict": FLAGGED[audit] if p_value < 1 - settings.confidence else "consistent",
        "seed": seed,
        "claim": dataclasses.asdict(claim),
        **details,
    }


def _lots(observer: Observer, claim: Claim) -> list[np.ndarray]:
    if observer.lots is None:
        raise AuditNotApplicableError(
            f"{claim.implementation} does not report which records each step used"
        )
    return observer.lots
