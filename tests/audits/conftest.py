"""Every audit test keeps its run stores in its own temporary folder, never in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def audit_run_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``audits.results_io.RUNS`` (the audits' run stores) at ``tmp_path / "runs"``."""
    runs = tmp_path / "runs"
    monkeypatch.setattr("audits.results_io.RUNS", runs)
    return runs
