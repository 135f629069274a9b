"""The distributed benchmark runs 1, 2 and 4 gloo processes and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import distributed


def test_quick_profile_times_every_world_size(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    rows = distributed.run(results, quick=True)
    assert [row["world_size"] for row in rows] == list(distributed.WORLD_SIZES)
    for row in rows:
        assert row["step_s"] > 0 and row["allreduce_share"] > 0
    assert rows[0]["step_time_vs_one_process"] == 1.0
    saved = json.loads((results / "distributed.json").read_text())
    assert saved["rows"] == rows and saved["steps"] == 5


def test_world_sizes_timed_on_an_executor_name_their_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an executor each world size is a run of run_many, one at a time; every row names
    the machine that timed it."""
    from concurrent.futures import ThreadPoolExecutor

    from dpcore.runs import machine

    monkeypatch.setattr(distributed, "WORLD_SIZES", (1, 2))
    results = tmp_path / "bench" / "results"
    with ThreadPoolExecutor(2) as pool:
        rows = distributed.run(results, quick=True, executor=pool)
    assert [row["world_size"] for row in rows] == [1, 2]
    assert all(row["hardware"] == machine() and row["step_s"] > 0 for row in rows)
    assert json.loads((results / "distributed.json").read_text())["rows"] == rows
