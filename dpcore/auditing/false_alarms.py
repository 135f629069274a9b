"""The false-alarm rate of the default :func:`~dpcore.auditing.audit_implementation` call,
measured on correct implementations (written by ``python -m audits.implementations.false_alarms``;
not typed by hand). ``MEASURED`` is None until it has been measured."""

from __future__ import annotations

from typing import Any

MEASURED: dict[str, Any] | None = {
    "commit": "c28cd651ad450be9703db90d5e315336dbcf39fd-dirty",
    "flagged_runs": 8,
    "interval_95": [0.017424808994480595, 0.07729196822601608],
    "level": 0.05,
    "rate": 0.04,
    "runs": 200,
}
