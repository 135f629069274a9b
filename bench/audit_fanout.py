"""``python -m bench audit_fanout``: wall time of one per-step audit, in process and fanned out.

The per-step white-box audit trains ``2 runs + tiny_runs`` independent runs (each with its own
seed), so :func:`dpcore.auditing.whitebox_audit` can hand them to any executor of
:func:`dpcore.runs.run_many`. This benchmark audits dpcore's own torch training
(:class:`dpcore.auditing.dpcore_torch.DpcoreTorch`) at the default setting with ``runs`` runs
per world (200 by default, 20 with ``--quick``) three times: in this process, on one spawned
process and on ``processes:N`` for N = 2 (the machine's cores, at most 4), checks that the
three give the same rows, and writes ``audit_fanout.json``: wall time of each, the speed-up over
one spawned process (the same start-up cost) and over the in-process run, with the hardware.
Run it on an otherwise idle machine: anything else running shares the cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_write_text
from dpcore.auditing.audit_settings import PER_STEP_SETTINGS
from dpcore.auditing.dpcore_torch import DpcoreTorch
from dpcore.auditing.implementation_whitebox import whitebox_audit
from dpcore.runs.markers import write_between_markers

RUNS, QUICK_RUNS = 200, 20
MARKERS = ("<!-- audit-fanout:start -->", "<!-- audit-fanout:end -->")
#: the pages that state the measurement between the markers, relative to the repository root:
#: the front page (the README) and the guide's Benchmarks page
PAGES = ("README.md", "docs/guide/benchmarks.md")


def _comparable(rows: list[dict[str, Any]]) -> str:
    return json.dumps(
        [{k: v for k, v in r.items() if k != "seconds"} for r in rows], sort_keys=True
    )


def run(results_dir: Path, *, quick: bool = False, runs: int | None = None) -> list[dict[str, Any]]:
    """Time the audit on each executor; write ``audit_fanout.json``; return the rows."""
    from dpcore.provenance import provenance

    runs = runs or (QUICK_RUNS if quick else RUNS)
    settings = dataclasses.replace(PER_STEP_SETTINGS, runs=runs)
    workers = max(2, min(4, os.cpu_count() or 1))
    executors: list[str | None] = [None, "processes:1", f"processes:{workers}"]
    rows: list[dict[str, Any]] = []
    reference = ""
    for executor in executors:
        start = time.perf_counter()
        audited = whitebox_audit(DpcoreTorch(), settings, seed=0, executor=executor)
        wall = time.perf_counter() - start
        comparable = _comparable(audited)
        reference = reference or comparable
        rows.append(
            {
                "executor": executor or "in process",
                "trainings": 2 * runs + settings.tiny_runs,
                "wall_s": wall,
                "same_rows_as_in_process": comparable == reference,
                "epsilon_lower": audited[0]["epsilon_lower"],
            }
        )
    for row in rows:
        row["speedup_vs_one_process"] = rows[1]["wall_s"] / row["wall_s"]
        row["speedup_vs_in_process"] = rows[0]["wall_s"] / row["wall_s"]
    record = {
        "rows": rows,
        "runs_per_world": runs,
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU",
        "provenance": provenance(root=results_dir.parents[1], benchmark="audit_fanout"),
    }
    results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(results_dir / "audit_fanout.json", json.dumps(record, indent=1) + "\n")
    write_pages(results_dir.parents[1], record)
    return rows


def write_pages(root: Path, record: dict[str, Any]) -> None:
    """State ``record`` between the markers of each of :data:`PAGES` under ``root`` that has them.

    Args:
        root: the repository root (a page or marker missing under it is left alone).
        record: the measurement, as saved in ``audit_fanout.json``.
    """
    for page in PAGES:
        path = root / page
        if path.is_file() and MARKERS[0] in path.read_text():
            write_between_markers(path, *MARKERS, markdown(record))


def markdown(record: dict[str, Any]) -> str:
    """The sentence on the saved measurement (the README's and the Benchmarks page's)."""
    local, one, many = record["rows"]
    return (
        f"One per-step audit of dpcore's torch training with {record['runs_per_world']} runs "
        f"per world ({local['trainings']} trainings): {local['wall_s']:.0f} s in process, "
        f"{one['wall_s']:.0f} s on one spawned process, {many['wall_s']:.0f} s on "
        f"`{many['executor']}` ({many['speedup_vs_one_process']:.2f} times as fast as one process, "
        f"{many['wall_s'] / one['wall_s']:.2f} of its wall time), the same rows "
        f"on each ({record['hardware']}, commit {record['provenance']['commit'][:7]}; "
        "`bench/results/audit_fanout.json`)."
    )
