"""The audits fan out through dpcore.runs: every executor gives the same rows, and a second
call with the same store (or a call after a failed one) runs only what is missing."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from audits import (
    clt_check,
    dpsgd_jl,
    dpsgd_positions,
    dpsgd_whitebox,
    mechanisms,
    membership,
    one_run,
    planted_bugs,
    sampler_audit,
)
from dpcore.errors import InvalidParameterError
from dpcore.runs import RunsFailedError, check_spec

#: tiny settings of seven audits (four train with torch): (module, config)
TINY: dict[str, tuple[ModuleType, Any]] = {
    "mechanisms": (
        mechanisms,
        mechanisms.MechanismAuditConfig(epsilons=(1.0, 4.0), samples=5_000, seeds=(0, 1)),
    ),
    "clt_check": (clt_check, clt_check.CltCheckConfig(runs=5_000, seeds=(0, 1, 2))),
    "sampler_audit": (sampler_audit, sampler_audit.SamplerAuditConfig(epochs=20, seeds=(0, 1))),
    "dpsgd_whitebox": (
        dpsgd_whitebox,
        dpsgd_whitebox.WhiteboxConfig(epsilons=(4.0,), steps=60, runs=1, seeds=(0, 1, 2)),
    ),
    "dpsgd_positions": (dpsgd_positions, dpsgd_positions.PositionsConfig(steps=20, runs=1)),
    "membership": (
        membership,
        membership.MembershipConfig(
            dataset="generated",
            base_size=100,
            canaries=100,
            guesses_each_side=10,
            shadows=2,
            nonprivate_epochs=20,
            dp_steps=20,
            epsilons=(1.0,),
        ),
    ),
    "one_run": (
        one_run,
        one_run.OneRunConfig(
            canaries=200, guesses_each_side=20, steps=30, simulations=20, seeds=(0, 1)
        ),
    ),
}


def _without_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their wall-clock seconds (the only field that depends on the machine)."""
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def _isolated(
    monkeypatch: pytest.MonkeyPatch, folder: Path, name: str
) -> Callable[..., list[dict[str, Any]]]:
    """The ``run`` of the audit ``name`` on its tiny setting, saving under ``folder``.

    Its rows go to ``folder``, its run store to ``folder / "runs"``.
    """
    monkeypatch.setattr("audits.results_io.RESULTS", folder)
    monkeypatch.setattr("audits.results_io.RUNS", folder / "runs")
    module, config = TINY[name]
    return lambda **kwargs: module.run(config, **kwargs)


