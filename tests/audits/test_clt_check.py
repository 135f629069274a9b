"""The CLT check rejects the CLT's mu where the CLT understates epsilon, below the tight bound."""

from __future__ import annotations

import pytest

from audits import clt_check


def test_clt_is_rejected_and_bounds_are_ordered(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("audits.results_io.RESULTS", tmp_path)
    monkeypatch.setattr("audits.clt_check.RESULTS", tmp_path)
    rows = clt_check.run(clt_check.CltCheckConfig(runs=300_000, seeds=(11,)))
    (row,) = rows
    # mu_CLT = 0.2 sqrt(5 (e - 1)) = 0.586 (Bu et al. 2019, Thm 5); the true curve is farther
    # from the identity in its tail, and 3e5 runs suffice to show it at 95% confidence.
    assert row["mu_clt"] == pytest.approx(0.586, abs=1e-3)
    assert row["clt_rejected"]
    assert row["epsilon_lower"] <= row["epsilon_upper"]["pld"]  # sound: below the tight bound
    clt_check.write_report()
    assert "| 11 |" in (tmp_path / "clt_check.md").read_text()
