"""The audit fan-out benchmark: three executors, the same rows, a JSON record (no timing claims)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import audit_fanout


def test_the_audit_gives_the_same_rows_on_every_executor(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    rows = audit_fanout.run(results, runs=2)
    assert [row["executor"] for row in rows][:2] == ["in process", "processes:1"]
    assert rows[2]["executor"].startswith("processes:")
    assert all(row["same_rows_as_in_process"] for row in rows)
    assert all(row["trainings"] == 2 * 2 + 4 for row in rows)
    assert rows[1]["speedup_vs_one_process"] == 1.0
    record = json.loads((results / "audit_fanout.json").read_text())
    assert record["runs_per_world"] == 2 and len(record["rows"]) == 3
    assert "cores" in record["hardware"]


def test_the_readme_and_the_benchmarks_page_state_the_committed_measurement() -> None:
    root = Path(__file__).resolve().parents[2]
    record = json.loads((root / "bench" / "results" / "audit_fanout.json").read_text())
    start, end = audit_fanout.MARKERS
    for page in audit_fanout.PAGES:
        assert f"{start}\n{audit_fanout.markdown(record)}\n{end}" in (root / page).read_text()
    assert all(row["same_rows_as_in_process"] for row in record["rows"])
    assert record["runs_per_world"] == audit_fanout.RUNS
