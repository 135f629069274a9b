"""The training benchmark's driver: results are saved after every cell, so a run stopped early
(a lent GPU's time limit, a kill) keeps what it measured and says how far it got."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench import training
from dpcore.errors import InvalidParameterError
from dpcore.runs.cells import Cell


def test_results_are_saved_after_every_cell(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Cell] = []

    def fake_cell(cell: Cell, **_: Any) -> dict[str, Any]:
        if len(calls) == 3:
            raise KeyboardInterrupt  # the run is stopped during the fourth cell
        calls.append(cell)
        return {"step_seconds": 0.01 * len(calls), "peak_rss_mb": 100.0, "error": None}

    monkeypatch.setattr(training, "run_timing", fake_cell)
    with pytest.raises(KeyboardInterrupt):
        training.run(tmp_path, quick=True, models=("mnist_cnn",))
    rows = json.loads((tmp_path / "training.json").read_text())
    meta = json.loads((tmp_path / "training.meta.json").read_text())
    assert [row["method"] for row in rows] == [cell.method for cell in calls]
    assert rows[0]["method"] == "nonprivate" and rows[0]["ratio_to_nonprivate"] == 1.0
    assert rows[2]["ratio_to_nonprivate"] == pytest.approx(3.0)
    expected_total = len(training.cells(quick=True, models=("mnist_cnn",)))
    assert (meta["cells_measured"], meta["cells_total"]) == (3, expected_total)


def test_cells_fanned_out_through_an_executor_give_the_rows_of_the_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``run(executor=...)`` (``python -m bench training --executor ...``) measures every cell
    once, through :func:`dpcore.runs.run_many`, one at a time (no two timings share a machine),
    and saves the rows the loop saves, each naming the machine that timed it."""
    import threading
    import time

    from dpcore.runs import machine

    calls: list[Cell] = []
    lock, running, most = threading.Lock(), [0], [0]

    def fake_cell(cell: Cell, **options: Any) -> dict[str, Any]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.005)
        calls.append(cell)
        with lock:
            running[0] -= 1
        seconds = 0.01 * (1 + len(cell.method) + (cell.jl_dimension or 0))
        return {"step_seconds": seconds, "peak_rss_mb": 100.0, "error": None}

    monkeypatch.setattr(training, "run_timing", fake_cell)
    loop = training.run(tmp_path / "loop", quick=True, models=("mnist_cnn",), executor="local")
    expected = training.cells(quick=True, models=("mnist_cnn",))
    assert calls == expected
    calls.clear()
    with ThreadPoolExecutor(3) as pool:
        fanned = training.run(tmp_path / "fanned", quick=True, models=("mnist_cnn",), executor=pool)
    assert calls == expected and most[0] == 1  # each cell once, one at a time
    assert fanned == loop and all(row["hardware"] == machine() for row in fanned)
    assert json.loads((tmp_path / "fanned" / "training.json").read_text()) == loop
    meta = json.loads((tmp_path / "fanned" / "training.meta.json").read_text())
    assert meta["cells_measured"] == meta["cells_total"] == len(expected)
    with pytest.raises(InvalidParameterError, match="executor"):
        training.run(tmp_path / "bad", quick=True, models=("mnist_cnn",), executor="threads:2")
    assert not (tmp_path / "bad").exists()
