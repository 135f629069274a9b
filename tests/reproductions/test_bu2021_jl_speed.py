"""Table 2 of the Bu et al. 2021 reproduction: extrapolation, crossover, TF Privacy rows, table.

Paper values (Bu et al. 2021, Table 2, P100) are read from the reproduction's config; the tests
check arithmetic and rendering on fake rows, and one real step of each step builder on fake data.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpcore.runs import measurements as cache
from dpcore.runs.cells import Cell
from reproductions.bu2021_jl import speed, speed_report
from reproductions.harness import Output


def test_extrapolation_is_mean_lot_time_times_lots() -> None:
    assert speed.extrapolate([0.5, 0.5, 0.5, 0.5], 98) == pytest.approx(49.0)
    assert speed.extrapolate([1.0, 3.0], 98) == pytest.approx(196.0)
    with pytest.raises(ValueError, match="no timed lots"):
        speed.extrapolate([], 98)


def test_an_imdb_epoch_is_98_lots() -> None:
    assert speed.lots_per_epoch(speed.PROFILES["quick"]) == 98  # round(25,000 / 256)


def _fake(method: str, r: int | None, seconds: float | None) -> dict:
    return {"method": method, "r": r, "seconds_per_epoch": seconds}


def test_crossover_first_slower_r_and_fitted_line() -> None:
    rows = [_fake("dp_adam_exact", None, 70.0)] + [
        _fake("dp_adam_jl", r, 40.0 + 20.0 * r) for r in (1, 5, 10)
    ]
    result = speed.crossover(rows)
    assert result["first_slower_r"] == 5
    assert result["fitted_r"] == pytest.approx(1.5)


def test_crossover_when_jl_is_always_slower_or_never() -> None:
    slower = [_fake("dp_adam_exact", None, 10.0)] + [
        _fake("dp_adam_jl", r, 20.0 * r) for r in (1, 5)
    ]
    assert speed.crossover(slower)["first_slower_r"] == 1
    assert speed.crossover(slower)["fitted_r"] < 1
    faster = [_fake("dp_adam_exact", None, 1000.0), _fake("dp_adam_jl", 1, 5.0)]
    assert speed.crossover(faster) == {
        "exact_seconds_per_epoch": 1000.0,
        "first_slower_r": None,
        "fitted_r": None,
    }


def _tf_file(tmp_path: Path, *, vectorized_failed: bool = False) -> Output:
    """An output holding a results file in the format ``tf_privacy_baseline.compute`` writes."""
    output = Output.under(tmp_path)
    path = output.path(f"{speed.TF_PRIVACY_STEM}.json")
    rows = [
        {
            "method": "keras_nonprivate",
            "seconds_per_step": 0.1,
            "seconds_per_epoch": 10.0,
            "extrapolated": False,
            "timed_steps": 98,
        },
        {
            "method": "tf_privacy_vanilla",
            "seconds_per_step": 5.0,
            "seconds_per_epoch": 500.0,
            "extrapolated": True,
            "timed_steps": 3,
        },
    ]
    errors = {"tf_privacy_vanilla@32": "MemoryError"}  # a lot-scaling probe: not a table row
    if vectorized_failed:
        errors["tf_privacy_vectorized"] = "RuntimeError: the worker exited with status -9"
    payload = {
        "hardware": "CPU X, 2 TensorFlow thread(s)",
        "peak_rss_mb": {"keras_nonprivate": 900.0, "tf_privacy_vanilla": 23_000.0},
        "errors": errors,
        "rows": rows,
    }
    path.write_text(json.dumps(payload))
    return output


def test_tf_privacy_rows_are_optional_and_use_their_own_reference(tmp_path: Path) -> None:
    assert speed.tf_privacy_rows(Output.under(tmp_path / "absent")) == []
    rows = speed.tf_privacy_rows(_tf_file(tmp_path))
    assert [row["method"] for row in rows] == ["keras_nonprivate", "tf_privacy_vanilla"]
    vanilla = rows[1]
    assert vanilla["ratio_to_nonprivate"] == pytest.approx(50.0)
    assert vanilla["source"] == "tf_privacy" and vanilla["extrapolated"] is True
    assert vanilla["paper_seconds_per_epoch"] == 19_317.0  # Bu et al. 2021, Table 2
    assert vanilla["step_seconds_median"] == 5.0
    # hardware and peak memory live at the file's top level
    assert vanilla["hardware"] == "CPU X, 2 TensorFlow thread(s)"
    assert vanilla["peak_rss_mb"] == 23_000.0
    assert rows[0]["paper_seconds_per_epoch"] == 12.0  # Keras stands beside the paper's 12 s


def test_a_failed_tf_privacy_method_is_a_row_with_its_error(tmp_path: Path) -> None:
    rows = speed.tf_privacy_rows(_tf_file(tmp_path, vectorized_failed=True))
    failed = rows[-1]
    assert failed["method"] == "tf_privacy_vectorized"
    assert failed["seconds_per_epoch"] is None and "status -9" in failed["error"]
    # the vectorized optimizer is not in the paper: no paper value beside it
    assert failed["paper_seconds_per_epoch"] is None


def test_paper_rows_beside_ours() -> None:
    """Bu et al. 2021, Table 2: our exact DP-Adam stands beside the paper's only exact row (TF
    Privacy's vanilla DP-Adam); JL rows beside JL rows; nothing beside extra rows."""
    assert speed._paper_key("nonprivate", None) == "nonprivate"
    assert speed._paper_key("dp_adam_exact", None) == "tf_privacy_vanilla"
    assert speed._paper_key("dp_adam_jl", 30) == "jl_30"
    assert speed._paper_key("tf_privacy_vectorized", None) is None
    assert speed._paper_columns("tf_privacy_vectorized", None)["paper_seconds_per_epoch"] is None


