"""The run store: atomic results beside their specs; a killed run leaves no partial result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import RunNotFoundError, RunStore, run_many, stored
from dpcore.runs.example import CHECKPOINT, ExampleSpec, example_resumable_run, example_run
from dpcore.runs.store import RESULT, SPEC
from tests.runs.workloads import Spec, compute


def test_put_then_read_back_as_json(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    assert not store.has(Spec(1))
    with pytest.raises(RunNotFoundError):
        store.result(Spec(1))
    store.put(Spec(1), {"rows": ({"a": 1.5},), "n": 3})
    assert store.result(Spec(1)) == {"rows": [{"a": 1.5}], "n": 3}
    folder = store.folder(Spec(1))
    assert folder.parent == tmp_path and folder.name.endswith("-v1")
    assert sorted(p.name for p in folder.iterdir()) == [RESULT, SPEC]
    assert json.loads((folder / SPEC).read_text())["fields"]["index"] == 1
    assert not RunStore(tmp_path, code="v2").has(Spec(1))  # other code: never reused
    assert not store.has(Spec(2))


def test_a_result_that_is_not_json_raises_and_writes_nothing(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    for bad in ({"loss": float("nan")}, {"model": object()}, {1.5: "key"}, [{2: 1}], {"s": {1}}):
        with pytest.raises(InvalidParameterError) as raised:
            store.put(Spec(1), bad)
        assert raised.value.parameter == "result"
    assert not any(tmp_path.iterdir())


def test_damaged_or_foreign_result_files_are_never_returned(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    store.put(Spec(1), compute(Spec(1)))
    store.put(Spec(2), compute(Spec(2)))
    path = store.folder(Spec(1)) / RESULT
    path.write_bytes(path.read_bytes()[:-20])  # truncated outside the store
    assert not store.has(Spec(1))
    path.write_bytes((store.folder(Spec(2)) / RESULT).read_bytes())  # another spec's result
    assert not store.has(Spec(1))
    run = stored(compute, store)
    assert run(Spec(1)) == compute(Spec(1))  # recomputed and replaced
    assert store.result(Spec(1))["index"] == 1


def test_stored_computes_once_and_passes_its_folder(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    seen: list[Path] = []

    def execute(spec: ExampleSpec, folder: Path) -> int:
        seen.append(folder)
        return spec.seed

    run = stored(execute, store, with_folder=True)
    assert run(ExampleSpec(4)) == 4 and run(ExampleSpec(4)) == 4
    assert seen == [store.folder(ExampleSpec(4))]
    with pytest.raises(InvalidParameterError):
        stored(3, store)  # type: ignore[arg-type]


def test_checkpoints_live_in_the_run_folder(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    assert store.read_checkpoint(Spec(1)) is None
    path = store.write_checkpoint(Spec(1), b"state", name="weights.pt")
    assert path.parent == store.folder(Spec(1))
    assert store.read_checkpoint(Spec(1), name="weights.pt") == b"state"
    assert not store.has(Spec(1))  # a checkpoint is no result
    for name in ("", "..", "a/b", RESULT, SPEC, ".hidden"):
        with pytest.raises(InvalidParameterError):
            store.write_checkpoint(Spec(1), b"x", name=name)


STALLED_WRITER = """
import os, sys, time
from dpcore.runs import RunStore
from tests.runs.workloads import Spec
replace = os.replace
def stalled(source, target):
    if str(target).endswith("result.json"):
        open(sys.argv[2], "w").close()  # the temporary file is complete: kill me now
        time.sleep(60)
    replace(source, target)
os.replace = stalled
RunStore(sys.argv[1], code="v1").put(Spec(1), {"values": list(range(10000))})
"""


def _kill_when(child: subprocess.Popen[bytes], ready: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:  # type: ignore[operator]
        assert child.poll() is None, "the child finished before it could be killed"
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def test_a_writer_killed_mid_write_leaves_no_result(tmp_path: Path) -> None:
    root, signal_file = tmp_path / "store", tmp_path / "writing"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen(
        [sys.executable, "-c", STALLED_WRITER, str(root), str(signal_file)], env=env
    )
    _kill_when(child, signal_file.exists)
    store = RunStore(root, code="v1")
    folder = store.folder(Spec(1))
    names = sorted(p.name for p in folder.iterdir())
    assert names[0].endswith(".part") and names[1:] == [SPEC]  # the whole result, never renamed
    assert not store.has(Spec(1))
    with pytest.raises(RunNotFoundError):
        store.result(Spec(1))
    assert run_many(compute, [Spec(1)], store=store, progress=False) == [compute(Spec(1))]
    assert sorted(p.name for p in folder.iterdir()) == [RESULT, SPEC]  # stale temporary gone


RESUMABLE = """
import sys
from dpcore.runs import RunStore, run_many
from dpcore.runs.example import ExampleSpec, example_resumable_run
spec = ExampleSpec(seed=1, steps=300_000, chunk=10_000)
run_many(example_resumable_run, [spec], store=RunStore(sys.argv[1], code="v1"), with_folder=True,
         progress=False)
"""


def test_a_run_killed_mid_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = RunStore(root, code="v1")
    spec = ExampleSpec(seed=1, steps=300_000, chunk=10_000)
    checkpoint = store.folder(spec) / CHECKPOINT
    child = subprocess.Popen([sys.executable, "-c", RESUMABLE, str(root)])
    _kill_when(child, checkpoint.exists)
    assert not store.has(spec)
    done = json.loads(checkpoint.read_text())["done"]
    assert 0 < done < spec.steps
    resumed = run_many(example_resumable_run, [spec], store=store, with_folder=True, progress=False)
    assert resumed == [example_run(spec)]  # same as a run never interrupted


def test_the_example_run_really_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A checkpoint claiming every draw done with 0 inside: the run must take it as is."""
    spec = ExampleSpec(seed=1, steps=300, chunk=100)
    assert example_resumable_run(spec, tmp_path) == example_run(spec)
    saved = json.loads((tmp_path / CHECKPOINT).read_text())
    assert saved["done"] == 300
    (tmp_path / CHECKPOINT).write_text(json.dumps({**saved, "inside": 0}))
    assert example_resumable_run(spec, tmp_path)["inside"] == 0
