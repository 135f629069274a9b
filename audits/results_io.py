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


def stamp(**extra: Any) -> dict[str, Any]:
    """The provenance of results made now (:func:`dpcore.provenance.provenance` of this
    checkout): changed results files under ``audits/results/`` (a long audit rewrites its table
    and run bundle as it goes) do not mark the commit ``-dirty``; changed code does."""
    try:
        ignore = [RESULTS.relative_to(ROOT).as_posix()]
    except ValueError:  # results kept outside the checkout (tests)
        ignore = []
    return provenance(root=ROOT, ignore=ignore, **extra)


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
    # the commit before the rows are written: a tracked results file, once rewritten, would
    # mark the checkout as changed ("-dirty") although the code that made the rows was not
    meta = stamp(audit=audit, config=config)
    atomic_write_text(path, json.dumps(rows, indent=1, allow_nan=False) + "\n")
    atomic_write_text(RESULTS / f"{audit}.meta.json", json.dumps(meta, indent=1) + "\n")
    return path


def load(audit: str) -> list[dict[str, Any]]:
    """Read what :func:`save` wrote."""
    return list(json.loads((RESULTS / f"{audit}.json").read_text()))


def load_meta(audit: str) -> dict[str, Any] | None:
    """``results/<audit>.meta.json`` (the provenance :func:`save` writes), or None."""
    path = RESULTS / f"{audit}.meta.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def stored(names: list[str], *, every: bool) -> list[tuple[str, list[dict[str, Any]], Any]]:
    """``(stem, rows, meta)`` of each results stem in ``names``; with ``every`` (no stem was
    asked for by name) the stems without results are skipped, else a missing one raises."""
    return [
        (stem, load(stem), load_meta(stem))
        for stem in names
        if not every or (RESULTS / f"{stem}.json").exists()
    ]


def provenance_line(meta: dict[str, Any], *extra: str) -> str:
    """The line under a results table naming the profile, commit, machine and torch version
    (and ``extra`` facts, e.g. the executor or a peer's version) of its run."""
    config = meta.get("config", {})
    hardware = config.get("hardware", {})
    facts = [
        f"Profile `{config.get('profile')}`, commit `{meta.get('commit')}`",
        f"{hardware.get('cpu')} ({hardware.get('cpus')} CPUs), torch {config.get('torch')}",
        *extra,
        f"created {meta.get('created')}.",
    ]
    return ", ".join(facts)