def test_gpu_results_have_their_own_stem_and_no_tf_privacy_rows(tmp_path: Path) -> None:
    output = _tf_file(tmp_path)
    assert speed.stem_for("cuda") == "bu2021_jl_speed_cuda" != speed.stem_for("cpu")
    assert speed.table_for("cuda") == "speed-table-cuda"
    gpu = {**_results(), "device": "cuda"}
    assert all(row["source"] == "dpcore" for row in speed_report.table_rows(gpu, output))
    table = speed_report.readme_table(gpu, output)
    assert speed.TF_PRIVACY_NOT_ON_GPU in table and "500.0" not in table
    cpu = {**_results(), "device": "cpu"}
    assert any(row["source"] == "tf_privacy" for row in speed_report.table_rows(cpu, output))


def _results() -> dict:
    def row(method: str, r: int | None, seconds: float, ratio: float) -> dict:
        return {
            "method": method,
            "r": r,
            "seconds_per_epoch": seconds,
            "ratio_to_nonprivate": ratio,
            "extrapolated": True,
            "timed_steps": 5,
            "source": "dpcore",
            "hardware": "CPU",
            "error": None,
            **speed._paper_columns(method, r),
        }

    return {
        "config": {"profile": "quick"},
        "commit": "0123456789abcdef",
        "hardware": "CPU, 1 torch thread(s) of 2 cores",
        "torch": "2.x",
        "wall_time_s": 100.0,
        "paper_hardware": "P100",
        "crossover": {"exact_seconds_per_epoch": 70.0, "first_slower_r": 1, "fitted_r": 0.4},
        "rows": [
            row("nonprivate", None, 35.0, 1.0),
            row("dp_adam_exact", None, 70.0, 2.0),
            row("dp_adam_jl", 1, 80.0, 80 / 35),
        ],
    }


def test_table_says_how_to_get_tf_privacy_when_missing(tmp_path: Path) -> None:
    table = speed_report.readme_table(_results(), Output.under(tmp_path))
    assert speed.TF_PRIVACY_MISSING in table
    assert "| DP-Adam-JL, r = 1 | 80.0 | 2.29 | 41 | 3.4 | extrapolated from 5 lots |" in table
    assert "is **1**" in table


