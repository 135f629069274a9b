"""The false-alarm rate of the default :func:`~dpcore.auditing.audit_implementation` call,
measured on correct implementations (written by ``python -m audits.implementations.false_alarms``;
not typed by hand). ``MEASURED`` is None until it has been measured."""

from __future__ import annotations

from typing import Any

MEASURED: dict[str, Any] | None = {
    "commit": "4a41da39d6e8c4eb58c84b2cf3bd8d22cf7e4ff6",
    "flagged_runs": 7,
    "interval_95": [0.014185525898419246, 0.0707809983509772],
    "level": 0.05,
    "rate": 0.035,
    "runs": 200,
}
