"""Run bundles: a store's finished results carried in one file and put back into another store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import Imported, RunStore, export_runs, import_runs, read_bundle, run_many
from tests.runs.workloads import Spec, compute


def _finished(tmp_path: Path, count: int, code: str = "v1") -> tuple[RunStore, list[Spec]]:
    store = RunStore(tmp_path / "first", code=code)
    specs = [Spec(index) for index in range(count)]
    run_many(compute, specs, store=store, progress=False)
    return store, specs


def test_export_then_import_resumes_every_run_in_a_fresh_store(tmp_path: Path) -> None:
    store, specs = _finished(tmp_path, 6)
    bundle = tmp_path / "runs.jsonl"
    assert export_runs(store, [*specs, Spec(99)], bundle) == 6  # unfinished specs left out
    fresh = RunStore(tmp_path / "second", code="v1")
    assert import_runs(fresh, specs, bundle) == Imported(6, 0, 0, 0)
    assert [fresh.result(spec) for spec in specs] == [store.result(spec) for spec in specs]
    # the fresh store now answers run_many without computing anything
    assert run_many(_never_called, specs, store=fresh, progress=False) == [
        store.result(spec) for spec in specs
    ]
    assert import_runs(fresh, specs, bundle) == Imported(0, 6, 0, 0)  # nothing twice


def _never_called(spec: Spec) -> object:
    raise AssertionError(f"{spec} was recomputed although its result was imported")


def test_the_same_results_give_the_same_bytes(tmp_path: Path) -> None:
    store, specs = _finished(tmp_path, 4)
    export_runs(store, specs, tmp_path / "a.jsonl")
    export_runs(store, list(reversed(specs)), tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert len(read_bundle(tmp_path / "a.jsonl")) == 4


def test_results_of_other_code_or_other_specs_are_never_reused(tmp_path: Path) -> None:
    store, specs = _finished(tmp_path, 3, code="old")
    bundle = tmp_path / "runs.jsonl"
    export_runs(store, specs, bundle)
    newer = RunStore(tmp_path / "second", code="new")
    assert import_runs(newer, specs, bundle) == Imported(0, 0, 3, 0)
    assert not any(newer.has(spec) for spec in specs)
    same = RunStore(tmp_path / "third", code="old")
    assert import_runs(same, [Spec(0)], bundle) == Imported(1, 0, 0, 2)
    assert same.has(Spec(0)) and not same.has(Spec(1))


def test_a_missing_bundle_imports_nothing(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="v1")
    assert import_runs(store, [Spec(0)], tmp_path / "absent.jsonl") == Imported(0, 0, 0, 0)


@pytest.mark.parametrize(
    "damage",
    [
        "not json\n",
        '{"code": "v1", "key": "k", "spec": {}}\n',  # a field missing
        "[1, 2]\n",
        "NaN\n",
    ],
)
def test_a_damaged_bundle_raises_before_anything_is_written(tmp_path: Path, damage: str) -> None:
    store, specs = _finished(tmp_path, 3)
    bundle = tmp_path / "runs.jsonl"
    export_runs(store, specs, bundle)
    bundle.write_text(bundle.read_text() + damage)
    fresh = RunStore(tmp_path / "second", code="v1")
    with pytest.raises(InvalidParameterError, match="line 4"):
        import_runs(fresh, specs, bundle)
    assert not any(fresh.has(spec) for spec in specs)


def test_a_non_finite_result_in_a_bundle_is_refused(tmp_path: Path) -> None:
    store, specs = _finished(tmp_path, 1)
    bundle = tmp_path / "runs.jsonl"
    export_runs(store, specs, bundle)
    entry = json.loads(bundle.read_text())
    text = json.dumps({**entry, "result": {"loss": float("inf")}})  # Python writes Infinity
    bundle.write_text(text + "\n")
    with pytest.raises(InvalidParameterError, match="line 1"):
        import_runs(RunStore(tmp_path / "second", code="v1"), specs, bundle)


def test_two_results_for_one_spec_raise(tmp_path: Path) -> None:
    store, specs = _finished(tmp_path, 1)
    bundle = tmp_path / "runs.jsonl"
    export_runs(store, specs, bundle)
    entry = json.loads(bundle.read_text())
    other = json.dumps({**entry, "result": "something else"})
    bundle.write_text(bundle.read_text() + other + "\n")
    fresh = RunStore(tmp_path / "second", code="v1")
    with pytest.raises(InvalidParameterError, match="one result per spec"):
        import_runs(fresh, specs, bundle)
    assert not fresh.has(specs[0])
