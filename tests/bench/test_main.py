"""``python -m bench --executor``: checked before anything runs and passed to the benchmarks
that fan out; the others run as by default and say so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as entry


def _record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def fans_out(
        results: Path, *, quick: bool, device: str, executor: str | None = None
    ) -> list[dict[str, Any]]:
        calls.append(("fans_out", {"quick": quick, "executor": executor}))
        return []

    def one_at_a_time(results: Path, *, quick: bool, device: str) -> list[dict[str, Any]]:
        calls.append(("one_at_a_time", {"quick": quick}))
        return []

    monkeypatch.setattr(entry, "BENCHMARKS", {"fans_out": fans_out, "one": one_at_a_time})
    monkeypatch.setattr(entry, "OPTIONAL", {})
    monkeypatch.setattr(entry, "RESULTS", tmp_path)
    return calls


def test_the_executor_reaches_the_benchmarks_that_take_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _record(monkeypatch, tmp_path)
    assert entry.main(["--quick", "--executor", "dask"]) == 0
    assert calls == [
        ("fans_out", {"quick": True, "executor": "dask"}),
        ("one_at_a_time", {"quick": True}),
    ]
    assert "one: --executor not used" in capsys.readouterr().out
    calls.clear()
    assert entry.main(["fans_out"]) == 0
    assert calls == [("fans_out", {"quick": False, "executor": None})]


@pytest.mark.parametrize("value", ["threads:2", "processes:0", "dask:"])
def test_a_bad_executor_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    calls = _record(monkeypatch, tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        entry.main(["--executor", value])
    assert exit_info.value.code == 2 and calls == []
    assert "--executor: Expected executor one of" in capsys.readouterr().err