@pytest.mark.parametrize("name", sorted(TINY))
def test_every_executor_gives_the_same_rows(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process = _isolated(monkeypatch, tmp_path / "local", name)(executor=None)
    spawned = _isolated(monkeypatch, tmp_path / "spawned", name)(executor="processes:2")
    with ThreadPoolExecutor(2) as pool:
        threaded = _isolated(monkeypatch, tmp_path / "threads", name)(executor=pool)
    assert len(in_process) >= 2
    assert _without_timing(spawned) == _without_timing(in_process)
    assert _without_timing(threaded) == _without_timing(in_process)
    # The spawned workers wrote the store in their own processes.
    assert any((tmp_path / "spawned" / "runs" / name).rglob("*.json"))


def test_a_second_call_runs_nothing_and_a_failed_call_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _isolated(monkeypatch, tmp_path / "resume", "mechanisms")
    units = mechanisms.specs(TINY["mechanisms"][1])
    broken = units[2]
    calls: list[mechanisms.MechanismRun] = []
    real = mechanisms.execute

    def failing(spec: mechanisms.MechanismRun) -> dict[str, Any]:
        calls.append(spec)
        if spec == broken:
            raise RuntimeError("killed")
        return real(spec)

    monkeypatch.setattr(mechanisms, "execute", failing)
    with pytest.raises(RunsFailedError):
        run(executor=None)
    assert calls.count(broken) == 2  # tried, retried once, reported
    assert len(calls) == len(units) + 1

    def counting(spec: mechanisms.MechanismRun) -> dict[str, Any]:
        calls.append(spec)
        return real(spec)

    calls.clear()
    monkeypatch.setattr(mechanisms, "execute", counting)
    resumed = run(executor=None)
    assert calls == [broken]  # only the unit that failed is computed again
    calls.clear()
    again = run(executor=None)
    assert calls == []
    assert again == resumed  # from the store, seconds included
    fresh = _isolated(monkeypatch, tmp_path / "fresh", "mechanisms")(executor=None)
    assert _without_timing(fresh) == _without_timing(resumed)


def test_a_changed_setting_recomputes_only_the_new_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("audits.results_io.RESULTS", tmp_path)
    calls: list[clt_check.CltRun] = []
    real = clt_check.execute

    def counting(spec: clt_check.CltRun) -> dict[str, Any]:
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(clt_check, "execute", counting)
    config = clt_check.CltCheckConfig(runs=5_000, seeds=(0, 1))
    first = clt_check.run(config)
    more = clt_check.run(dataclasses.replace(config, seeds=(0, 1, 2)))
    assert [spec.seed for spec in calls] == [0, 1, 2]
    assert more[:2] == first
    fewer_runs = clt_check.run(dataclasses.replace(config, runs=4_000))
    assert [spec.seed for spec in calls] == [0, 1, 2, 0, 1]
    assert [row["setting"]["runs"] for row in fewer_runs] == [4_000, 4_000]


#: the positions audit's run seeds by world at seed 0, 3 runs: 1000 seed + 2 r (+ 1 when in)
POSITION_SEEDS = ((False, (0, 2, 4)), (True, (1, 3, 5)))


def test_units_are_valid_specs_in_the_order_of_the_rows() -> None:
    """Every audit's units are frozen dataclasses of JSON values, in the order of the rows."""
    cases: list[tuple[list[Any], list[tuple[Any, ...]]]] = [
        (
            mechanisms.specs(TINY["mechanisms"][1]),
            [(k, e, s) for k in ("gaussian", "laplace") for e in (1.0, 4.0) for s in (0, 1)],
        ),
        (
            one_run.specs(one_run.OneRunConfig(seeds=(3, 4))),
            [
                ("dpcore (correct)", 3),
                ("dpcore (correct)", 4),
                ("halved noise", 3),
                ("no clipping", 3),
            ],
        ),
        (
            [m for ms in membership.specs(membership.MembershipConfig(shadows=2)) for m in ms],
            [(e, k) for e in (None, 1.0, 8.0) for k in (None, 0, 1)],
        ),
        (
            [u for us in dpsgd_jl.specs(dpsgd_jl.JlAuditConfig()).values() for u in us],
            [
                (r, *unit)
                for r in (1, 4, 16)
                for unit in [("bound",), (None, 0), (1.0, 1), (2.0, 2), (1e6, 3)]
            ],
        ),
        (
            [
                unit
                for runs in dpsgd_positions.specs(dpsgd_positions.PositionsConfig(), 1.0).values()
                for unit in runs
            ],
            [(e, i, s) for e in dpsgd_positions.ENGINES for i, ss in POSITION_SEEDS for s in ss],
        ),
    ]
    keys: dict[type, Callable[[Any], tuple[Any, ...]]] = {
        mechanisms.MechanismRun: lambda s: (s.mechanism, s.epsilon, s.seed),
        one_run.OneRunUnit: lambda s: (s.implementation, s.config.seed),
        membership.MembershipTraining: lambda s: (s.epsilon, s.shadow),
        dpsgd_jl.JlBound: lambda s: (s.jl_dimension, "bound"),
        dpsgd_jl.JlTraining: lambda s: (s.jl_dimension, s.canary_norm, s.seed),
        dpsgd_positions.PositionsRun: lambda s: (s.engine, s.insert, s.seed),
    }
    for units, expected in cases:
        for unit in units:
            check_spec(unit)
        assert [keys[type(unit)](unit) for unit in units] == expected


@pytest.mark.parametrize("audit", ["dpsgd_whitebox", "planted_bugs"])
def test_white_box_audits_store_each_training_run(
    audit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stored run per world, run and row; a new seed trains only its own runs."""
    monkeypatch.setattr("audits.results_io.RESULTS", tmp_path)
    module: Any = {"dpsgd_whitebox": dpsgd_whitebox, "planted_bugs": planted_bugs}[audit]
    setting = dpsgd_whitebox.WhiteboxConfig(
        dataset_size=20, sampling_probability=0.2, steps=30, runs=2, epsilons=(4.0,), seeds=(0,)
    )
    config: Any = (
        setting if audit == "dpsgd_whitebox" else planted_bugs.PlantedBugsConfig(audit=setting)
    )
    implementations = 1 if audit == "dpsgd_whitebox" else len(planted_bugs.IMPLEMENTATIONS)
    calls: list[dpsgd_whitebox.TrainingRun] = []
    real = module.execute

    def counting(spec: dpsgd_whitebox.TrainingRun) -> dict[str, Any]:
        calls.append(spec)
        return dict(real(spec))

    monkeypatch.setattr(module, "execute", counting)
    first = module.run(config)
    assert len(calls) == implementations * 2 * setting.runs
    assert sorted({spec.seed for spec in calls}) == [0, 1, 2, 3]
    calls.clear()
    more = module.run(dataclasses.replace(config, seeds=(0, 1)))
    assert sorted({spec.seed for spec in calls}) == [1000, 1001, 1002, 1003]
    assert len(calls) == implementations * 2 * setting.runs
    assert _without_timing([row for row in more if row["seed"] == 0]) == _without_timing(first)
    assert {row["steps_observed_per_world"] for row in more} == {2 * setting.steps}


def test_unknown_units_are_refused() -> None:
    spec = mechanisms.specs(TINY["mechanisms"][1])[0]
    with pytest.raises(InvalidParameterError):
        mechanisms.execute(dataclasses.replace(spec, mechanism="cauchy"))
    with pytest.raises(InvalidParameterError):
        sampler_audit.execute(
            dataclasses.replace(sampler_audit.specs(TINY["sampler_audit"][1])[0], sampler="x")
        )
    with pytest.raises(InvalidParameterError):
        dpsgd_positions.execute(
            dpsgd_positions.PositionsRun(
                engine="x",
                insert=False,
                seed=0,
                sigma=1.0,
                config=dpsgd_positions.PositionsConfig(),
            )
        )
    training = dpsgd_whitebox.TrainingRun("x", 1.0, False, 0, dpsgd_whitebox.WhiteboxConfig())
    for execute in (dpsgd_whitebox.execute, planted_bugs.execute):
        with pytest.raises(InvalidParameterError):
            execute(training)
    with pytest.raises(InvalidParameterError):
        dpsgd_jl.execute(training)  # type: ignore[arg-type]


def test_single_thread_restores_the_setting_after_overlapping_blocks() -> None:
    """Blocks of two threads overlap (A enters, B enters, A leaves, B leaves)."""
    before = torch.get_num_threads()
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    seen: list[int] = []

    def a() -> None:
        with dpsgd_whitebox.single_thread():
            a_inside.set()
            b_inside.wait()
        a_left.set()

    def b() -> None:
        a_inside.wait()
        with dpsgd_whitebox.single_thread():
            b_inside.set()
            a_left.wait()
            seen.append(torch.get_num_threads())

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [1]  # still one thread after the first block left
    assert torch.get_num_threads() == before
