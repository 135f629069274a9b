"""``python -m reproductions --executor``: checked before anything runs, passed to the
reproductions whose compute takes it, and ``--workers N`` is ``--executor processes:N``."""

from __future__ import annotations

from typing import Any

import pytest

import reproductions.__main__ as entry


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    def fans_out(profile: str, *, executor: object = None, deadline: object = None) -> None:
        calls.append(("fans_out", {"profile": profile, "executor": executor}))

    def stays_here(profile: str) -> None:
        calls.append(("stays_here", {"profile": profile}))

    monkeypatch.setattr(
        entry,
        "REPRODUCTIONS",
        {"fans_out": (fans_out, lambda: None), "stays_here": (stays_here, lambda: None)},
    )
    return calls


def test_the_executor_reaches_the_reproductions_that_take_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _record(monkeypatch)
    assert entry.main(["--executor", "processes:2"]) == 0
    assert calls == [
        ("fans_out", {"profile": "quick", "executor": "processes:2"}),
        ("stays_here", {"profile": "quick"}),
    ]
    said = capsys.readouterr().out
    assert "stays_here: --executor not used" in said  # said, not silently ignored
    assert "fans_out: --executor not used" not in said
    calls.clear()
    assert entry.main(["--workers", "3", "--only", "fans_out"]) == 0
    assert calls == [("fans_out", {"profile": "quick", "executor": "processes:3"})]
    calls.clear()
    assert entry.main(["--only", "fans_out"]) == 0  # default: in process
    assert calls == [("fans_out", {"profile": "quick", "executor": None})]


@pytest.mark.parametrize(
    "argv",
    [
        ["--executor", "threads:2"],
        ["--executor", "processes:0"],
        ["--workers", "0"],
        ["--workers", "2", "--executor", "dask"],
    ],
)
def test_a_bad_executor_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    calls = _record(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        entry.main(argv)
    assert exit_info.value.code == 2 and calls == []
    assert "--executor" in capsys.readouterr().err or "--workers" in argv
