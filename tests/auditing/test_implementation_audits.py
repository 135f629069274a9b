"""The implementation audits: sound on a correct loop, each planted bug flagged by some audit.

The planted bugs are external implementations (hand-written torch loops behind the adapter);
nothing of dpcore's training code is swapped. Seeds are fixed, so these are deterministic.
"""

from __future__ import annotations

import pytest

from audits.implementations.plain_torch import PLANTED_BUGS, PlainTorchDpSgd
from dpcore.auditing import AuditSettings, audit_implementation
from dpcore.auditing.implementation_audits import seeds_verdict
from dpcore.errors import InvalidParameterError

PER_STEP = AuditSettings(steps=50, runs=4)
ONE_RUN = AuditSettings(target_epsilon=2.0, steps=100, sampler_steps=500)


def _audit(bug: str) -> dict[str, dict[str, object]]:
    rows = audit_implementation(PlainTorchDpSgd(bug), per_step=PER_STEP, one_run=ONE_RUN)
    return {str(row["audit"]): row for row in rows}


def test_a_correct_loop_passes_every_audit() -> None:
    rows = _audit("")
    assert set(rows) == {"whitebox_per_step", "noise_calibration", "one_run", "sampler"}
    for row in rows.values():
        assert row["verdict"] == "consistent", row
    for audit in ("whitebox_per_step", "one_run"):
        lower, certified = rows[audit]["epsilon_lower"], rows[audit]["certified_epsilon"]
        assert isinstance(lower, float) and isinstance(certified, float)
        assert 0 <= lower <= certified


#: which audit flags each planted bug (and with which verdict)
EXPECTED = {
    "halved noise": ("noise_calibration", "noise does not match the claim"),
    "noise sigma, not sigma C": ("noise_calibration", "noise does not match the claim"),
    "no clipping": ("whitebox_per_step", "violation"),
    "realised lot size": ("noise_calibration", "noise does not match the claim"),
    "shuffled as Poisson": ("sampler", "sampling does not match the claimed analysis"),
    "noise per worker": ("noise_calibration", "noise does not match the claim"),
    "noise once per 4 lots": ("noise_calibration", "noise does not match the claim"),
}


def test_every_planted_bug_has_an_expectation() -> None:
    assert set(EXPECTED) == set(PLANTED_BUGS)


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_planted_bug_is_flagged(bug: str) -> None:
    audit, verdict = EXPECTED[bug]
    assert _audit(bug)[audit]["verdict"] == verdict


def test_seeds_verdict_allows_what_the_confidence_allows() -> None:
    row = {
        "implementation": "x",
        "audit": "one_run",
        "claimed_epsilon": 1.0,
        "claimed_accountant": "",
        "certified_epsilon": 1.0,
        "certified": {},
        "epsilon_lower": 0.5,
        "confidence": 0.95,
        "claim": {},
    }
    one_of_twenty = [dict(row, verdict="violation")] + [dict(row, verdict="consistent")] * 19
    assert seeds_verdict(one_of_twenty)["verdict"] == "consistent"  # 1 of 20 at 95 %: expected
    # P[Bin(20, 0.05) >= 5] = 2.6e-3 (allowed), P[Bin(20, 0.05) >= 6] = 3.3e-4 (not)
    five = [dict(row, verdict="violation")] * 5 + [dict(row, verdict="consistent")] * 15
    assert seeds_verdict(five)["verdict"] == "consistent"
    six = [dict(row, verdict="violation")] * 6 + [dict(row, verdict="consistent")] * 14
    summary = seeds_verdict(six)
    assert summary["verdict"] == "violation" and summary["flagged_seeds"] == 6
    with pytest.raises(InvalidParameterError, match="rows"):
        seeds_verdict([])


def test_one_seed_keeps_its_verdict() -> None:
    row = {
        "implementation": "x",
        "audit": "sampler",
        "claimed_epsilon": None,
        "claimed_accountant": "",
        "certified_epsilon": 1.0,
        "certified": {},
        "epsilon_lower": None,
        "confidence": 0.95,
        "claim": {},
        "verdict": "sampling does not match the claimed analysis",
    }
    assert seeds_verdict([row])["verdict"] == row["verdict"]


def test_audit_implementation_refuses_no_seeds() -> None:
    with pytest.raises(InvalidParameterError, match="seeds"):
        audit_implementation(PlainTorchDpSgd(), seeds=0)
