"""dpcore TF rows of Bu et al. 2021, Table 2: summaries, saved schema, merging, no TF import.

TensorFlow is not installed in the test environment: the worker is replaced by a fake that
returns known lot times, so the tests check what is done with them (as for the TF Privacy
baseline), and how the saved file becomes Table 2 rows.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import workers as protocol
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl import dpcore_tf_timing as timing
from reproductions.bu2021_jl import dpcore_tf_worker as dtw
from reproductions.bu2021_jl import speed, speed_report
from reproductions.harness import Output

ROOT = Path(__file__).resolve().parents[2]
#: Seconds per lot the fake timer reports for each method.
FAKE_SECONDS = {"keras3_nonprivate": 0.2, "dpcore_tf_exact": 0.5, "dpcore_tf_jl": 0.3}


def test_method_keys_name_r_only_for_jl() -> None:
    assert dtw.method_key("dpcore_tf_jl", 30) == "dpcore_tf_jl_r30"
    assert dtw.method_key("keras3_nonprivate") == "keras3_nonprivate"
    with pytest.raises(InvalidParameterError):
        dtw.method_key("dpcore_tf_jl")
    with pytest.raises(InvalidParameterError):
        dtw.method_key("dpcore_tf_exact", 5)
    with pytest.raises(InvalidParameterError):
        dtw.method_key("keras_nonprivate")  # the TF Privacy file's Keras 2 row, not ours


def test_profiles_time_the_papers_jl_dimensions() -> None:
    full = timing.PROFILES["full"]
    assert full.jl_dimensions == paper.TABLE2_JL_DIMENSIONS == (1, 5, 10, 30)
    assert full.nonprivate_lots == 98  # a whole epoch of ceil(25,000 / 256) lots
    quick = timing.plan(timing.PROFILES["quick"])
    assert quick[0] == ("keras3_nonprivate", None)  # the reference first
    assert quick[1:] == [("dpcore_tf_exact", None), ("dpcore_tf_jl", 1), ("dpcore_tf_jl", 5)]
    config = timing.PROFILES["quick"]
    assert (config.lot_size, config.learning_rate) == (256, 1e-3)
    assert (config.max_grad_norm, config.noise_multiplier) == (1.0, 1.0)


def test_rows_use_the_median_lot_and_divide_by_keras3() -> None:
    rows = [
        timing.method_row("keras3_nonprivate", None, [0.2, 0.1, 0.3], 98),
        timing.method_row("dpcore_tf_exact", None, [1.0, 0.8, 5.0], 98, clipping="ghost"),
        timing.method_row("dpcore_tf_jl", 1, [], 98, error="MemoryError"),
    ]
    keras, exact, failed = timing.with_ratios(rows)
    assert keras["seconds_per_epoch"] == pytest.approx(0.2 * 98) and keras["extrapolated"]
    assert exact["seconds_per_step"] == 1.0 and exact["clipping"] == "ghost"
    assert exact["ratio_to_nonprivate"] == pytest.approx(5.0)
    assert keras["ratio_to_nonprivate"] == 1.0
    assert failed["seconds_per_epoch"] is None and failed["ratio_to_nonprivate"] is None
    assert failed["error"] == "MemoryError" and failed["r"] == 1 and failed["timed_steps"] == 0
    # without the reference no ratio at all
    assert timing.with_ratios(rows[1:])[0]["ratio_to_nonprivate"] is None
    with pytest.raises(InvalidParameterError):
        timing.method_row("dpcore_tf_exact", None, [1.0, float("nan")], 98)


class FakeWorker:
    """Stands in for :func:`timing.run_worker` (no child process, no TensorFlow)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, int | None]] = []
        self.fail = fail

    def __call__(
        self,
        method: str,
        config: Any,
        data_path: Path,
        checkpoint: Path | None,
        r: int | None = None,
    ) -> dict[str, Any]:
        self.calls.append((method, r))
        key = dtw.method_key(method, r)
        if key == self.fail:
            raise RuntimeError("the worker exited with status -9 (killed: out of memory?)")
        with np.load(data_path) as stored:
            assert stored["x"].shape == (8, 150)

        def timer(**lots: Any) -> list[float]:
            seconds = FAKE_SECONDS[method] * (r or 1)
            for _ in range(lots["lots"]):
                lots["on_lot"](seconds)
            return [seconds] * lots["lots"]

        warmup = config.dp_warmup if method in dtw.DP_METHODS else config.nonprivate_warmup
        wanted = config.dp_lots if method in dtw.DP_METHODS else config.nonprivate_lots
        seconds = dtw.measure_lots(key, timer, warmup=warmup, wanted=wanted, checkpoint=checkpoint)
        return {
            "step_seconds": seconds,
            "environment": {"hardware": "CPU test, 2 TensorFlow thread(s)", "keras": "3.15.1"},
            "parameters": 586_369,
            "clipping": {"dpcore_tf_exact": "ghost", "dpcore_tf_jl": "jl"}.get(method),
            "peak_rss_mb": 100.0,
            "error": None,
        }


