"""Tables 3-4 of the Bu et al. 2021 reproduction: the two CNNs, the search, the table."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import cells, torch_cells
from dpcore.runs import measurements as cache
from dpcore.runs.cells import Cell
from dpcore.torch.models import tf_privacy_mnist_cnn
from reproductions.bu2021_jl import memory, memory_report, memory_worker
from reproductions.harness import Output


def _count(model: object) -> int:
    return sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]


def test_the_wide_model_has_the_papers_parameter_count() -> None:
    # Bu et al. 2021, Table 4: a "17M" model of 17,146,938 parameters; the TF Privacy CNN with a
    # 32,768-unit dense layer has exactly that many.
    assert memory.parameter_count(memory.SMALL_HIDDEN) == _count(tf_privacy_mnist_cnn()) == 26_010
    assert memory.parameter_count(memory.WIDE_HIDDEN) == 17_146_938


@pytest.mark.parametrize("hidden", [0, 1.5, True])
def test_bad_hidden(hidden: object) -> None:
    with pytest.raises(InvalidParameterError, match="hidden"):
        tf_privacy_mnist_cnn(hidden)  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [7, 8, 9, 10, 11, 12, 13])
def test_bisection_finds_the_threshold_in_few_probes(threshold: int) -> None:
    calls: list[int] = []

    def fits(k: int) -> bool:
        calls.append(k)
        return k <= threshold

    found = memory.largest_fitting(fits, 8, 13)
    assert found == (None if threshold < 8 else min(threshold, 13))
    assert len(calls) <= 1 + math.ceil(math.log2(6))


@pytest.mark.parametrize(
    ("measured", "device", "expected"),
    [
        ({"exceeded_cap": True}, "cpu", "exceeds"),
        ({"error": "RuntimeError: out of memory"}, "cpu", "exceeds"),
        ({"error": "worker exited with status -9: "}, "cpu", "exceeds"),
        ({"error": "killed after 45 s", "skipped": "too slow"}, "cpu", "too_slow"),
        ({"error": "ValueError: bad"}, "cpu", "error"),
        ({"error": None, "skipped": "too slow", "peak_rss_mb": 500.0}, "cpu", "fits"),
        ({"error": None, "peak_gpu_mb": 2000.0}, "cuda", "exceeds"),
        ({"error": None, "peak_gpu_mb": 500.0}, "cuda", "fits"),
    ],
)
def test_outcome_of_a_probe(measured: dict, device: str, expected: str) -> None:
    assert memory.outcome(measured, 1024.0, device) == expected


@pytest.mark.parametrize(
    "cell",
    [
        Cell("mnist_cnn", "dpsgd_exact", "hidden=64"),
        Cell("mnist_cnn", "dpsgd_jl", "hidden=32,per_direction", 3),
    ],
)
def test_worker_steps_run(cell: Cell) -> None:
    model, step = memory_worker.build(cell, 4, "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert any(not (b == p).all() for b, p in zip(before, model.parameters(), strict=True))


def _saved() -> dict:
    def row(method: str, label: str, lot: int | None, bounded: bool, ratio: float | None) -> dict:
        return {
            "model": "small",
            "parameters": 26_010,
            "method": method,
            "label": label,
            "largest_lot": lot,
            "smallest_tried": 1024,
            "bounded_by_memory": bounded,
            "ratio_to_nonprivate": ratio,
            "peak_mb_at_largest": None if lot is None else 700.0,
            "outcomes": "1024: fits",
        }

    return {
        "config": {"profile": "quick", "cap_mb": 1024.0},
        "commit": "0123456789abcdef",
        "memory_measured": "peak RSS",
        "hardware": "cpu, 1 torch thread(s)",
        "torch": "2.x",
        "wall_time_s": 90.0,
        "rows": [
            row("nonprivate", "non-private SGD", 8192, False, 1.0),
            row("dpsgd_exact", "DP-SGD, exact (fast engine)", 4096, True, 0.5),
            row("dpsgd_jl", "DP-SGD-JL, r = 30", None, True, None),
        ],
    }


def test_readme_table_from_saved_results() -> None:
    table = memory_report.readme_table(_saved())
    assert "cap **1 GiB**" in table
    assert "| non-private SGD | >= 8,192 | 1 | 700 |" in table
    assert "| DP-SGD, exact (fast engine) | 4,096 | 0.5 | 700 |" in table
    assert "| DP-SGD-JL, r = 30 | < 1,024 | - | - |" in table


def test_plot_draws_and_tabulates_the_saved_device(tmp_path: Path) -> None:
    """From the saved results of ``output`` only; a device with no results is skipped."""
    output = Output.under(tmp_path)
    data = _saved()
    extra = {key: value for key, value in data.items() if key not in ("config", "rows", "commit")}
    rows = data["rows"] + [{**row, "model": "wide"} for row in data["rows"]]
    output.save_results(memory.STEM, config=data["config"], rows=rows, extra=extra)
    readme = tmp_path / "README.md"
    names = [memory.table_for(device) for device in ("cpu", "cuda")]
    readme.write_text("".join(f"<!-- {name}:start -->\n<!-- {name}:end -->\n" for name in names))
    memory_report.plot(output=output, readme=readme)
    assert output.path(f"{memory.STEM}.png").stat().st_size > 1000
    assert not output.path(f"{memory.stem_for('cuda')}.png").exists()
    text = readme.read_text()
    assert "| DP-SGD, exact (fast engine) | 4,096 | 0.5 | 700 |" in text
    assert text.endswith("<!-- memory-table-cuda:start -->\n<!-- memory-table-cuda:end -->\n")


def test_worker_peak_memory_is_its_own_not_the_parents() -> None:
    """Linux carries ru_maxrss across execve; the worker's peak must not include its parent's."""
    import subprocess
    import sys

    import numpy as np

    from reproductions.harness import ROOT

    ballast = np.ones(80_000_000)  # 640 MB resident in this (parent) process
    child = subprocess.run(
        [sys.executable, "-c", "from dpcore.runs.workers import peak_rss_mb; print(peak_rss_mb())"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert ballast.sum() > 0
    assert float(child.stdout.split()[-1]) < 500.0


def test_cuda_runs_use_their_own_cap_ranges_and_stem() -> None:
    quick = memory.PROFILES["quick"]
    on_gpu = quick.on("cuda")
    assert (on_gpu.cap_mb, on_gpu.small_log2, on_gpu.wide_log2) == (
        quick.cuda_cap_mb,
        quick.cuda_small_log2,
        quick.cuda_wide_log2,
    )
    assert quick.on("cpu") is quick
    assert memory.stem_for("cuda") == "bu2021_jl_memory_cuda" != memory.stem_for("cpu")
    assert memory.table_for("cuda") == "memory-table-cuda"


def test_sweep_stops_at_a_missing_probe_and_says_so() -> None:
    """A run cut off mid-search: the finished probes count, the row is a lower bound."""
    config = memory.MemoryConfig(
        small_log2=(2, 6),
        wide_log2=(2, 3),
        methods=(memory.Method("nonprivate"), memory.Method("dpsgd_jl", 10)),
    )
    done = {
        ("small", "nonprivate"): {4: "fits", 16: "fits", 32: "exceeds"},
        ("small", "dpsgd_jl"): {4: "fits"},
    }

    def probe(name: str, hidden: int, method: memory.Method, lot: int) -> dict | None:
        outcome = done.get((name, method.method), {}).get(lot)
        if outcome is None:
            return None
        return {"batch_size": lot, "outcome": outcome, "peak_rss_mb": 1.0, "peak_gpu_mb": None}

    rows, probes = memory.sweep(config, "cpu", probe)
    by = {(row["model"], row["method"]): row for row in rows}
    full = by[("small", "nonprivate")]
    assert (full["largest_lot"], full["complete"], full["bounded_by_memory"]) == (16, True, True)
    cut = by[("small", "dpsgd_jl")]
    assert (cut["largest_lot"], cut["complete"], cut["bounded_by_memory"]) == (4, False, False)
    assert cut["outcomes"] == "4: fits, 16: not run"
    assert memory_report._lot_text(cut) == ">= 4 (cut off)"
    never = by[("wide", "nonprivate")]
    assert (never["largest_lot"], never["complete"]) == (None, False)
    assert memory_report._lot_text(never) == "not run"
    assert len(probes) == 4


def test_a_cached_probe_is_reused_only_under_its_own_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each cached probe is keyed by everything that sets it: another lot, cap, noise
    multiplier, torch or measuring code is probed again, never read back."""
    output = Output.under(tmp_path)
    calls: list[tuple[Cell, int]] = []

    def fake_run_capped(cell: Cell, lot: int, **options: object) -> dict:
        calls.append((cell, lot))
        return {"exceeded_cap": False, "peak_rss_mb": 500.0, "step_seconds": 0.1, "error": None}

    monkeypatch.setattr(cells, "run_capped", fake_run_capped)
    full = memory.PROFILES["full"]
    setup = {"device": "cpu", "hardware": "CPU", "torch": "2.x", "code": "v1"}
    method = memory.Method("dpsgd_jl", 10, per_direction=True)

    def probe(config: memory.MemoryConfig = full, here: dict = setup, lot: int = 1024) -> dict:
        return memory.run_probe(
            config, here, "wide", memory.WIDE_HIDDEN, method, lot, output=output
        )

    first = probe()
    assert first["outcome"] == "fits" and first["batch_size"] == 1024
    assert calls == [(Cell("mnist_cnn", "dpsgd_jl", "hidden=32768,per_direction", 10), 1024)]
    assert probe() == first and len(calls) == 1
    probe(lot=2048)
    probe(dataclasses.replace(full, cap_mb=1024.0))
    probe(dataclasses.replace(full, threads=2))
    probe(here={**setup, "code": "v2"})
    probe(here={**setup, "torch": "3.x"})
    assert len(calls) == 6
    with monkeypatch.context() as patch:
        patch.setattr(torch_cells, "NOISE_MULTIPLIER", 2.0)
        probe()
    assert len(calls) == 7
    # the search ranges and the list of methods say which probes run, not what one measures
    probe(dataclasses.replace(full, small_log2=(3, 4), methods=(method,)))
    assert len(calls) == 7
    # a file stored under another key is ignored, even at the expected place
    cell = calls[0][0]
    key = memory.probe_key(full, setup, "wide", cell, 1024)
    (path,) = [p for p in output.store(memory.STEM).iterdir() if cache.load(p, key) is not None]
    stale = json.loads(path.read_text())
    stale["key"]["batch_size"] = 512
    path.write_text(json.dumps(stale))
    probe()
    assert len(calls) == 8 and cache.load(path, key) == first
    # the quick profile stores nothing
    probe(memory.PROFILES["quick"])
    probe(memory.PROFILES["quick"])
    assert len(calls) == 10


