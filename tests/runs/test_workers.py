"""The worker protocol (dpcore.runs.workers): one result line per worker, and every way a worker can
end (a row, a crash, a kill for memory or time, an unreadable line) as a typed result."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from dpcore.runs import workers as protocol
from dpcore.runs.workers import ResultLineError, WorkerResult

#: The repository root, where a child process can import ``dpcore``.
ROOT = Path(protocol.__file__).resolve().parents[2]


def test_a_row_round_trips_through_its_result_line() -> None:
    row = {"step_seconds": 0.25, "error": None, "times": [1.0, 2.0]}
    out = io.StringIO()
    protocol.emit_result(row, out)
    text = out.getvalue()
    assert text.startswith(protocol.RESULT_PREFIX) and text.count("\n") == 1
    assert protocol.parse_result_line(text.strip()) == row
    noisy = f"loading...\nwarning: slow\n{text}done\n"
    assert protocol.find_result(noisy) == row
    # a progress bar left without a newline on a shared stream
    assert protocol.find_result("50%|#####     \r 60%" + text) == row
    assert protocol.find_result("no result here\n") is None


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("BENCH-RESULT {not json", "not JSON"),
        ("BENCH-RESULT [1, 2]", "list, not a JSON object"),
        ("BENCH-RESULT ", "not JSON"),
        ("RESULT {}", "no 'BENCH-RESULT' prefix"),
    ],
)
def test_a_garbage_result_line_is_a_result_line_error(line: str, problem: str) -> None:
    with pytest.raises(ResultLineError, match=problem):
        protocol.parse_result_line(line)


def test_two_result_lines_are_an_error() -> None:
    line = protocol.format_result({"error": None})
    with pytest.raises(ResultLineError, match="2 result lines"):
        protocol.find_result(f"{line}\n{line}\n")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_worker_that_prints_its_row_is_ok() -> None:
    code = (
        "import sys; from dpcore.runs.workers import emit_result\n"
        "print('progress'); print('a warning', file=sys.stderr)\n"
        "emit_result({'step_seconds': 0.5, 'error': None})\n"
    )
    result = protocol.run_worker(_python(code), cwd=ROOT)
    assert result.status == "ok" and result.ok and result.returncode == 0
    assert result.row == {"step_seconds": 0.5, "error": None}
    assert result.error is None and not result.oom
    assert result.polled_rss_mb is None  # not watched without a cap


def test_a_row_with_an_error_is_still_ok_and_says_so() -> None:
    code = "from dpcore.runs.workers import emit_result; emit_result({'error': 'MemoryError: '})"
    result = protocol.run_worker(_python(code), cwd=ROOT)
    assert result.ok and result.error == "MemoryError: " and result.oom


def test_a_crash_is_a_typed_result_with_the_end_of_its_output() -> None:
    result = protocol.run_worker(_python("raise ValueError('broken worker')"))
    assert result.status == "crashed" and not result.ok and result.row is None
    assert result.returncode == 1 and not result.oom
    assert result.error is not None
    assert result.error.startswith("worker exited with status 1: Traceback")
    assert "ValueError: broken worker" in result.error


def test_a_worker_killed_by_sigkill_is_out_of_memory() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = protocol.run_worker(_python(code))
    assert (result.status, result.returncode, result.oom) == ("crashed", -9, True)
    assert protocol.is_oom({"error": result.error})


def test_a_garbage_line_from_a_worker_is_unreadable_not_a_trace() -> None:
    result = protocol.run_worker(_python("print('BENCH-RESULT {half a row')"))
    assert result.status == "unreadable" and result.row is None and result.returncode == 0
    assert result.error is not None and "unreadable result line" in result.error
    assert "not JSON" in (result.problem or "")


def test_the_parent_kills_a_worker_over_its_time_or_memory() -> None:
    slow = protocol.run_worker(_python("import time; time.sleep(30)"), timeout=0.5)
    assert slow.status == "timeout" and slow.error == "timed out after 0 s" and not slow.oom
    # any Python interpreter is resident above 1 MiB: killed at the first poll
    big = protocol.run_worker(_python("import time; time.sleep(30)"), cap_mb=1.0, timeout=20)
    assert big.status == "over_cap" and big.oom
    assert big.polled_rss_mb is not None and big.polled_rss_mb > 1.0
    assert big.error == "killed above the memory cap of 1 MiB"


def test_the_protocol_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'tensorflow', 'numpy'):\n"
        "            raise ImportError('imported ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import dpcore.runs.workers, dpcore.runs.measurements, dpcore.runs.markers\n"
        "dpcore.runs.workers.emit_result({'torch': 'torch' in sys.modules})\n"
    )
    result = protocol.run_worker(_python(code), cwd=ROOT)
    assert result.ok, result.error
    assert result.row == {"torch": False}


def test_typed_results_messages() -> None:
    assert WorkerResult("ok", row={"error": None}).error is None
    crashed = WorkerResult("crashed", returncode=137, output="")
    assert crashed.oom and crashed.error == "worker exited with status 137: "
    assert not WorkerResult("unreadable", returncode=0, problem="x").oom
