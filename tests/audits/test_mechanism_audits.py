"""The mechanism audit on fewer samples: sound (never above the claimed epsilon) and tight."""

from __future__ import annotations

import json

import pytest

from audits import mechanisms, report
from audits.results_io import RESULTS


@pytest.fixture()
def small_run(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr("audits.results_io.RESULTS", tmp_path)
    monkeypatch.setattr("audits.report.RESULTS", tmp_path)
    config = mechanisms.MechanismAuditConfig(epsilons=(1.0, 4.0), samples=200_000, seeds=(0, 1))
    return mechanisms.run(config), tmp_path


def test_lower_bounds_stay_below_the_claim_and_come_close(small_run) -> None:  # type: ignore[no-untyped-def]
    rows, _ = small_run
    assert len(rows) == 2 * 2 * 2
    exceed = 0
    for row in rows:
        target = row["setting"]["target_epsilon"]
        assert row["confidence"] == 0.95
        # Compared with the PLD upper bound at delta = 1e-5 (for Laplace slightly below the
        # pure epsilon), the true epsilon of the release at that delta.
        exceed += row["epsilon_lower"] > row["epsilon_upper"]["pld"]
        assert row["epsilon_lower"] >= 0.8 * target  # a useful audit, even at 2e5 samples
    # Sound: each bound may exceed the (correct) claim w.p. 5%; 6 or more of 8 would happen with
    # probability < 1e-5 (the stated false-rejection rate of this test).
    assert exceed <= 5


def test_report_is_drawn_from_saved_results(small_run) -> None:  # type: ignore[no-untyped-def]
    _, directory = small_run
    saved = json.loads((directory / "mechanisms.json").read_text())
    assert {
        "audit",
        "setting",
        "epsilon_lower",
        "confidence",
        "epsilon_upper",
        "seed",
        "seconds",
    } <= set(saved[0])
    report.write("mechanisms")
    table = (directory / "mechanisms.md").read_text()
    assert "| gaussian | 1 |" in table and "| laplace | 4 |" in table
    assert "consistent with the stated confidence" in table
    assert (directory / "mechanisms.png").stat().st_size > 0
    assert RESULTS.name == "results"
