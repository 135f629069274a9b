"""The committed tables of the black-box audits are the ones their writers make from the
committed results (no table edited by hand or left behind by a changed writer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from audits import results_io
from audits.blackbox import crafted_audit, one_run_report, report

WRITERS = {
    "blackbox": report,
    "blackbox_crafted": crafted_audit,
    "blackbox_one_run": one_run_report,
}


@pytest.mark.parametrize("profile", ["", "_quick"])
@pytest.mark.parametrize("audit", sorted(WRITERS))
def test_the_committed_table_is_the_writers_output(
    monkeypatch: pytest.MonkeyPatch, audit: str, profile: str
) -> None:
    module, stem = WRITERS[audit], audit + profile
    written: dict[Path, str] = {}

    def capture(path: Path, text: str, **_: Any) -> None:
        written[Path(path)] = text

    monkeypatch.setattr(module, "atomic_write_text", capture)
    module.write_report(stem)
    markdown = results_io.RESULTS / f"{stem}.md"
    assert written[markdown] == markdown.read_text(encoding="utf-8")


def test_provenance_line_names_the_run() -> None:
    meta = {
        "commit": "abc",
        "created": "today",
        "config": {"profile": "full", "torch": "2.13", "hardware": {"cpu": "X", "cpus": 2}},
    }
    assert results_io.provenance_line(meta, "executor local") == (
        "Profile `full`, commit `abc`, X (2 CPUs), torch 2.13, executor local, created today."
    )
