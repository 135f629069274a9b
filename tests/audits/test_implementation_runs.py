"""The implementation audits on the run layer: the same rows in this process, in spawned
processes and on a thread pool; one run store shared by the table, the false-alarm measurement
and the tightness record; implementations that cannot travel refused before anything runs."""

from __future__ import annotations

import dataclasses
import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from audits.__main__ import main as audits_main
from audits.implementations import false_alarms, seed_runs, tightness
from audits.implementations.plain_torch import PlainTorchDpSgd
from audits.implementations.tf_privacy import TfPrivacy
from dpcore.auditing import AuditSettings, audit_implementation
from dpcore.auditing.audit_settings import PER_STEP_SETTINGS
from dpcore.auditing.gaussian_scores import runs_for_mu_ratio
from dpcore.auditing.implementation_whitebox import whitebox_audit
from dpcore.auditing.stepwise import mu_ratio_for_epsilon_ratio
from dpcore.errors import InvalidParameterError

PER_STEP = AuditSettings(steps=20, runs=2, tiny_runs=1)
ONE_RUN = AuditSettings(target_epsilon=2.0, steps=20, sampler_steps=100)


def _plain(rows: list[dict[str, Any]]) -> str:
    """The rows as JSON, without the wall-clock field."""
    return json.dumps(
        [{k: v for k, v in r.items() if k != "seconds"} for r in rows], sort_keys=True
    )


def test_whitebox_rows_do_not_depend_on_the_executor() -> None:
    implementation = PlainTorchDpSgd()
    alone = whitebox_audit(implementation, PER_STEP, seed=3)
    spawned = whitebox_audit(implementation, PER_STEP, seed=3, executor="processes:2")
    with ThreadPoolExecutor(2) as pool:
        threaded = whitebox_audit(implementation, PER_STEP, seed=3, executor=pool)
    assert _plain(alone) == _plain(spawned) == _plain(threaded)
    assert _plain(alone) != _plain(whitebox_audit(implementation, PER_STEP, seed=4))


def test_audit_implementation_opens_a_named_executor_once_and_gives_the_same_report() -> None:
    implementation = PlainTorchDpSgd("halved noise")
    options: dict[str, Any] = {"per_step": PER_STEP, "one_run": ONE_RUN, "seeds": 2}
    alone = audit_implementation(implementation, **options)
    pooled = audit_implementation(implementation, executor="processes:2", **options)
    assert _plain(alone.seed_rows) == _plain(pooled.seed_rows)
    assert [r["verdict"] for r in alone] == [r["verdict"] for r in pooled]


class _Unpicklable:
    """An adapter holding a lambda: it cannot be sent to another process."""

    name = "unpicklable"

    def __init__(self) -> None:
        self.hook = lambda: None
        self.trained = 0

    def train(self, task: object, observer: object) -> object:  # pragma: no cover - never runs
        self.trained += 1
        raise AssertionError("must be refused before training")


def test_an_implementation_that_cannot_travel_is_refused_before_any_run() -> None:
    implementation = _Unpicklable()
    with pytest.raises(InvalidParameterError, match="implementation"):
        audit_implementation(implementation, executor="processes:2")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="implementation"):
        whitebox_audit(implementation, PER_STEP, executor="dask")  # type: ignore[arg-type]
    assert implementation.trained == 0


def test_tf_privacy_adapter_travels_without_its_worker() -> None:
    adapter = TfPrivacy()
    copy = pickle.loads(pickle.dumps(adapter))
    assert isinstance(copy, TfPrivacy) and copy._worker is None and copy._folder is None


def test_bad_executor_is_refused_naming_it() -> None:
    with pytest.raises(InvalidParameterError, match="executor"):
        audit_implementation(PlainTorchDpSgd(), executor="threads:2", per_step=PER_STEP)


