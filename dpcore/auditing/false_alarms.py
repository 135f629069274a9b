"""The false-alarm rate of the default :func:`~dpcore.auditing.audit_implementation` call,
measured on correct implementations (written by ``python -m audits.implementations.false_alarms``;
not typed by hand). ``MEASURED`` is None until it has been measured."""

from __future__ import annotations

from typing import Any

MEASURED: dict[str, Any] | None = None
