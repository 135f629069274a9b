"""TF Privacy baseline of Bu et al. 2021, Table 2: arithmetic, saved schema, resuming, no TF import.

TensorFlow is not installed in the test environment: the timing function is replaced by a fake
that returns known lot times, so the tests check what is done with them.
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
from reproductions.bu2021_jl import tf_privacy_baseline as tfp
from reproductions.bu2021_jl import tf_privacy_worker as tfw
from reproductions.harness import Output

ROOT = Path(__file__).resolve().parents[2]
#: The row keys reproductions/bu2021_jl/speed.py reads from the saved file.
ROW_KEYS = {
    "method",
    "seconds_per_step",
    "seconds_per_epoch",
    "extrapolated",
    "timed_steps",
    "lots_per_epoch",
}
#: Seconds per lot the fake timer reports for each method.
FAKE_SECONDS = {"keras_nonprivate": 0.25, "tf_privacy_vanilla": 40.0, "tf_privacy_vectorized": 30.0}


def test_an_epoch_of_fixed_lots_is_ceil_n_over_l() -> None:
    assert tfp.lots_per_epoch(25_000, 256) == 98  # 97 full lots and one of 168 reviews
    assert tfp.lots_per_epoch(512, 256) == 2
    assert tfp.lots_per_epoch(513, 256) == 3
    with pytest.raises(InvalidParameterError):
        tfp.lots_per_epoch(0, 256)


def test_extrapolation_uses_the_median_lot() -> None:
    row = tfp.summarize("tf_privacy_vanilla", [200.0, 190.0, 500.0], 98)
    assert row["seconds_per_step"] == 200.0
    assert row["seconds_per_epoch"] == pytest.approx(200.0 * 98)
    assert row["extrapolated"] is True and row["timed_steps"] == 3
    two = tfp.summarize("tf_privacy_vanilla", [1.0, 2.0], 98)
    assert two["seconds_per_epoch"] == pytest.approx(1.5 * 98)


def test_a_whole_timed_epoch_is_summed_not_extrapolated() -> None:
    times = [1.0] * 97 + [3.0]
    row = tfp.summarize("keras_nonprivate", times, 98)
    assert row["extrapolated"] is False
    assert row["seconds_per_epoch"] == pytest.approx(100.0)
    assert row["seconds_per_step"] == 1.0


@pytest.mark.parametrize("times", [[], [1.0, float("nan")], [-1.0]])
def test_summarize_rejects_bad_timings(times: list[float]) -> None:
    with pytest.raises(InvalidParameterError):
        tfp.summarize("keras_nonprivate", times, 98)


def fake_timer(
    method: str, config: Any, data: Any, *, warmup: int, lots: int, on_lot: Any = None
) -> list[float]:
    """Stands in for :func:`tfp.time_method`: ``FAKE_SECONDS[method]`` a lot of 256, and
    quadratic in the lot size (like TF Privacy's per-example Jacobian)."""
    seconds = FAKE_SECONDS[method] * (config.lot_size / 256) ** 2
    for _ in range(lots):
        on_lot(seconds)
    return [seconds] * lots


class FakeWorker:
    """Stands in for :func:`tfp.run_worker` (no child process, no TensorFlow)."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def __call__(
        self, method: str, config: Any, data_path: Path, checkpoint: Path | None
    ) -> dict[str, Any]:
        self.calls.append((method, config.lot_size))
        if method == self.fail:
            raise RuntimeError("the worker exited with status -9 (killed: out of memory?)")
        with np.load(data_path) as stored:
            assert stored["x"].shape == (8, 150)
        seconds = tfp.measure(method, config, ([], []), checkpoint, timer=fake_timer)
        environment = {"hardware": "CPU test, 2 TensorFlow thread(s)", "keras": "2.15.0"}
        return {
            "step_seconds": seconds,
            "environment": environment,
            "parameters": 586_369,
            "peak_rss_mb": 100.0,
        }


@pytest.fixture
def fake_tf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Output:
    """No TensorFlow, no real data: outputs go under ``tmp_path``."""
    monkeypatch.setattr(
        tfp, "load_data", lambda config: (np.zeros((8, 150), np.int32), np.zeros(8, np.float32))
    )
    monkeypatch.setattr(tfp, "_version", lambda package: "2.15.1")
    return Output.under(tmp_path)


def test_quick_profile_saves_the_schema_speed_reads(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = FakeWorker()
    monkeypatch.setattr(tfp, "run_worker", worker)
    path = tfp.compute("quick", output=fake_tf)
    assert path == fake_tf.figures / "bu2021_jl_tf_privacy.json"
    saved = json.loads(path.read_text())
    # the vanilla optimizer at the smaller scaling lots first, then every method at 256
    assert worker.calls == [("tf_privacy_vanilla", 32), ("tf_privacy_vanilla", 64)] + [
        (method, 256) for method in tfp.METHODS
    ]
    assert [row["method"] for row in saved["rows"]] == list(tfp.METHODS)
    for row in saved["rows"]:
        assert set(row) == ROW_KEYS
        assert row["lots_per_epoch"] == 98
    keras, vanilla, _ = saved["rows"]
    assert keras["timed_steps"] == 10 and keras["extrapolated"] is True
    assert vanilla["timed_steps"] == 2 and vanilla["extrapolated"] is True
    assert vanilla["seconds_per_epoch"] == pytest.approx(40.0 * 98)
    assert saved["tensorflow"] == "2.15.1" and saved["keras"] == "2.15.0"
    assert saved["hardware"] == "CPU test, 2 TensorFlow thread(s)"
    assert saved["parameters"] == 586_369 and saved["errors"] == {}
    keys = ["tf_privacy_vanilla@32", "tf_privacy_vanilla@64", *tfp.METHODS]
    assert saved["peak_rss_mb"] == dict.fromkeys(keys, 100.0)
    scaling = saved["lot_scaling"]
    assert [point["lot_size"] for point in scaling["points"]] == [32, 64, 256]
    assert scaling["points"][0]["seconds_per_step"] == pytest.approx(40.0 / 64)
    assert scaling["exponent"] == pytest.approx(2.0)
    assert saved["paper_seconds_per_epoch"]["tf_privacy_vanilla"] == 19_317.0  # Table 2
    assert saved["config"]["threads"] >= 1 and "wall_time_s" in saved and "commit" in saved
    assert (fake_tf.figures / "bu2021_jl_tf_privacy.csv").is_file()
    assert not fake_tf.runs.exists()  # the quick profile keeps no checkpoints


def test_lots_option_and_a_failing_worker(fake_tf: Output, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tfp, "run_worker", FakeWorker(fail="tf_privacy_vectorized"))
    saved = json.loads(tfp.compute("quick", lots=5, threads=1, output=fake_tf).read_text())
    assert [row["method"] for row in saved["rows"]] == ["keras_nonprivate", "tf_privacy_vanilla"]
    assert saved["rows"][1]["timed_steps"] == 5 and saved["config"]["dp_lots"] == 5
    assert saved["config"]["threads"] == 1
    assert list(saved["errors"]) == ["tf_privacy_vectorized"]
    assert "out of memory" in saved["errors"]["tf_privacy_vectorized"]


def test_a_vanilla_lot_of_256_that_fails_keeps_the_smaller_lots(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = FakeWorker()

    def killed_at_256(method: str, config: Any, data: Path, checkpoint: Any) -> dict[str, Any]:
        if method != "keras_nonprivate" and config.lot_size == 256:
            raise RuntimeError("the worker exited with status -9 (killed: out of memory?)")
        return worker(method, config, data, checkpoint)

    monkeypatch.setattr(tfp, "run_worker", killed_at_256)
    saved = json.loads(tfp.compute("quick", output=fake_tf).read_text())
    assert [row["method"] for row in saved["rows"]] == ["keras_nonprivate"]
    assert set(saved["errors"]) == {"tf_privacy_vanilla", "tf_privacy_vectorized"}
    assert [point["lot_size"] for point in saved["lot_scaling"]["points"]] == [32, 64]
    assert saved["lot_scaling"]["exponent"] == pytest.approx(2.0)
    with pytest.raises(InvalidParameterError):
        tfp.compute("quick", lots=0, output=fake_tf)
    with pytest.raises(InvalidParameterError):
        tfp.compute("medium", output=fake_tf)


def test_full_profile_resumes_from_its_checkpoints(
    fake_tf: Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(tfp.PROFILES["full"], threads=2)
    vanilla = tfp._checkpoint(config, "tf_privacy_vanilla", "2.15.1", fake_tf)
    assert vanilla.parent == fake_tf.store(tfp.STEM)
    vanilla.parent.mkdir(parents=True)
    vanilla.write_text(json.dumps({"step_seconds": [41.0, 39.0, 40.0]}))
    keras = tfp._checkpoint(config, "keras_nonprivate", "2.15.1", fake_tf)
    keras.write_text(json.dumps({"step_seconds": [0.5] * 98}))
    worker = FakeWorker()
    monkeypatch.setattr(tfp, "run_worker", worker)
    saved = json.loads(tfp.compute("full", threads=2, output=fake_tf).read_text())
    # the finished non-private epoch is read back without a worker
    assert [call for call in worker.calls if call[1] == 256] == [
        ("tf_privacy_vanilla", 256),
        ("tf_privacy_vectorized", 256),
    ]
    assert [call[1] for call in worker.calls if call[1] != 256] == [32, 64, 128]
    rows = {row["method"]: row for row in saved["rows"]}
    assert rows["keras_nonprivate"]["extrapolated"] is False
    assert rows["keras_nonprivate"]["seconds_per_epoch"] == pytest.approx(49.0)
    assert rows["tf_privacy_vanilla"]["timed_steps"] == 10
    assert rows["tf_privacy_vanilla"]["seconds_per_step"] == 40.0
    # vanilla timed only its 7 missing lots, appended to the checkpoint
    assert json.loads(vanilla.read_text())["step_seconds"] == [41.0, 39.0, 40.0] + [40.0] * 7


def test_measure_asks_the_timer_for_the_missing_lots_only(tmp_path: Path) -> None:
    config = tfp.PROFILES["full"]
    checkpoint = tmp_path / "vanilla.json"
    checkpoint.write_text(json.dumps({"step_seconds": [1.0] * 4}))
    asked: list[tuple[int, int]] = []

    def timer(method: str, config: Any, data: Any, **kwargs: Any) -> list[float]:
        asked.append((kwargs["warmup"], kwargs["lots"]))
        return fake_timer(method, config, data, **kwargs)

    seconds = tfp.measure("tf_privacy_vanilla", config, ([], []), checkpoint, timer=timer)
    assert asked == [(1, 6)] and seconds == [1.0] * 4 + [40.0] * 6
    assert tfp.measure("tf_privacy_vanilla", config, ([], []), checkpoint, timer=timer) == seconds
    assert asked == [(1, 6)]  # complete: no second call


def test_checkpoints_depend_on_the_setup_not_on_the_number_of_lots(tmp_path: Path) -> None:
    config = tfp.PROFILES["full"]
    output = Output.under(tmp_path)
    path = tfp._checkpoint(config, "tf_privacy_vanilla", "2.15.1", output)
    more = dataclasses.replace(config, dp_lots=20)
    assert tfp._checkpoint(more, "tf_privacy_vanilla", "2.15.1", output) == path
    assert tfp._checkpoint(config, "tf_privacy_vanilla", "2.16.0", output) != path
    fewer_threads = dataclasses.replace(config, threads=1)
    assert tfp._checkpoint(fewer_threads, "tf_privacy_vanilla", "2.15.1", output) != path


def test_worker_command_line_round_trip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tfw, "configure_tensorflow", lambda threads: {"threads_seen": threads})
    monkeypatch.setattr(tfw, "time_method", fake_timer)

    class Model:
        def count_params(self) -> int:
            return 586_369

    monkeypatch.setattr(tfw, "build_model", lambda config: Model())
    data = tmp_path / "data.npz"
    np.savez(data, x=np.zeros((4, 150), np.int32), y=np.zeros(4, np.float32))
    config = dataclasses.replace(tfp.PROFILES["quick"], dp_lots=3, threads=2)
    arguments = ["--worker", "tf_privacy_vanilla", "--data", str(data)]
    assert tfp.main([*arguments, "--config", json.dumps(dataclasses.asdict(config))]) == 0
    # the worker's stdout is its one result line (dpcore.runs.workers); progress is on stderr
    out = capsys.readouterr().out
    assert out.startswith(protocol.RESULT_PREFIX) and out.count("\n") == 1
    result = protocol.find_result(out)
    assert result is not None and result["step_seconds"] == [40.0] * 3
    assert result["environment"] == {"threads_seen": 2} and result["parameters"] == 586_369


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (
            protocol.WorkerResult("crashed", returncode=-9),
            "the worker exited with status -9 (killed: out of memory?)",
        ),
        (protocol.WorkerResult("crashed", returncode=1), "the worker exited with status 1"),
        (
            protocol.WorkerResult("unreadable", returncode=0, problem="the line is not JSON"),
            "the worker printed an unreadable result line: the line is not JSON",
        ),
    ],
)
def test_a_failed_worker_is_an_error_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, outcome: Any, message: str
) -> None:
    commands: list[list[str]] = []

    def run_worker(command: list[str], **options: Any) -> protocol.WorkerResult:
        commands.append(command)
        assert options == {"show_stderr": True}  # the worker's progress stays visible
        return outcome

    monkeypatch.setattr(protocol, "run_worker", run_worker)
    config = tfp.PROFILES["quick"]
    with pytest.raises(RuntimeError) as raised:
        tfp.run_worker("tf_privacy_vanilla", config, tmp_path / "data.npz", None)
    assert str(raised.value) == message
    assert commands[0][1:5] == ["-m", tfp.MODULE, "--worker", "tf_privacy_vanilla"]
    ok = protocol.WorkerResult("ok", row={"step_seconds": [1.0]}, returncode=0)
    monkeypatch.setattr(protocol, "run_worker", lambda command, **options: ok)
    assert tfp.run_worker("keras_nonprivate", config, tmp_path / "d.npz", None) == ok.row


def test_importing_the_module_does_not_import_tensorflow() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'tensorflow_privacy', 'torch'):\n"
        "            raise ImportError('imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import reproductions.bu2021_jl.tf_privacy_baseline as module\n"
        "assert 'tensorflow' not in sys.modules and 'torch' not in sys.modules\n"
        "print(module.STEM)\n"
        # where `nox -s tfprivacy` writes, found without torch
        "output = module.default_output()\n"
        "assert 'torch' not in sys.modules\n"
        "print(output.figures, output.store(module.STEM))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    stem, where = result.stdout.splitlines()
    assert stem == "bu2021_jl_tf_privacy"
    assert where.split() == [
        str(ROOT / "figures"),
        str(ROOT / "reproductions" / "checkpoints" / stem),
    ]
