"""run_many: the same result files whatever runs them; retries; nothing lost or duplicated."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpcore.atomic import temporary_prefix
from dpcore.errors import InvalidParameterError
from dpcore.runs import RunsFailedError, RunStore, run_many, spec_key
from dpcore.runs.store import RESULT, SPEC
from tests.runs.workloads import CALLS, Spec, calls, compute, die_if_odd, fail_always

SPECS = [Spec(index) for index in range(12)]
DEAD_PID = 2**22 + 1  # above Linux's largest pid: never a live process


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "calls"
    folder.mkdir()
    monkeypatch.setenv(CALLS, str(folder))
    return folder


class FlakyExecutor:
    """Runs calls at once, here; the first call of every third spec fails in one of three ways.

    ``index % 9 == 0``: the run raises before doing anything. ``3``: its worker is "killed"
    mid-write, leaving a dead writer's temporary result file and no result. ``6``: its worker
    is "killed" just after the result was stored, so the future fails although the run is done.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.submitted: list[Spec] = []

    def submit(self, fn: Callable[[Spec], Any], spec: Spec) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        first = spec not in self.submitted
        self.submitted.append(spec)
        mode = spec.index % 9
        if first and mode == 0:
            future.set_exception(OSError("injected failure"))
        elif first and mode == 3:
            target = self.store.folder(spec) / RESULT
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / (temporary_prefix(target, DEAD_PID) + "x.part")).write_text('{"res')
            future.set_exception(concurrent.futures.process.BrokenProcessPool("worker killed"))
        else:
            value = fn(spec)
            if first and mode == 6:
                future.set_exception(concurrent.futures.process.BrokenProcessPool("killed"))
            else:
                future.set_result(value)
        return future


def test_every_executor_writes_the_same_result_files(tmp_path: Path, call_log: Path) -> None:
    """In process, spawn pool, Dask LocalCluster, flaky retrying executor: identical files."""
    from distributed import Client, LocalCluster

    stores = {
        name: RunStore(tmp_path / name, code="t1")
        for name in ("local", "processes", "dask", "flaky")
    }
    expected = [compute(spec) for spec in SPECS]
    for path in call_log.iterdir():
        path.unlink()
    returned = {
        "local": run_many(compute, SPECS, store=stores["local"], progress=False),
        "processes": run_many(
            compute, SPECS, store=stores["processes"], executor="processes:2", progress=False
        ),
    }
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        returned["dask"] = run_many(
            compute,
            SPECS,
            store=stores["dask"],
            executor=client.get_executor(pure=False),
            progress=False,
        )
    flaky = FlakyExecutor(stores["flaky"])
    returned["flaky"] = run_many(
        compute, SPECS, store=stores["flaky"], executor=flaky, retries=1, progress=False
    )
    for name, values in returned.items():
        assert values == expected, name
    reference = files(tmp_path / "local")
    assert len(reference) == 2 * len(SPECS)  # one spec.json and one result.json per run
    for name in ("processes", "dask", "flaky"):
        assert files(tmp_path / name) == reference, name  # no temporary left, nothing extra
    # each spec computed exactly once per executor: 4 executors, 12 specs
    assert calls(call_log) == {spec_key(spec): 4 for spec in SPECS}
    # 0 and 9 raised, 3 was killed mid-write: resubmitted; 6 was killed after storing its
    # result: finished, from the disk, not resubmitted
    retried = [spec.index for spec in SPECS if flaky.submitted.count(spec) == 2]
    assert retried == [0, 3, 9]
    assert len(flaky.submitted) == len(SPECS) + 3


# A local Dask cluster serves its status page on port 8787, or another port with a warning when
# 8787 is taken (by another test run on this machine, say).
@pytest.mark.filterwarnings("ignore:Port 8787 is already in use")
def test_dask_by_name_starts_and_closes_a_local_cluster(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="t1")
    specs = SPECS[:3]
    values = run_many(compute, specs, store=store, executor="dask", progress=False)
    assert values == [compute(spec) for spec in specs]
    assert all(store.has(spec) for spec in specs)


def test_results_come_in_order_and_a_repeated_spec_runs_once(
    tmp_path: Path, call_log: Path
) -> None:
    store = RunStore(tmp_path, code="t1")
    specs = [SPECS[2], SPECS[0], SPECS[2], SPECS[1]]
    values = run_many(compute, specs, store=store, progress=False)
    assert [value["index"] for value in values] == [2, 0, 2, 1]
    assert sorted(calls(call_log).values()) == [1, 1, 1]