@pytest.fixture
def fake_tf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Output:
    """No TensorFlow, no real data: outputs go under ``tmp_path``."""
    monkeypatch.setattr(
        timing,
        "load_data",
        lambda config: (np.zeros((8, 150), np.int32), np.zeros(8, np.float32)),
    )
    monkeypatch.setattr(timing, "_version", lambda package: "2.21.0")
    return Output.under(tmp_path)


def test_quick_profile_saves_the_schema_speed_reads(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = FakeWorker()
    monkeypatch.setattr(timing, "run_worker", worker)
    path = timing.compute("quick", threads=2, output=fake_tf)
    assert path == fake_tf.figures / "bu2021_jl_dpcore_tf.json"
    saved = json.loads(path.read_text())
    assert worker.calls == timing.plan(timing.PROFILES["quick"])
    rows = {(row["method"], row["r"]): row for row in saved["rows"]}
    keras = rows["keras3_nonprivate", None]
    assert keras["timed_steps"] == 10 and keras["ratio_to_nonprivate"] == 1.0
    exact = rows["dpcore_tf_exact", None]
    assert exact["seconds_per_epoch"] == pytest.approx(0.5 * 98)
    assert exact["ratio_to_nonprivate"] == pytest.approx(2.5)
    assert exact["clipping"] == "ghost" and exact["peak_rss_mb"] == 100.0
    assert rows["dpcore_tf_jl", 5]["ratio_to_nonprivate"] == pytest.approx(0.3 * 5 / 0.2)
    assert saved["hardware"] == "CPU test, 2 TensorFlow thread(s)" and saved["keras"] == "3.15.1"
    assert saved["tensorflow"] == "2.21.0" and saved["parameters"] == 586_369
    assert saved["errors"] == {} and saved["config"]["threads"] == 2
    assert saved["paper_seconds_per_epoch"]["dpcore_tf_jl_r5"] == 128.0  # Table 2
    assert "commit" in saved and "code_fingerprint" in saved and "wall_time_s" in saved
    assert (fake_tf.figures / "bu2021_jl_dpcore_tf.csv").is_file()
    assert not fake_tf.runs.exists()  # the quick profile keeps no checkpoints


def test_a_failing_method_is_a_row_with_its_error(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(timing, "run_worker", FakeWorker(fail="dpcore_tf_jl_r1"))
    saved = json.loads(
        timing.compute("quick", lots=2, jl_dimensions=[1], output=fake_tf).read_text()
    )
    assert [(row["method"], row["r"]) for row in saved["rows"]] == [
        ("keras3_nonprivate", None),
        ("dpcore_tf_exact", None),
        ("dpcore_tf_jl", 1),
    ]
    failed = saved["rows"][-1]
    assert failed["seconds_per_epoch"] is None and "out of memory" in failed["error"]
    assert list(saved["errors"]) == ["dpcore_tf_jl_r1"]
    assert saved["rows"][1]["timed_steps"] == 2 and saved["config"]["dp_lots"] == 2
    with pytest.raises(InvalidParameterError):
        timing.compute("quick", lots=0, output=fake_tf)
    with pytest.raises(InvalidParameterError):
        timing.compute("quick", jl_dimensions=[0], output=fake_tf)
    with pytest.raises(InvalidParameterError):
        timing.compute("medium", output=fake_tf)


def test_an_error_reported_by_the_worker_keeps_its_timed_lots(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    def worker(method: str, config: Any, data: Path, checkpoint: Any, r: Any = None) -> dict:
        result = FakeWorker()(method, config, data, checkpoint, r)
        if method == "dpcore_tf_exact":
            result.update(step_seconds=[0.4], error="TypeError: in user code: ...")
        return result

    monkeypatch.setattr(timing, "run_worker", worker)
    saved = json.loads(timing.compute("quick", output=fake_tf).read_text())
    exact = saved["rows"][1]
    assert exact["error"].startswith("TypeError") and exact["timed_steps"] == 1
    assert saved["errors"] == {"dpcore_tf_exact": exact["error"]}


def test_full_profile_resumes_from_its_checkpoints(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(timing.PROFILES["full"], threads=2, jl_dimensions=(1,))
    versions = {"tensorflow": "2.21.0", "keras": "2.21.0", "code_fingerprint": "x"}
    monkeypatch.setattr(timing, "code_fingerprint", lambda *modules: "x")
    monkeypatch.setattr(timing, "_version", lambda package: "2.21.0")
    exact = timing._checkpoint(config, "dpcore_tf_exact", versions, fake_tf)
    assert exact.parent == fake_tf.store(timing.STEM)
    exact.parent.mkdir(parents=True)
    exact.write_text(json.dumps({"step_seconds": [0.6, 0.4, 0.5]}))
    worker = FakeWorker()
    monkeypatch.setattr(timing, "run_worker", worker)
    saved = json.loads(timing.compute(config=config, output=fake_tf).read_text())
    rows = {row["method"]: row for row in saved["rows"]}
    assert rows["dpcore_tf_exact"]["timed_steps"] == 10
    assert json.loads(exact.read_text())["step_seconds"] == [0.6, 0.4, 0.5] + [0.5] * 7
    assert rows["keras3_nonprivate"]["extrapolated"] is False  # a whole epoch timed
    # the key ignores the numbers of lots and the list of r, not the setup or the versions
    more = dataclasses.replace(config, dp_lots=20, jl_dimensions=(1, 5, 10, 30))
    assert timing._checkpoint(more, "dpcore_tf_exact", versions, fake_tf) == exact
    other = {**versions, "code_fingerprint": "y"}
    assert timing._checkpoint(config, "dpcore_tf_exact", other, fake_tf) != exact
    fewer = dataclasses.replace(config, threads=1)
    assert timing._checkpoint(fewer, "dpcore_tf_exact", versions, fake_tf) != exact


def _worker_args(tmp_path: Path, method: str, r: int | None) -> list[str]:
    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros((4, 150), np.int32), y=np.zeros(4, np.float32))
    config = dataclasses.replace(timing.PROFILES["quick"], dp_lots=3, threads=2)
    arguments = ["--worker", method, "--data", str(data)]
    arguments += ["--config", json.dumps(dataclasses.asdict(config))]
    return arguments + ([] if r is None else ["--jl-dimension", str(r)])


@pytest.fixture
def no_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's TensorFlow parts replaced by fakes."""

    class Model:
        def count_params(self) -> int:
            return 586_369

    monkeypatch.setattr(dtw, "tensorflow_environment", lambda threads: {"threads_seen": threads})
    monkeypatch.setattr(dtw, "build_model", lambda config: Model())
    monkeypatch.setattr(dtw, "clipping_of", lambda method, config, r: "jl" if r else None)


def test_worker_command_line_round_trip(
    no_tensorflow: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[Any] = []

    def time_method(method: str, config: Any, data: Any, **kwargs: Any) -> list[float]:
        seen.append((method, kwargs["r"], kwargs["warmup"]))
        for _ in range(kwargs["lots"]):
            kwargs["on_lot"](0.25)
        return [0.25] * kwargs["lots"]

    monkeypatch.setattr(dtw, "time_method", time_method)
    assert timing.main(_worker_args(tmp_path, "dpcore_tf_jl", 5)) == 0
    out = capsys.readouterr().out
    assert out.startswith(protocol.RESULT_PREFIX) and out.count("\n") == 1
    result = protocol.find_result(out)
    assert result is not None and result["step_seconds"] == [0.25] * 3
    assert seen == [("dpcore_tf_jl", 5, 1)]
    assert result["environment"] == {"threads_seen": 2} and result["clipping"] == "jl"
    assert result["parameters"] == 586_369 and result["error"] is None


def test_a_worker_error_is_reported_on_one_line(
    no_tensorflow: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fails(method: str, config: Any, data: Any, **kwargs: Any) -> list[float]:
        raise TypeError("in user code:\n\n    \x1b[1m`dtype` <dtype: 'variant'> is bad\x1b[0m\n")

    monkeypatch.setattr(dtw, "time_method", fails)
    assert timing.main(_worker_args(tmp_path, "dpcore_tf_exact", None)) == 0
    result = protocol.find_result(capsys.readouterr().out)
    assert result is not None and result["step_seconds"] == []
    assert result["error"] == "TypeError: in user code: `dtype` <dtype: 'variant'> is bad"
    assert result["clipping"] is None


def test_run_worker_passes_r_and_the_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[list[str], dict[str, Any]]] = []
    outcome = protocol.WorkerResult("timeout", timeout=60)

    def run_worker(command: list[str], **options: Any) -> protocol.WorkerResult:
        calls.append((command, options))
        return outcome

    monkeypatch.setattr(protocol, "run_worker", run_worker)
    config = dataclasses.replace(timing.PROFILES["quick"], timeout=60.0)
    with pytest.raises(RuntimeError, match="stopped after 60 s"):
        timing.run_worker("dpcore_tf_jl", config, tmp_path / "d.npz", None, 5)
    command, options = calls[0]
    assert command[1:5] == ["-m", timing.MODULE, "--worker", "dpcore_tf_jl"]
    assert command[-2:] == ["--jl-dimension", "5"]
    assert options == {"show_stderr": True, "timeout": 60.0}
    outcome = protocol.WorkerResult("ok", row={"step_seconds": [1.0]}, returncode=0)
    assert timing.run_worker("dpcore_tf_exact", config, tmp_path / "d.npz", None) == outcome.row
    assert "--jl-dimension" not in calls[1][0]


def test_importing_the_modules_does_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'keras', 'torch'):\n"
        "            raise ImportError('imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import reproductions.bu2021_jl.dpcore_tf_timing as module\n"
        "import bench.tf_training\n"
        "print(module.STEM)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["bu2021_jl_dpcore_tf"]


# ----------------------------------------------------------------------------- Table 2 merge


def _dpcore_tf_file(tmp_path: Path, *, jl_failed: bool = False) -> Output:
    """An output holding a results file in the format :func:`timing.compute` writes."""
    output = Output.under(tmp_path)
    rows = [
        timing.method_row("keras3_nonprivate", None, [0.1], 98, peak_rss_mb=700.0),
        timing.method_row("dpcore_tf_exact", None, [0.4], 98, peak_rss_mb=1200.0),
        timing.method_row("dpcore_tf_jl", 5, [0.3], 98, clipping="jl"),
    ]
    if jl_failed:
        rows[-1] = timing.method_row("dpcore_tf_jl", 5, [], 98, error="TypeError: variant")
    payload = {
        "hardware": "CPU Y, 2 TensorFlow thread(s)",
        "keras": "3.15.1",
        "rows": timing.with_ratios(rows),
    }
    output.path(f"{speed.DPCORE_TF_STEM}.json").write_text(json.dumps(payload))
    return output


def test_dpcore_tf_rows_divide_by_their_own_keras3_row(tmp_path: Path) -> None:
    assert speed.dpcore_tf_rows(Output.under(tmp_path / "absent")) == []
    rows = speed.dpcore_tf_rows(_dpcore_tf_file(tmp_path))
    assert [(row["method"], row["r"]) for row in rows] == [
        ("keras3_nonprivate", None),
        ("dpcore_tf_exact", None),
        ("dpcore_tf_jl", 5),
    ]
    assert all(row["source"] == "dpcore_tf" for row in rows)
    keras, exact, jl = rows
    assert keras["ratio_to_nonprivate"] == 1.0
    assert exact["ratio_to_nonprivate"] == pytest.approx(4.0)
    assert jl["ratio_to_nonprivate"] == pytest.approx(3.0)
    assert exact["hardware"] == "CPU Y, 2 TensorFlow thread(s)" and exact["peak_rss_mb"] == 1200.0
    assert exact["step_seconds_median"] == 0.4 and exact["seconds_per_epoch"] == pytest.approx(39.2)
    # Bu et al. 2021, Table 2: beside the paper's non-private, TF Privacy and JL(5) rows
    assert keras["paper_seconds_per_epoch"] == 12.0
    assert exact["paper_seconds_per_epoch"] == 19_317.0
    assert jl["paper_seconds_per_epoch"] == 128.0
    assert jl["paper_ratio_to_nonprivate"] == pytest.approx(128.0 / 12.0)


def test_a_failed_dpcore_tf_method_is_a_row_with_its_error(tmp_path: Path) -> None:
    failed = speed.dpcore_tf_rows(_dpcore_tf_file(tmp_path, jl_failed=True))[-1]
    assert failed["seconds_per_epoch"] is None and failed["ratio_to_nonprivate"] is None
    assert failed["error"] == "TypeError: variant" and failed["r"] == 5


def _speed_results() -> dict[str, Any]:
    row = {
        "method": "nonprivate",
        "r": None,
        "seconds_per_epoch": 35.0,
        "ratio_to_nonprivate": 1.0,
        "extrapolated": True,
        "timed_steps": 5,
        "source": "dpcore",
        "hardware": "CPU",
        "error": None,
        **speed._paper_columns("nonprivate", None),
    }
    return {
        "config": {"profile": "quick"},
        "commit": "0123456789abcdef",
        "hardware": "CPU, 1 torch thread(s) of 2 cores",
        "torch": "2.x",
        "wall_time_s": 100.0,
        "paper_hardware": "P100",
        "crossover": {"exact_seconds_per_epoch": None, "first_slower_r": None, "fitted_r": None},
        "rows": [row],
    }


def test_table_shows_the_dpcore_tf_rows_or_how_to_get_them(tmp_path: Path) -> None:
    missing = speed_report.readme_table(_speed_results(), Output.under(tmp_path / "none"))
    assert speed.DPCORE_TF_MISSING in missing and speed.TF_PRIVACY_MISSING in missing
    output = _dpcore_tf_file(tmp_path)
    table = speed_report.readme_table(_speed_results(), output)
    assert speed.DPCORE_TF_MISSING not in table
    assert "| dpcore TF DP-Adam, exact | 39.2 | 4.00 | 19,317 | 1,609.8 |" in table
    assert "| dpcore TF DP-Adam-JL, r = 5 | 29.4 | 3.00 | 128 | 10.7 |" in table
    assert "dpcore TF run on CPU Y, 2 TensorFlow thread(s)" in table
    failed = speed_report.readme_table(
        _speed_results(), _dpcore_tf_file(tmp_path / "f", jl_failed=True)
    )
    assert (
        "| dpcore TF DP-Adam-JL, r = 5 | - | - | 128 | 10.7 | failed: TypeError: variant |"
        in failed
    )
    # a GPU run gets no CPU-timed TensorFlow rows, only the note
    gpu = speed_report.readme_table({**_speed_results(), "device": "cuda"}, output)
    assert speed.DPCORE_TF_NOT_ON_GPU in gpu and "39.2" not in gpu
    # saved beside ours when the file is gone
    saved = {**_speed_results(), "rows": _speed_results()["rows"] + speed.dpcore_tf_rows(output)}
    rows = speed_report.table_rows(saved, Output.under(tmp_path / "none"))
    assert [row["source"] for row in rows] == ["dpcore"] + ["dpcore_tf"] * 3