def test_seed_runs_are_stored_and_not_run_again(monkeypatch: pytest.MonkeyPatch) -> None:
    name = PlainTorchDpSgd().name
    specs = [seed_runs.SeedRun(name, seed, PER_STEP, ONE_RUN) for seed in (0, 1)]
    first = seed_runs.run_seeds(specs, progress=False)
    calls: list[seed_runs.SeedRun] = []
    original = seed_runs.execute

    def counted(spec: seed_runs.SeedRun) -> list[dict[str, Any]]:
        calls.append(spec)
        return original(spec)

    monkeypatch.setattr(seed_runs, "execute", counted)
    again = seed_runs.run_seeds([*specs, dataclasses.replace(specs[0], seed=2)], progress=False)
    assert again[:2] == first and calls == [dataclasses.replace(specs[0], seed=2)]
    assert {row["seed"] for row in again[2]} == {2}


def test_every_registered_implementation_is_rebuilt_by_its_name() -> None:
    for name, make in seed_runs.registry().items():
        assert make().name == name


def test_false_alarm_runs_are_the_default_call_on_the_tables_seeds() -> None:
    specs = false_alarms.plan(10)
    assert len(specs) == 10
    names = [spec.implementation for spec in specs]
    assert names.count(PlainTorchDpSgd().name) == 6
    for name in set(names):
        assert sorted(s.seed for s in specs if s.implementation == name) == list(
            range(names.count(name))
        )
    assert all(s.per_step == PER_STEP_SETTINGS for s in specs)


def test_a_default_call_is_flagged_by_holm_over_its_own_audits() -> None:
    spec = seed_runs.SeedRun("x", 0)
    rows = [
        {
            "implementation": "x",
            "audit": audit,
            "p_value": p,
            "epsilon_lower": None,
            "certified_epsilon": 4.0,
            "verdict": "consistent",
            "seed": 0,
        }
        for audit, p in (("noise_calibration", 0.004), ("empty_lots", 0.04))
    ]
    record = false_alarms.record(spec, rows)
    # Holm at 0.05 over two audits: 0.004 < 0.025 is flagged, then 0.04 < 0.05 is too
    assert record["flagged"] == ["noise_calibration", "empty_lots"]
    rows[0]["p_value"] = 0.03  # 0.03 > 0.025: nothing is flagged although both are < 0.05
    assert false_alarms.record(spec, rows)["flagged"] == []


def test_tightness_reads_the_tables_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tightness, "PER_STEP_SETTINGS", PER_STEP)
    monkeypatch.setattr(tightness, "ONE_RUN_SETTINGS", ONE_RUN)
    monkeypatch.setattr(tightness, "OUTPUT", tmp_path / "tightness.json")
    record = tightness.run(seeds=2, runs=PER_STEP.runs)
    assert [row["seed"] for row in record["rows"]] == [0, 1]
    assert json.loads((tmp_path / "tightness.json").read_text())["seeds"] == 2
    stored = seed_runs.run_seeds(
        [seed_runs.SeedRun(PlainTorchDpSgd().name, 0, PER_STEP, ONE_RUN)], progress=False
    )[0]
    one_run = next(row for row in stored if row["audit"] == "one_run")
    assert record["rows"][0]["one_run_fdp"]["epsilon_lower"] == one_run["epsilon_lower_fdp"]


def test_default_per_step_runs_are_those_the_epsilon_goal_needs() -> None:
    settings = PER_STEP_SETTINGS
    mu = 1 / settings.noise_multiplier
    ratio = mu_ratio_for_epsilon_ratio(
        q=settings.sampling_probability,
        mu=mu,
        steps=settings.steps,
        delta=settings.delta,
        target_ratio=0.82,
    )
    assert settings.runs == runs_for_mu_ratio(
        target_ratio=ratio,
        mu=mu,
        negatives_per_run=settings.steps,
        positives_per_run=settings.sampling_probability * settings.steps,
        confidence=settings.confidence,
    )


def test_the_command_line_refuses_a_bad_executor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        audits_main(["--only", "implementations", "--executor", "threads"])
    assert "--executor" in capsys.readouterr().err


def test_the_false_alarm_module_it_writes_does_not_invalidate_the_store() -> None:
    from audits.results_io import ROOT

    sources = {path.relative_to(ROOT).as_posix() for path in seed_runs._sources()}
    assert "dpcore/auditing/false_alarms.py" not in sources
    assert {
        "dpcore/auditing/implementation_whitebox.py",
        "audits/implementations/plain_torch.py",
        "audits/implementations/false_alarms.py",
        "dpcore/torch/private.py",
    } <= sources