def test_table_includes_tf_privacy_rows_when_present(tmp_path: Path) -> None:
    table = speed_report.readme_table(_results(), _tf_file(tmp_path))
    assert speed.TF_PRIVACY_MISSING not in table
    assert "| TF Privacy vanilla DP-Adam | 500.0 | 50.00 | 19,317 |" in table


def test_plot_draws_and_tabulates_every_saved_device(tmp_path: Path) -> None:
    """From the saved results of ``output`` only: one figure and README table per device."""
    output = _tf_file(tmp_path)
    data = _results()
    extra = {key: value for key, value in data.items() if key not in ("config", "rows", "commit")}
    output.save_results(speed.STEM, config=data["config"], rows=data["rows"], extra=extra)
    gpu = {**extra, "device": "cuda"}
    output.save_results(speed.stem_for("cuda"), config=data["config"], rows=data["rows"], extra=gpu)
    readme = tmp_path / "README.md"
    names = [speed.table_for(device) for device in ("cpu", "cuda")]
    readme.write_text("".join(f"<!-- {name}:start -->\n<!-- {name}:end -->\n" for name in names))
    speed_report.plot(output=output, readme=readme)
    for device in ("cpu", "cuda"):
        assert output.path(f"{speed.stem_for(device)}.png").stat().st_size > 1000
    cpu_table, gpu_table = readme.read_text().split("<!-- speed-table:end -->")
    assert "| TF Privacy vanilla DP-Adam | 500.0 | 50.00 | 19,317 |" in cpu_table
    assert speed.TF_PRIVACY_NOT_ON_GPU in gpu_table


@pytest.mark.parametrize(
    "cell",
    [
        Cell("imdb_lstm", "nonprivate", "lstm"),
        Cell("imdb_lstm", "dp_adam_exact", "dplstm"),
        Cell("imdb_lstm", "dp_adam_jl", "lstm", 1),
    ],
)
def test_step_builders_train_on_fake_reviews(monkeypatch: pytest.MonkeyPatch, cell: Cell) -> None:
    rng = np.random.default_rng(0)
    fake = (rng.integers(0, 8000, size=(64, 150)), rng.integers(0, 2, size=64))
    monkeypatch.setattr(speed, "_imdb_train", lambda: fake)
    config = speed.SpeedConfig(dataset_size=64, lot_size=8)
    model, step = speed.build(cell, torch.device("cpu"), config)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert changed


