"""Decisions of one audit call: seeds combined by Fisher, audits decided by Holm."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.auditing.verdicts import AuditReport, fisher, holm, summarise
from dpcore.errors import InvalidParameterError


def test_holm_steps_down() -> None:
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]
    assert holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]  # 0.01<0.05/3, 0.02<0.025, ...
    assert holm([0.2, 0.3], 0.05) == [False, False]
    with pytest.raises(InvalidParameterError, match="level"):
        holm([0.1], 1.5)


def test_holm_controls_the_family_wise_error() -> None:
    rng = np.random.default_rng(0)
    any_flag = [any(holm(list(rng.random(9)), 0.05)) for _ in range(4000)]
    assert np.mean(any_flag) <= 0.05 + 0.01


def test_fisher_combines_independent_p_values() -> None:
    assert fisher([0.3]) == 0.3
    assert fisher([0.01, 0.01]) < 0.01
    rng = np.random.default_rng(1)
    combined = np.array([fisher(list(rng.random(5))) for _ in range(2000)])
    assert abs(np.mean(combined < 0.05) - 0.05) < 0.015


def _row(audit: str, p: float, seed: int = 0, **extra: object) -> dict[str, object]:
    return {"implementation": "x", "audit": audit, "seed": seed, "p_value": p, **extra}


def test_summaries_decide_all_audits_together() -> None:
    rows = [
        _row("noise_calibration", 0.03),  # below 0.05 alone, not below Holm's 0.05 / 2
        _row("one_run", 0.3, epsilon_lower=0.5),
        _row("sampler", 1e-6),
        _row("whitebox_per_step", 0.5, not_applicable="no lots"),
    ]
    summary = {r["audit"]: r for r in summarise(rows, 0.05, {"rate": 0.01})}
    assert summary["sampler"]["verdict"] == "sampling does not match the claimed analysis"
    assert summary["sampler"]["holm_threshold"] == pytest.approx(0.05 / 3)
    assert summary["noise_calibration"]["verdict"] == "consistent"
    assert summary["noise_calibration"]["flagged_seeds"] == 1
    assert summary["noise_calibration"]["holm_threshold"] == pytest.approx(0.05 / 2)
    assert summary["one_run"]["epsilon_lower"] == 0.5
    assert summary["one_run"]["false_alarm_rate"] == 0.01
    assert summary["whitebox_per_step"]["verdict"].startswith("not applicable")
    assert list(summary) == ["whitebox_per_step", "noise_calibration", "one_run", "sampler"]


def test_seeds_are_combined_before_holm() -> None:
    rows = [_row("noise_calibration", 0.02, seed) for seed in range(4)]
    (summary,) = summarise(rows)
    assert summary["seeds"] == 4 and summary["p_value"] < 0.01
    assert summary["verdict"] == "noise does not match the claim"


def test_report_is_a_list_of_summaries_with_the_seed_rows() -> None:
    rows = [_row("sampler", 0.5)]
    report = AuditReport(summarise(rows), rows, 0.05, None)
    assert [r["audit"] for r in report] == ["sampler"] and report.seed_rows == rows
    assert not report.flagged
