"""The implementation audits: sound on a correct loop, each planted bug flagged by its test.

The planted bugs are external implementations (hand-written torch loops behind the adapter);
nothing of dpcore's training code is swapped. Seeds are fixed, so these are deterministic.
"""

from __future__ import annotations

import math

import pytest

from audits.implementations.plain_torch import PLANTED_BUGS, TEST_FOR_BUG, PlainTorchDpSgd
from dpcore.auditing import AuditSettings, audit_implementation
from dpcore.auditing.verdicts import FLAGGED
from dpcore.errors import InvalidParameterError

PER_STEP = AuditSettings(steps=50, runs=4, tiny_runs=2)
ONE_RUN = AuditSettings(target_epsilon=2.0, steps=100, sampler_steps=300)


def _audit(bug: str) -> dict[str, dict[str, object]]:
    rows = audit_implementation(PlainTorchDpSgd(bug), per_step=PER_STEP, one_run=ONE_RUN)
    return {str(row["audit"]): row for row in rows}


def test_a_correct_loop_passes_every_audit() -> None:
    rows = _audit("")
    assert set(rows) == set(FLAGGED)
    for row in rows.values():
        assert row["verdict"] == "consistent", row
    for audit in ("whitebox_per_step", "one_run"):
        lower, certified = rows[audit]["epsilon_lower"], rows[audit]["certified_epsilon"]
        assert isinstance(lower, float) and isinstance(certified, float)
        assert 0 <= lower <= certified
    assert rows["sampler_lots"]["sampler_seen"] == "poisson"


EXPECTED = TEST_FOR_BUG


def test_every_planted_bug_has_an_expectation() -> None:
    assert set(EXPECTED) == set(PLANTED_BUGS)


@pytest.mark.parametrize("bug", PLANTED_BUGS)
def test_planted_bug_is_flagged_by_its_test(bug: str) -> None:
    audit = EXPECTED[bug]
    assert _audit(bug)[audit]["verdict"] == FLAGGED[audit]


def test_no_epsilon_bound_is_printed_for_correlated_steps_or_another_sampler() -> None:
    for bug, reason in (("reused noise", "correlated"), ("lots replayed each epoch", "replayed")):
        row = _audit(bug)["whitebox_per_step"]
        assert row["epsilon_lower"] is None
        assert str(row["bound_note"]).startswith("not an ε bound") and reason in row["bound_note"]
        assert isinstance(row["p_value"], float)


def test_report_has_seed_rows_and_seed_offset() -> None:
    settings = AuditSettings(steps=20, runs=2, tiny_runs=1)
    one_run = AuditSettings(target_epsilon=2.0, steps=20, sampler_steps=100)
    seen: list[int] = []
    report = audit_implementation(
        PlainTorchDpSgd(),
        per_step=settings,
        one_run=one_run,
        seeds=2,
        seed_offset=5,
        on_seed=lambda seed, rows: seen.append(seed),
    )
    assert seen == [5, 6]
    assert {row["seed"] for row in report.seed_rows} == {5, 6}
    assert all(row["seeds"] == 2 for row in report)
    assert report.level == 0.05


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_epsilon", 0.0),
        ("target_epsilon", math.inf),
        ("delta", 1.0),
        ("delta", math.nan),
        ("real_records", 0),
        ("real_records", 2.0),
        ("steps", 0),
        ("steps", True),
        ("runs", 0),
        ("runs", -1),
        ("held_out_fraction", 0.0),
        ("held_out_fraction", 1.0),
        ("max_grad_norm", 0.0),
        ("max_grad_norm", -2.0),
        ("max_grad_norm", math.nan),
        ("learning_rate", 0.0),
        ("learning_rate", -0.1),
        ("learning_rate", math.inf),
        ("sampling_probability", 0.0),
        ("sampling_probability", math.nan),
        ("confidence", 1.0),
        ("task", "cnn"),
        ("classes", 1),
        ("tiny_records", 0),
        ("one_run_guesses_each_side", 600),
    ],
)
def test_settings_refuse_values_out_of_range_naming_them(field: str, value: object) -> None:
    with pytest.raises(InvalidParameterError) as error:
        AuditSettings(**{field: value})  # type: ignore[arg-type]
    assert error.value.parameter == field


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("seeds", 0),
        ("seeds", True),
        ("seeds", 1.5),
        ("seed_offset", -1),
        ("seed_offset", 0.5),
        ("level", 0.0),
        ("level", math.nan),
        ("per_step", "fast"),
    ],
)
def test_audit_implementation_refuses_bad_arguments_naming_them(
    argument: str, value: object
) -> None:
    with pytest.raises(InvalidParameterError) as error:
        audit_implementation(PlainTorchDpSgd(), **{argument: value})  # type: ignore[arg-type]
    assert error.value.parameter == argument