def test_stored_specs_are_not_submitted_again(tmp_path: Path, call_log: Path) -> None:
    store = RunStore(tmp_path, code="t1")
    run_many(compute, SPECS[:5], store=store, progress=False)
    flaky = FlakyExecutor(store)
    values = run_many(compute, SPECS, store=store, executor=flaky, retries=1, progress=False)
    assert {spec.index for spec in flaky.submitted} == set(range(5, 12))
    assert calls(call_log) == {spec_key(spec): 1 for spec in SPECS}
    assert values == [compute(spec) for spec in SPECS]


def test_runs_failing_after_their_retries_are_reported_after_the_others_finish(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path, code="t1")
    specs = SPECS[:6]
    with pytest.raises(RunsFailedError) as raised:
        run_many(fail_always, specs, store=store, retries=2, progress=False)
    assert [spec for spec, _ in raised.value.failures] == [specs[1], specs[3], specs[5]]
    assert all(isinstance(error, ArithmeticError) for _, error in raised.value.failures)
    assert raised.value.attempts == 3
    assert "run 5 cannot be computed" in str(raised.value)
    assert [store.has(spec) for spec in specs] == [True, False] * 3
    with pytest.raises(RunsFailedError) as through_pool:
        run_many(fail_always, specs, store=store, executor=FlakyExecutor(store), progress=False)
    assert [spec for spec, _ in through_pool.value.failures] == [specs[1], specs[3], specs[5]]


def test_a_spawned_worker_killed_mid_run_is_replaced_and_its_run_redone(
    tmp_path: Path, call_log: Path
) -> None:
    """The first run of spec 1 SIGKILLs its worker: the pool is renewed and the run redone."""
    store = RunStore(tmp_path / "store", code="t1")
    specs = [Spec(0), Spec(1, kill_once=True), Spec(2), Spec(3)]
    values = run_many(
        compute, specs, store=store, executor="processes:2", retries=2, progress=False
    )
    assert [value["index"] for value in values] == [0, 1, 2, 3]
    assert (call_log / f"killed-{spec_key(specs[1])}").exists()
    assert all(store.has(spec) for spec in specs)
    assert not [p for p in (tmp_path / "store").rglob("*") if p.name.endswith(".part")]


def test_a_run_whose_worker_always_dies_is_reported_after_its_retries(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="t1")
    with pytest.raises(RunsFailedError) as raised:
        run_many(
            die_if_odd, [Spec(0), Spec(1)], store=store, executor="processes:1", progress=False
        )
    [(spec, error)] = raised.value.failures
    assert spec == Spec(1) and raised.value.attempts == 2
    assert isinstance(error, concurrent.futures.process.BrokenProcessPool)
    assert store.has(Spec(0)) and not store.has(Spec(1))


RESUMABLE_PROGRAM = """
import sys
from dpcore.runs import RunStore, run_many
from tests.runs.workloads import Spec, compute
specs = [Spec(index, seconds=0.08) for index in range(12)]
run_many(compute, specs, store=RunStore(sys.argv[1], code="t1"), progress=False)
"""


def test_resume_after_a_kill_skips_finished_specs(tmp_path: Path, call_log: Path) -> None:
    root = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", RESUMABLE_PROGRAM, str(root)], env=env)
    store = RunStore(root, code="t1")
    specs = [Spec(index, seconds=0.08) for index in range(12)]
    deadline = time.monotonic() + 60
    while sum(store.has(spec) for spec in specs) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    finished = {spec for spec in specs if store.has(spec)}
    assert 4 <= len(finished) < 12
    started_before = calls(call_log)
    run_many(compute, specs, store=store, progress=False)
    started_after = calls(call_log)
    again = {key: count - started_before.get(key, 0) for key, count in started_after.items()}
    assert {key for key, count in again.items() if count} == {
        spec_key(spec) for spec in specs if spec not in finished
    }
    assert all(store.has(spec) for spec in specs)


def test_progress_bar_counts_finished_specs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore(tmp_path, code="t1")
    run_many(compute, SPECS[:2], store=store, progress=False)
    run_many(compute, SPECS[:5], store=store, progress=True)
    bar = capsys.readouterr().err
    assert "2/5" in bar and "5/5" in bar