def test_a_cached_measurement_is_reused_only_under_its_own_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each cached timing is keyed by everything that sets it: another lot size, noise
    multiplier, warm-up, torch or measuring code is timed again, never read back."""
    output = Output.under(tmp_path)
    calls: list[dict] = []

    def fake_run_timing(cell: Cell, **options: object) -> dict:
        calls.append(dict(options))
        return {"step_seconds": 0.5, "step_seconds_all": [0.5, 0.5], "error": None}

    monkeypatch.setattr(speed, "run_timing", fake_run_timing)
    full = speed.PROFILES["full"]
    setup = {"device": "cpu", "threads": 2, "hardware": "CPU", "torch": "2.x", "code": "v1"}
    cell = Cell("imdb_lstm", "dp_adam_jl", "lstm", 5)
    first = speed.measure_cell(cell, full, setup, output=output)
    assert speed.measure_cell(cell, full, setup, output=output) == first and len(calls) == 1
    assert calls[0]["module"] == speed.MODULE and calls[0]["threads"] == 2
    changed = [
        (dataclasses.replace(full, lot_size=128), setup),
        (dataclasses.replace(full, noise_multiplier=2.0), setup),
        (dataclasses.replace(full, warmup=3), setup),
        (dataclasses.replace(full, timed_lots=5), setup),
        (full, {**setup, "code": "v2"}),
        (full, {**setup, "torch": "3.x"}),
        (full, {**setup, "device": "cuda"}),
    ]
    for config, here in changed:
        speed.measure_cell(cell, config, here, output=output)
    assert len(calls) == 1 + len(changed)
    # which JL dimensions a run times says which cells run, not how one is timed
    speed.measure_cell(cell, dataclasses.replace(full, jl_dimensions=(5,)), setup, output=output)
    assert len(calls) == 1 + len(changed)
    # a file at the right place but stored under another key is ignored (and replaced)
    key = speed.measurement_key(cell, full, setup)
    path = cache.cached_path(output.store(speed.STEM), "dp_adam_jl_5", key)
    stale = json.loads(path.read_text())
    stale["key"]["config"]["lot_size"] = 999
    path.write_text(json.dumps(stale))
    speed.measure_cell(cell, full, setup, output=output)
    assert len(calls) == 2 + len(changed)
    assert cache.load(path, key) == first
    # the quick profile reads nothing it did not store, and stores nothing
    quick = speed.PROFILES["quick"]
    speed.measure_cell(cell, quick, setup, output=output)
    speed.measure_cell(cell, quick, setup, output=output)
    assert len(calls) == 4 + len(changed)


def test_the_cache_key_holds_the_code_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    fingerprinted: list[tuple[str, ...]] = []

    def fingerprint(*modules: str) -> str:
        fingerprinted.append(modules)
        return "f" * 16

    monkeypatch.setattr(speed, "code_fingerprint", fingerprint)
    here = speed.measuring_setup("cpu", 1)
    assert here["code"] == "f" * 16 and here["torch"] == torch.__version__
    assert {"dpcore.torch", "dpcore.runs.cells", speed.MODULE} <= set(fingerprinted[0])
    key = speed.measurement_key(
        Cell("imdb_lstm", "nonprivate", "lstm"), speed.PROFILES["full"], here
    )
    assert key["config"]["lot_size"] == 256 and key["config"]["noise_multiplier"] == 1.0
    assert key["config"]["warmup"] == 2 and key["code"] == "f" * 16


def test_methods_timed_on_an_executor_one_at_a_time_give_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each method is a run of run_many, handed to the executor one at a time (never two
    timings at once), and its row names the machine that timed it; the full profile's
    measurements are kept in the output's run store and read back there."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    lock, running, most, calls = threading.Lock(), [0], [0], []

    def fake_run_timing(cell: Cell, **options: object) -> dict:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
            calls.append(cell)
        seconds = 0.1 * (1 + (cell.jl_dimension or 0)) + 0.2 * (cell.method == "dp_adam_exact")
        return {"step_seconds": seconds, "step_seconds_all": [seconds] * 2, "error": None}

    monkeypatch.setattr(speed, "run_timing", fake_run_timing)
    monkeypatch.setattr(speed, "_imdb_train", lambda: None)
    monkeypatch.setattr(speed.paper, "default_device", lambda: "cpu")
    config = dataclasses.replace(speed.PROFILES["full"], jl_dimensions=(1, 5), threads=1)
    here, there = Output.under(tmp_path / "here"), Output.under(tmp_path / "there")
    speed.compute(config=config, output=here)
    with ThreadPoolExecutor(3) as pool:
        speed.compute(config=config, output=there, executor=pool)
    ours, theirs = (out.load_results(speed.STEM) for out in (here, there))
    assert ours["rows"] == theirs["rows"] and len(ours["rows"]) == 4
    assert most[0] == 1 and len(calls) == 8
    assert {row["hardware"] for row in theirs["rows"]} == {theirs["hardware"]}
    assert theirs["runs_spread"] == "one method at a time, on the executor"
    with ThreadPoolExecutor(3) as pool:  # the full profile's timings are read back
        speed.compute(config=config, output=there, executor=pool)
    assert len(calls) == 8 and there.load_results(speed.STEM)["rows"] == theirs["rows"]
