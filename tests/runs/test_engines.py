"""Ray and submitit (its local executor) through run_many: run by ``nox -s engines`` only."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from dpcore.runs import RayExecutor, RunStore, SubmititExecutor, open_executor, run_many
from dpcore.runs.executors import _Requeueable
from tests.runs.workloads import Spec, compute, gpu_ids

pytestmark = pytest.mark.engines

SPECS = [Spec(index) for index in range(12)]


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def workers_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers started by the engines find ``tests.runs.workloads`` (the repository root)."""
    monkeypatch.setenv("PYTHONPATH", os.getcwd())


def test_ray_writes_the_same_result_files(tmp_path: Path, workers_import_tests: None) -> None:
    expected = run_many(
        compute, SPECS, store=RunStore(tmp_path / "local", code="t1"), progress=False
    )
    ray_store = RunStore(tmp_path / "ray", code="t1")
    with open_executor("ray", num_cpus=1, include_dashboard=False) as executor:
        assert isinstance(executor, RayExecutor)
        values = run_many(compute, SPECS, store=ray_store, executor=executor, progress=False)
    assert values == expected
    assert files(tmp_path / "ray") == files(tmp_path / "local")


def test_ray_runs_share_a_gpu_by_fractions(workers_import_tests: None) -> None:
    """num_gpus=0.5: two runs per GPU; Ray is told this machine has one (CPU-only CI)."""
    import ray

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)
    try:
        shared = RayExecutor(num_cpus=0.5, num_gpus=0.5)
        values = run_many(gpu_ids, SPECS[:4], executor=shared, progress=False)
        shared.shutdown()  # Ray was started here, not by the adapter: left running
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    assert values == [["0"]] * 4


def test_submitit_local_writes_the_same_result_files(
    tmp_path: Path, workers_import_tests: None
) -> None:
    specs = SPECS[:6]
    expected = run_many(
        compute, specs, store=RunStore(tmp_path / "local", code="t1"), progress=False
    )
    store = RunStore(tmp_path / "slurm", code="t1")
    with open_executor(
        "slurm", folder=tmp_path / "jobs" / "%j", cluster="local", timeout_min=5
    ) as executor:
        assert isinstance(executor, SubmititExecutor)
        values = run_many(compute, specs, store=store, executor=executor, progress=False)
    assert values == expected
    assert files(tmp_path / "slurm") == files(tmp_path / "local")


def test_submitit_requeues_the_same_call() -> None:
    """A preempted or timed-out job is resubmitted as is: the run resumes from the store."""
    import submitit

    wrapped = _Requeueable(compute)
    delayed = wrapped.checkpoint(Spec(3))
    assert isinstance(delayed, submitit.helpers.DelayedSubmission)
    assert delayed.function is wrapped and delayed.args == (Spec(3),)
    again = pickle.loads(pickle.dumps(delayed))
    assert again.result() == compute(Spec(3))
