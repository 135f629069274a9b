"""The accounting benchmark: each step count's cells one run of dpcore.runs, timed alone, each
row naming the machine that timed it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench import accounting
from dpcore.runs import machine


def test_cells_timed_on_an_executor_give_the_in_process_epsilons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(accounting, "STEPS", (10, 30))
    here = accounting.run(tmp_path / "here", repeats=1)
    with ThreadPoolExecutor(2) as pool:
        there = accounting.run(tmp_path / "there", repeats=1, executor=pool)

    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]

    assert untimed(here) == untimed(there) and len(here) == 2 * len(accounting._CELLS)
    assert [row["steps"] for row in here] == [10] * 5 + [30] * 5
    assert all(row["hardware"] == machine() and row["seconds"] > 0 for row in there)
    matched = {row["steps"]: row for row in here if row["accountant"] == "pld_matched_grid"}
    ours = {row["steps"]: row for row in here if row["implementation"] == "dpcore"}
    assert all(matched[s]["grid_spacing"] == ours[s]["grid_spacing"] for s in (10, 30))
    saved = json.loads((tmp_path / "there" / "accounting.json").read_text())
    assert untimed(saved) == untimed(there)
    meta = json.loads((tmp_path / "there" / "accounting.meta.json").read_text())
    assert set(meta["time_ratios"]) == {"10", "30"}
