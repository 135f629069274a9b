"""Saving audit results (one JSON list per audit, with provenance beside it)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from dpcore.atomic import atomic_write_text
from dpcore.provenance import provenance
from dpcore.runs import RunStore, code_fingerprint

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
#: the audits' run stores (git-ignored): one folder per audit, one per run inside
RUNS = RESULTS / "runs"


def run_store(audit: str, *sources: ModuleType | str | Path) -> RunStore:
    """The run store of ``audit`` (``results/runs/<audit>``), keyed by the code of ``sources``.

    Pass the modules that compute the audit's runs (its own module and the parts of dpcore it
    relies on): an edit to any of them gives new run folders, so stale results are not reused.
    """
    return RunStore(RUNS / audit, code=code_fingerprint(*sources))


def save(audit: str, rows: list[dict[str, Any]], config: dict[str, Any]) -> Path:
    """Write ``results/<audit>.json`` (the rows) and ``results/<audit>.meta.json`` atomically."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{audit}.json"
    atomic_write_text(path, json.dumps(rows, indent=1, allow_nan=False) + "\n")
    meta = provenance(root=ROOT, audit=audit, config=config)
    atomic_write_text(RESULTS / f"{audit}.meta.json", json.dumps(meta, indent=1) + "\n")
    return path


def load(audit: str) -> list[dict[str, Any]]:
    """Read what :func:`save` wrote."""
    return list(json.loads((RESULTS / f"{audit}.json").read_text()))