def test_the_probe_key_holds_the_code_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    modules: list[tuple[str, ...]] = []
    monkeypatch.setattr(memory, "code_fingerprint", lambda *names: modules.append(names) or "f")
    here = memory.measuring_setup("cpu", "CPU, 1 torch thread(s)")
    assert here["code"] == "f"
    assert {"dpcore.torch", "dpcore.runs.torch_cells", memory.MODULE} <= set(modules[0])
    key = memory.probe_key(memory.PROFILES["full"], here, "small", Cell("m", "nonprivate"), 4096)
    assert key["batch_size"] == 4096 and key["noise_multiplier"] == torch_cells.NOISE_MULTIPLIER
    assert key["config"]["cap_mb"] == 8192.0 and key["code"] == "f"
    assert "small_log2" not in key["config"] and "methods" not in key["config"]


def test_sweeps_on_an_executor_one_at_a_time_give_the_same_tables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each (model, method) bisection is a run of run_many, handed to the executor one at a
    time (never two measurements at once), with the rows and probes of the run here."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    lock, running, most = threading.Lock(), [0], [0]
    limits = {"nonprivate": 64, "dpsgd_exact": 16, "dpsgd_jl": 8}

    def fake_run_capped(cell: Cell, lot: int, **options: object) -> dict:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        if lot > limits[cell.method] // (2 if "hidden=32," in f"{cell.variant}," else 4):
            return {"exceeded_cap": True, "peak_rss_mb": None, "step_seconds": None}
        return {"exceeded_cap": False, "peak_rss_mb": float(lot), "step_seconds": 0.1}

    monkeypatch.setattr(cells, "run_capped", fake_run_capped)
    monkeypatch.setattr(memory.paper, "default_device", lambda: "cpu")
    tiny = memory.MemoryConfig(
        small_log2=(1, 6),
        wide_log2=(1, 4),
        wide_hidden=64,
        methods=(
            memory.Method("nonprivate"),
            memory.Method("dpsgd_exact"),
            memory.Method("dpsgd_jl", 3),
        ),
    )
    monkeypatch.setitem(memory.PROFILES, "quick", tiny)
    here, there = Output.under(tmp_path / "here"), Output.under(tmp_path / "there")
    memory.compute("quick", output=here)
    with ThreadPoolExecutor(3) as pool:
        memory.compute("quick", output=there, executor=pool)
    ours, theirs = (out.load_results(memory.STEM) for out in (here, there))
    assert ours["rows"] == theirs["rows"] and ours["probes"] == theirs["probes"]
    assert most[0] == 1 and theirs["hardware"] == "CPU, 1 torch thread(s)"
    lots = {(row["model"], row["method"]): row["largest_lot"] for row in ours["rows"]}
    assert lots == {
        ("small", "nonprivate"): 32,
        ("small", "dpsgd_exact"): 8,
        ("small", "dpsgd_jl"): 4,
        ("wide", "nonprivate"): 16,
        ("wide", "dpsgd_exact"): 4,
        ("wide", "dpsgd_jl"): 2,
    }
    small = {row["method"]: row for row in ours["rows"] if row["model"] == "small"}
    assert small["dpsgd_exact"]["ratio_to_nonprivate"] == 0.25
