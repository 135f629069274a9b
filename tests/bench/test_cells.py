"""bench.cells over dpcore.runs.cells: a cell's worker command line, its worker's one result
line, and how the parent turns each way a worker ends into the timing and memory rows."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from bench import cells
from dpcore.runs import cells as runs_cells
from dpcore.runs.cells import Cell, worker_command
from dpcore.runs.workers import WorkerResult, find_result, is_oom


def test_cell_json_and_worker_command() -> None:
    cell = Cell("imdb_lstm", "dpsgd_jl", "lstm", 10)
    command = worker_command(cell, "bench.training", device="cpu", budget=None, warmup=2)
    assert command[:3] == [sys.executable, "-m", "bench.training"]
    assert command[3] == "--worker" and Cell.from_json(command[4]) == cell
    assert command[5:] == ["--device=cpu", "--warmup=2"]  # None options are left out
    assert cell.label == "imdb_lstm dpsgd_jl lstm r=10"


def _fake_build(model: torch.nn.Module) -> Callable[..., tuple[Any, Callable[[], None]]]:
    def build(cell: Cell, *_: Any) -> tuple[Any, Callable[[], None]]:
        def step() -> None:
            model.zero_grad()
            model(torch.ones(2, 3)).sum().backward()

        return model, step

    return build


def test_timing_worker_prints_one_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    build = _fake_build(torch.nn.Linear(3, 1))
    argv = ["--worker", Cell("m", "nonprivate").to_json(), "--warmup=1", "--steps=3"]
    assert cells.timing_worker(argv, build=build, module="tests") == 0
    row = find_result(capsys.readouterr().out)
    assert row is not None and row["error"] is None
    assert row["timed_steps"] == 3 and len(row["step_seconds_all"]) == 3
    assert row["parameters"] == 4 and row["peak_rss_mb"] > 0


def test_memory_worker_prints_one_result_line(capsys: pytest.CaptureFixture[str]) -> None:
    build = _fake_build(torch.nn.Linear(3, 1))
    argv = ["--worker", Cell("m", "nonprivate").to_json(), "--batch-size=2"]
    assert cells.memory_worker(argv, build=build, module="tests") == 0
    row = find_result(capsys.readouterr().out)
    assert row is not None and row["error"] is None and row["skipped"] is None
    assert row["step_seconds"] is not None and row["peak_gpu_mb"] is None


def test_a_failing_step_is_a_row_with_its_error(capsys: pytest.CaptureFixture[str]) -> None:
    def build(cell: Cell, *_: Any) -> tuple[Any, Callable[[], None]]:
        def step() -> None:
            raise MemoryError("no room")

        return torch.nn.Linear(1, 1), step

    argv = ["--worker", Cell("m", "nonprivate").to_json(), "--batch-size=2"]
    cells.memory_worker(argv, build=build)
    row = find_result(capsys.readouterr().out)
    assert row is not None and row["error"] == "MemoryError: no room" and is_oom(row)


@pytest.fixture
def worker_result(monkeypatch: pytest.MonkeyPatch) -> Callable[[WorkerResult], list[list[str]]]:
    """Make every worker come to the given result, without starting a process."""

    def use(result: WorkerResult) -> list[list[str]]:
        commands: list[list[str]] = []

        def fake(command: list[str], **_: Any) -> WorkerResult:
            commands.append(command)
            return result

        monkeypatch.setattr(runs_cells, "run_worker", fake)
        return commands

    return use


TIMING: dict[str, Any] = {
    "device": "cpu",
    "threads": 1,
    "warmup": 1,
    "steps": 2,
    "budget": None,
    "timeout": 60,
}


def test_run_timing_rows(worker_result: Callable[[WorkerResult], list[list[str]]]) -> None:
    cell = Cell("mnist_cnn", "nonprivate")
    commands = worker_result(WorkerResult("ok", row={"step_seconds": 0.1, "error": None}))
    assert cells.run_timing(cell, **TIMING) == {"step_seconds": 0.1, "error": None}
    assert commands[0][2] == "bench.training" and "--steps=2" in commands[0]
    worker_result(WorkerResult("timeout", timeout=60))
    assert cells.run_timing(cell, **TIMING) == {"error": "timed out after 60 s"}
    worker_result(WorkerResult("crashed", returncode=-11, output="Segmentation fault"))
    error = cells.run_timing(cell, **TIMING)["error"]
    assert error == "worker exited with status -11: Segmentation fault"
    worker_result(WorkerResult("unreadable", returncode=0, problem="the line is not JSON"))
    assert "unreadable result line" in cells.run_timing(cell, **TIMING)["error"]


def test_run_capped_rows(worker_result: Callable[[WorkerResult], list[list[str]]]) -> None:
    cell = Cell("mnist_cnn", "dpsgd_exact")
    capped: dict[str, Any] = {"cap_mb": 1000.0, "timeout": 45.0}
    worker_result(WorkerResult("over_cap", polled_rss_mb=1200.0, cap_mb=1000.0))
    row = cells.run_capped(cell, 4096, **capped)
    assert row == {
        "polled_rss_mb": 1200.0,
        "exceeded_cap": True,
        "peak_rss_mb": None,
        "step_seconds": None,
    }
    worker_result(WorkerResult("timeout", polled_rss_mb=300.0, timeout=45.0))
    row = cells.run_capped(cell, 4096, **capped)
    assert (row["skipped"], row["error"]) == ("too slow", "killed after 45 s")
    worker_result(WorkerResult("crashed", returncode=-9, polled_rss_mb=900.0))
    row = cells.run_capped(cell, 4096, **capped)
    assert row["error"].startswith("worker exited with status -9") and is_oom(row)
    # a spike above the cap between two polls: the worker's own peak says so
    spike = {"peak_rss_mb": 1100.0, "step_seconds": 1.0, "error": None}
    commands = worker_result(WorkerResult("ok", row=spike, polled_rss_mb=800.0))
    row = cells.run_capped(cell, 4096, **capped)
    assert (row["exceeded_cap"], row["peak_rss_mb"], row["polled_rss_mb"]) == (True, None, 800.0)
    assert "--batch-size=4096" in commands[0] and json.loads(commands[0][4])["method"] == (
        "dpsgd_exact"
    )
    fits = {"peak_rss_mb": 700.0, "step_seconds": 1.0, "error": None}
    worker_result(WorkerResult("ok", row=fits, polled_rss_mb=650.0))
    row = cells.run_capped(cell, 4096, **capped)
    assert (row["exceeded_cap"], row["peak_rss_mb"]) == (False, 700.0)


def test_a_measurement_leaves_the_float_flags_and_threads_as_it_found_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Flush-to-zero is a CPU flag: left on, it silently changed later numpy results (a tail
    probability of the JL accountant's tests lost 3.5 % when run after these workers)."""
    import numpy as np

    threads = torch.get_num_threads()
    build = _fake_build(torch.nn.Linear(3, 1))
    timing = ["--worker", Cell("m", "x").to_json(), "--threads=1", "--warmup=1", "--steps=1"]
    cells.timing_worker(timing, build=build)
    cells.memory_worker(["--worker", Cell("m", "x").to_json(), "--batch-size=2"], build=build)
    capsys.readouterr()
    smallest = np.array([5e-324])  # a denormal: zero under flush-to-zero / denormals-are-zero
    assert (smallest * 1.0)[0] > 0 and torch.get_num_threads() == threads
