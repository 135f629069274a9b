"""parse_executor and open_executor: the --executor forms, typed errors, missing engines."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import (
    EngineMissingError,
    ExecutorChoice,
    RayExecutor,
    RunStore,
    SpawnPool,
    SubmititExecutor,
    open_executor,
    parse_executor,
    run_many,
)
from tests.runs.workloads import Spec, compute


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("local", ExecutorChoice("local")),
        ("processes:3", ExecutorChoice("processes", workers=3)),
        (" processes:12 ", ExecutorChoice("processes", workers=12)),
        ("dask", ExecutorChoice("dask")),
        ("dask:tcp://10.1.2.3:8786", ExecutorChoice("dask", address="tcp://10.1.2.3:8786")),
        ("ray", ExecutorChoice("ray")),
        ("ray:auto", ExecutorChoice("ray", address="auto")),
        ("ray:ray://head:10001", ExecutorChoice("ray", address="ray://head:10001")),
        ("slurm", ExecutorChoice("slurm")),
    ],
)
def test_executor_forms_parse(text: str, choice: ExecutorChoice) -> None:
    assert parse_executor(text) == choice


def test_processes_alone_means_one_per_cpu() -> None:
    choice = parse_executor("processes")
    assert choice.kind == "processes" and choice.workers is not None and choice.workers >= 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "threads",
        "processes:0",
        "processes:-2",
        "processes:two",
        "processes:1.5",
        "processes:",
        "processes:²",
        "dask:",
        "local:2",
        "slurm:gpu",
        "Local",
        None,
        3,
    ],
)
def test_bad_executor_values_raise_a_typed_error(text: Any) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        parse_executor(text)
    assert raised.value.parameter == "executor"
    assert "processes[:N]" in str(raised.value)


@pytest.mark.parametrize(
    ("executor", "module", "extra"),
    [("dask", "distributed", "dask"), ("ray", "ray", "ray"), ("slurm", "submitit", "slurm")],
)
def test_a_missing_engine_names_its_extra_before_anything_runs(
    executor: str, module: str, extra: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # any import of it now raises ImportError
    with pytest.raises(EngineMissingError) as raised, open_executor(executor):
        pass
    assert f'pip install "dpcore[{extra}]"' in str(raised.value)
    assert isinstance(raised.value, ImportError) and raised.value.extra == extra
    store = RunStore(tmp_path, code="t1")
    with pytest.raises(EngineMissingError):
        run_many(compute, [Spec(0)], store=store, executor=executor, progress=False)
    assert not any(tmp_path.iterdir())


def test_adapters_raise_the_same_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(EngineMissingError, match=r"dpcore\[ray\]"):
        RayExecutor()
    with pytest.raises(EngineMissingError, match=r"dpcore\[slurm\]"):
        SubmititExecutor()


def test_bad_options_raise_before_an_engine_starts() -> None:
    for executor in ("local", "processes:2"):
        with pytest.raises(InvalidParameterError) as raised, open_executor(executor, workers=3):
            pass
        assert raised.value.parameter == "options"
    with (
        pytest.raises(InvalidParameterError, match="address"),
        open_executor("dask:tcp://127.0.0.1:1", n_workers=2),
    ):
        pass
    for name, value in (("num_gpus", -0.5), ("num_cpus", float("nan")), ("num_gpus", True)):
        with pytest.raises(InvalidParameterError) as raised:
            RayExecutor(**{name: value})
        assert raised.value.parameter == name
    for workers in (0, True, 1.5):
        with pytest.raises(InvalidParameterError):
            SpawnPool(workers)  # type: ignore[arg-type]


def test_local_opens_nothing() -> None:
    with open_executor("local") as executor:
        assert executor is None
