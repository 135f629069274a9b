"""bench.training_memory: the methods' sweeps fanned out through an executor give the rows and
summaries of the in-process run, in the same order (the measuring workers replaced by a fake)."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from bench import cells, logical_lots, training_memory
from dpcore.errors import InvalidParameterError
from dpcore.runs.cells import Cell

#: Fake peak memory per example, by method: each sweep ends at a different lot.
PER_EXAMPLE_MB = {"nonprivate": 0.5, "dpsgd_exact": 1.0, "dpsgd_vmap": 2.0, "dpsgd_jl": 1.0}


def _fake_capped(cell: Cell, lot: int, *, cap_mb: float, **_: Any) -> dict[str, Any]:
    if cell.method == "opacus_hooks":
        return {"error": "CUDA out of memory (fake)"}
    peak = PER_EXAMPLE_MB[cell.method] * lot
    if peak > cap_mb:
        return {"exceeded_cap": True}
    return {"peak_rss_mb": peak, "step_seconds": lot / 1000.0}


class _Inline:
    """An executor that runs each call at once, here (``submit()`` returning a done future)."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Any, /, *args: Any) -> Future:
        self.calls += 1
        future: Future = Future()
        future.set_result(fn(*args))
        return future


@pytest.fixture
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells, "run_capped", _fake_capped)
    monkeypatch.setattr(logical_lots, "sweep", lambda **_: ([], {"largest_logical_lot": None}))


@pytest.mark.usefixtures("fake_workers")
def test_fanned_out_sweeps_give_the_in_process_rows(tmp_path: Path) -> None:
    here = training_memory.run(tmp_path / "here", quick=True, cap_mb=3000.0)
    inline = _Inline()
    spread = training_memory.run(tmp_path / "spread", quick=True, cap_mb=3000.0, executor=inline)
    assert inline.calls == len(training_memory.METHODS)  # one run per method's sweep
    assert spread == here
    largest = {
        s["method"]: s["largest_lot_under_cap"]
        for s in json.loads((tmp_path / "spread" / "training_memory.meta.json").read_text())[
            "summaries"
        ]
    }
    assert largest == {
        "nonprivate": 4096,
        "dpsgd_exact": 2048,
        "dpsgd_vmap": 1024,
        "dpsgd_jl": 2048,
        "opacus_hooks": None,
    }
    assert (
        training_memory.run(tmp_path / "local", quick=True, cap_mb=3000.0, executor="local") == here
    )


def test_a_bad_executor_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="executor"):
        training_memory.run(Path("unused"), quick=True, executor="threads:2")
