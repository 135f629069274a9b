"""The TensorFlow training benchmark's driver: cells, ratios, the TF Privacy peer column, saving.

No TensorFlow here: the workers are replaced by fakes returning known step times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import __main__ as bench_main
from bench import tf_training
from dpcore import provenance
from dpcore.runs import workers as protocol
from dpcore.runs.cells import Cell

#: Seconds per step the fake workers report, by (model, method).
FAKE = {
    ("mnist_cnn", "nonprivate"): 0.01,
    ("mnist_cnn", "dpcore_tf_exact"): 0.02,
    ("mnist_cnn", "dpcore_tf_jl"): 0.03,
    ("imdb_lstm", "nonprivate"): 0.2,
    ("imdb_lstm", "dpcore_tf_exact"): 0.5,
    ("imdb_lstm", "dpcore_tf_jl"): 0.4,
}


def test_cells_put_each_models_reference_first() -> None:
    quick = tf_training.cells(quick=True)
    assert [cell.method for cell in quick[:2]] == ["nonprivate", "dpcore_tf_exact"]
    jl = [cell.jl_dimension for cell in quick if cell.model == "imdb_lstm" and cell.jl_dimension]
    assert tuple(jl) == tf_training.QUICK_JL_DIMENSIONS["imdb_lstm"]
    full = tf_training.cells(quick=False, models=("mnist_cnn",))
    assert [cell.jl_dimension for cell in full[2:]] == [1, 5, 10, 30]
    assert {cell.model for cell in full} == {"mnist_cnn"}


def _peer_file(tmp_path: Path, lot_size: int = 256) -> Path:
    """A TF Privacy results file in the format ``tf_privacy_baseline.compute`` writes."""
    path = tmp_path / "bu2021_jl_tf_privacy.json"
    payload = {
        "config": {"lot_size": lot_size, "threads": 2},
        "commit": "5f99",
        "hardware": "CPU Z, 2 TensorFlow thread(s) of 2 cores",
        "tensorflow": "2.15.1",
        "tensorflow_privacy": "0.9.0",
        "errors": {"tf_privacy_vectorized": "killed"},
        "rows": [
            {"method": "keras_nonprivate", "seconds_per_step": 0.1},
            {"method": "tf_privacy_vanilla", "seconds_per_step": 20.0},
        ],
    }
    path.write_text(json.dumps(payload))
    return path


def test_the_committed_tf_privacy_timing_is_read_as_the_peer() -> None:
    peer = tf_training.read_peer()
    assert peer is not None, "figures/bu2021_jl_tf_privacy.json is committed"
    assert peer["file"] == "figures/bu2021_jl_tf_privacy.json"
    assert peer["lot_size"] == 256 and peer["tensorflow"].startswith("2.15")
    assert peer["step_seconds"]["tf_privacy_vanilla"] > 1.0
    assert peer["hardware"] and peer["commit"]


def test_read_peer_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert tf_training.read_peer(tmp_path / "absent.json") is None


def _row(model: str, method: str, seconds: float | None, batch: int = 256) -> dict[str, Any]:
    return {"model": model, "method": method, "step_seconds": seconds, "batch_size": batch}


def test_ratios_to_nonprivate_and_to_the_peer(tmp_path: Path) -> None:
    peer = tf_training.read_peer(_peer_file(tmp_path))
    rows = [
        _row("mnist_cnn", "nonprivate", 0.01),
        _row("mnist_cnn", "dpcore_tf_exact", 0.02),
        _row("imdb_lstm", "nonprivate", 0.2),
        _row("imdb_lstm", "dpcore_tf_exact", 0.5),
        _row("imdb_lstm", "dpcore_tf_jl", None),
    ]
    tf_training.with_ratios(rows, peer)
    assert [row["ratio_to_nonprivate"] for row in rows] == pytest.approx([1, 2, 1, 2.5, None])
    # the peer stands beside the IMDb rows only: Keras 2 beside ours, vanilla DP-Adam beside DP
    assert rows[1]["peer_method"] is None and rows[1]["ratio_to_peer"] is None
    assert rows[2]["peer_method"] == "tf_privacy:keras_nonprivate"
    assert rows[2]["ratio_to_peer"] == pytest.approx(2.0)
    assert rows[3]["peer_method"] == "tf_privacy:tf_privacy_vanilla"
    assert rows[3]["peer_step_seconds"] == 20.0
    assert rows[3]["ratio_to_peer"] == pytest.approx(0.5 / 20.0)
    assert rows[4]["ratio_to_peer"] is None  # failed: no ratio


def test_no_peer_at_another_lot_size(tmp_path: Path) -> None:
    peer = tf_training.read_peer(_peer_file(tmp_path, lot_size=64))
    rows = [_row("imdb_lstm", "nonprivate", 0.2), _row("imdb_lstm", "dpcore_tf_exact", 0.5)]
    tf_training.with_ratios(rows, peer)
    assert all(row["peer_step_seconds"] is None for row in rows)
    tf_training.with_ratios(rows, None)
    assert rows[1]["ratio_to_nonprivate"] == pytest.approx(2.5)


def test_results_are_saved_after_every_cell_with_the_peers_origin(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Cell, dict[str, Any]]] = []

    def fake_cell(cell: Cell, **options: Any) -> protocol.WorkerResult:
        if len(calls) == 6:
            raise KeyboardInterrupt  # the run is stopped during the seventh cell
        calls.append((cell, options))
        if cell.model == "imdb_lstm" and cell.jl_dimension == 1:
            return protocol.WorkerResult("timeout", timeout=600)
        row = {
            "step_seconds": FAKE[cell.model, cell.method] * (cell.jl_dimension or 1),
            "peak_rss_mb": 100.0,
            "clipping": None if cell.method == "nonprivate" else "ghost",
            "environment": {"tensorflow": "2.21.0", "keras": "3.15.1", "hardware": "CPU T"},
            "error": None,
        }
        return protocol.WorkerResult("ok", row=row, returncode=0)

    monkeypatch.setattr(tf_training, "run_cell", fake_cell)
    monkeypatch.setattr(
        tf_training, "QUICK_JL_DIMENSIONS", {"mnist_cnn": (1,), "imdb_lstm": (1, 5)}
    )
    # the checkout reads as changed once the first save rewrote tracked results
    commits = iter(["abc123", *["abc123-dirty"] * 20])
    monkeypatch.setattr(provenance, "git_commit", lambda root=None, ignore=(): next(commits))
    peer = _peer_file(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tf_training.run(tmp_path / "results", quick=True, threads=2, peer_file=peer)
    rows = json.loads((tmp_path / "results" / "tf_training.json").read_text())
    meta = json.loads((tmp_path / "results" / "tf_training.meta.json").read_text())
    assert [(row["model"], row["method"]) for row in rows] == [
        (cell.model, cell.method) for cell, _ in calls
    ]
    assert calls[0][1]["module"] == "bench.tf_training" and calls[0][1]["batch_size"] == 256
    assert calls[0][1]["threads"] == 2 and calls[0][1]["warmup"] == tf_training.QUICK["warmup"]
    lstm = [row for row in rows if row["model"] == "imdb_lstm"]
    assert lstm[1]["ratio_to_nonprivate"] == pytest.approx(2.5)
    assert lstm[1]["ratio_to_peer"] == pytest.approx(0.5 / 20.0)
    assert lstm[-1]["jl_dimension"] == 1 and lstm[-1]["error"] == "timed out after 600 s"
    assert lstm[-1]["step_seconds"] is None and lstm[-1]["ratio_to_nonprivate"] is None
    assert "environment" not in rows[0]
    assert (meta["cells_measured"], meta["cells_total"]) == (6, 7)
    assert meta["commit"] == "abc123"  # the commit the run started from
    assert meta["tensorflow"] == "2.21.0" and meta["hardware"] == "CPU T"
    assert meta["peer"]["hardware"] == "CPU Z, 2 TensorFlow thread(s) of 2 cores"
    note = next(note for note in meta["notes"] if note.startswith("peer_"))
    assert str(peer) in note and "CPU Z" in note and "not timed in this run" in note


def test_tensorflow_older_than_2_16_or_absent_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for version, ok in ((None, False), ("2.15.1", False), ("2.16.0", True), ("2.21.0", True)):
        monkeypatch.setattr(tf_training, "_version", lambda *packages, v=version: v)
        if ok:
            tf_training.check_tensorflow()
        else:
            with pytest.raises(RuntimeError):
                tf_training.check_tensorflow()


def test_the_default_run_skips_an_uninstalled_framework(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_main, "OPTIONAL", {"tf_training": "no_such_framework_module"})
    assert "tf_training" not in bench_main.default_names()
    assert "training" in bench_main.default_names()
    monkeypatch.setattr(bench_main, "OPTIONAL", {"tf_training": "json"})
    assert "tf_training" in bench_main.default_names()


def test_worker_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []

    def measure(cell: Cell, **options: Any) -> dict[str, Any]:
        seen.append((cell, options))
        return {"step_seconds": 0.5, "error": None}

    monkeypatch.setattr(tf_training, "measure", measure)
    cell = Cell("imdb_lstm", "dpcore_tf_jl", None, 5)
    flags = ["--warmup=2", "--steps=3", "--budget=6.0", "--threads=2", "--batch-size=16"]
    assert tf_training.timing_worker(["--worker", cell.to_json(), *flags]) == 0
    assert protocol.find_result(capsys.readouterr().out) == {"step_seconds": 0.5, "error": None}
    options = {"threads": 2, "warmup": 2, "steps": 3, "budget": 6.0, "batch_size": 16}
    assert seen == [(cell, {**options, "min_seconds": None})]
    tf_training.timing_worker(["--worker", cell.to_json(), *flags, "--min-seconds=10"])
    assert seen[-1] == (cell, {**options, "min_seconds": 10.0})
    with pytest.raises(SystemExit):
        tf_training.timing_worker(["--worker", cell.to_json(), "--device=cuda", *flags])


def test_cells_timed_on_an_executor_one_at_a_time_give_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On an executor each cell's worker is started by a run of run_many, never two at once,
    and every row names the machine that timed it."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from dpcore.runs import machine

    lock, running, most = threading.Lock(), [0], [0]

    def fake_cell(cell: Cell, **options: Any) -> protocol.WorkerResult:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        row = {"step_seconds": FAKE[cell.model, cell.method], "peak_rss_mb": 1.0, "error": None}
        return protocol.WorkerResult("ok", row=row, returncode=0)

    monkeypatch.setattr(tf_training, "run_cell", fake_cell)
    monkeypatch.setattr(provenance, "git_commit", lambda root=None, ignore=(): "abc123")
    peer = _peer_file(tmp_path)
    here = tf_training.run(tmp_path / "here", quick=True, threads=1, peer_file=peer)
    with ThreadPoolExecutor(4) as pool:
        there = tf_training.run(
            tmp_path / "there", quick=True, threads=1, peer_file=peer, executor=pool
        )
    assert here == there and len(here) == len(tf_training.cells(quick=True))
    assert most[0] == 1 and all(row["hardware"] == machine() for row in there)
    saved = json.loads((tmp_path / "there" / "tf_training.json").read_text())
    assert saved == there