def test_invalid_arguments_raise_before_anything_runs(tmp_path: Path, call_log: Path) -> None:
    store = RunStore(tmp_path, code="t1")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"retries": -1}, "retries"),
        ({"retries": True}, "retries"),
        ({"poll_seconds": 0}, "poll_seconds"),
        ({"executor": "threads"}, "executor"),
        ({"executor": "processes:0"}, "executor"),
        ({"executor": object()}, "executor"),
    ]
    for options, parameter in bad:
        with pytest.raises(InvalidParameterError) as raised:
            run_many(compute, SPECS, store=store, progress=False, **options)
        assert raised.value.parameter == parameter
    with pytest.raises(InvalidParameterError, match="with_folder"):
        run_many(compute, SPECS, with_folder=True, progress=False)
    with pytest.raises(InvalidParameterError, match="frozen dataclass"):
        run_many(compute, [*SPECS, {"index": 1}], store=store, progress=False)
    with pytest.raises(InvalidParameterError, match="hashable"):
        run_many(len, [[1, 2]], progress=False)
    assert not list(call_log.iterdir())
    assert not tmp_path.joinpath("t1").exists() and not any(tmp_path.glob("*-t1"))


def test_without_a_store_nothing_is_written_and_values_come_back(tmp_path: Path) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        values = run_many(abs, [-3, 2, -3], executor=pool, progress=False)
    assert values == [3, 2, 3]
    with pytest.raises(RunsFailedError) as raised:
        run_many(fail_always, [Spec(1), Spec(2)], retries=0, progress=False)
    assert [spec for spec, _ in raised.value.failures] == [Spec(1)]
    assert not [p for p in tmp_path.iterdir() if p.name != SPEC]


class _Pending:
    """A future without ``concurrent.futures`` waiting: done after ``polls`` calls of done()."""

    def __init__(self, value: Any, polls: int) -> None:
        self.value, self.polls = value, polls

    def done(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def result(self) -> Any:
        assert self.polls < 0, "result() before done()"
        return self.value


class BatchExecutor:
    """Takes a whole batch at once (as a Slurm job array) and hands back pollable futures."""

    max_in_flight = 5

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def submit(self, fn: Callable[[Spec], Any], spec: Spec) -> _Pending:
        self.batches.append([spec.index])
        return _Pending(fn(spec), polls=spec.index % 3)

    def submit_many(self, fn: Callable[[Spec], Any], specs: list[Spec]) -> list[_Pending]:
        self.batches.append([spec.index for spec in specs])
        return [_Pending(fn(spec), polls=spec.index % 3) for spec in specs]


class _Blocking:
    """A future with ``result()`` only."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class BlockingExecutor:
    def submit(self, fn: Callable[[Spec], Any], spec: Spec) -> _Blocking:
        return _Blocking(fn(spec))


def test_batches_polled_futures_and_result_only_futures(tmp_path: Path) -> None:
    batch = BatchExecutor()
    store = RunStore(tmp_path / "batch", code="t1")
    values = run_many(
        compute, SPECS, store=store, executor=batch, progress=False, poll_seconds=0.001
    )
    assert values == [compute(spec) for spec in SPECS]
    assert sorted(index for indices in batch.batches for index in indices) == list(range(12))
    assert batch.batches[0] == [0, 1, 2, 3, 4]  # at most max_in_flight handed over at once
    assert all(len(indices) <= 5 for indices in batch.batches)
    store = RunStore(tmp_path / "blocking", code="t1")
    assert run_many(compute, SPECS, store=store, executor=BlockingExecutor(), progress=False) == [
        compute(spec) for spec in SPECS
    ]
    assert files(tmp_path / "batch") == files(tmp_path / "blocking")


def test_a_result_kept_only_on_a_remote_disk_is_stored_here(tmp_path: Path) -> None:
    """A worker that cannot see the store returns the value: the store keeps it on arrival."""
    store = RunStore(tmp_path / "here", code="t1")
    remote = RunStore(tmp_path / "there", code="t1")

    class Remote:
        def submit(self, fn: Any, spec: Spec) -> concurrent.futures.Future[Any]:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_result(type(fn)(fn.execute, remote)(spec))
            return future

    values = run_many(compute, SPECS[:3], store=store, executor=Remote(), progress=False)
    assert values == [compute(spec) for spec in SPECS[:3]]
    assert files(tmp_path / "here") == files(tmp_path / "there")
