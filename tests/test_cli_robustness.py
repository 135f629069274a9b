"""The command line never ends in a traceback: every input gives an answer (exit 0) or one line
naming the parameter (exit 2), and every answer is a valid epsilon (>= 0, lower <= upper).

Inputs come from IEEE edges (0, -0, subnormals, 1e-300, 1e300, inf, nan), probabilities at 0
and 1 and one ulp inside, step counts up to 1e18, and text that is not a number at all. The
default budget is small (a few seconds); ``nox -s slow`` runs the same properties wider.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dpcore.cli import main

EDGE_REALS = [
    "0", "-0.0", "5e-324", "1e-300", "1e-160", "2.2250738585072014e-308", "1e300", "1e200",
    "inf", "-inf", "nan", "-1", "1", "0.5", "2", "10", "abc", "", "1e", "0x10",
]  # fmt: skip
PROBABILITIES = [
    "0", "1", repr(math.nextafter(1.0, 0.0)), repr(math.nextafter(0.0, 1.0)), "0.01", "0.5",
    "1.0000000000000002", "-0.0", "nan", "inf", "x",
]  # fmt: skip
STEPS = ["0", "1", "100", "1000000000000000000", "-1", "1.5", "1e3", "", "99999999999999999999"]
DELTAS = ["1e-5", "5e-324", "1e-300", "0.5", repr(math.nextafter(1.0, 0.0)), "0", "1", "nan"]
# Accountants whose answers stay fast at every edge (the PLD accountant's grid costs seconds to
# a minute for 1e-150 < sigma < 0.1; it is swept over the edges where it is fast).
FAST = ["basic,advanced,moments,rdp,gdp_clt", "pld"]
PLD_SIGMAS = ["0", "5e-324", "1e-300", "1e-160", "1e200", "1e300", "inf", "1", "2", "nan", "-1"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        status = int(stop.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _check_answer(status: int, out: str, err: str) -> None:
    assert status in (0, 2), (status, err)
    if status == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dpcore: error:"), err
        assert "Traceback" not in err
        return
    for row in json.loads(out):
        upper, lower = row["epsilon"], row.get("epsilon_lower")
        assert upper is None or upper >= 0, row
        if lower is not None:
            assert lower >= 0, row
            assert upper is None or lower <= upper, row
        if upper is None and lower is not None:
            assert lower >= 0, row


def _account_argv(q: str, sigma: str, steps: str, delta: str, accountants: str) -> list[str]:
    return [
        "account", "--json", "--sampling-rate", q, "--noise-multiplier", sigma,
        "--steps", steps, "--delta", delta, "--accountants", accountants,
    ]  # fmt: skip


def _account_property(
    q: str, sigma: str, steps: str, delta: str, accountants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _run(_account_argv(q, sigma, steps, delta, accountants), capsys)
    _check_answer(status, out, err)


_SETTINGS = {"deadline": None, "suppress_health_check": [HealthCheck.function_scoped_fixture]}


@settings(max_examples=40, **_SETTINGS)
@given(
    q=st.sampled_from(PROBABILITIES),
    sigma=st.sampled_from(EDGE_REALS),
    steps=st.sampled_from(STEPS),
    delta=st.sampled_from(DELTAS),
)
@example(q="0.01", sigma="1e-300", steps="100", delta="1e-5")  # was ZeroDivisionError (pairs)
@example(q="0.01", sigma="1e300", steps="100", delta="1e-5")  # was OverflowError (rdp)
@example(q="1.0", sigma="5e-324", steps="173", delta="2.2250738585e-313")  # split overspent delta
def test_account_never_ends_in_a_traceback(
    q: str, sigma: str, steps: str, delta: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _account_property(q, sigma, steps, delta, FAST[0], capsys)


@settings(max_examples=25, **_SETTINGS)
@given(
    q=st.sampled_from(PROBABILITIES),
    sigma=st.sampled_from(PLD_SIGMAS),
    steps=st.sampled_from(STEPS),
    delta=st.sampled_from(DELTAS),
)
@example(q="1", sigma="1", steps="1000000000000000000", delta="1e-5")  # was a 7 EiB allocation
def test_account_with_the_pld_accountant_never_ends_in_a_traceback(
    q: str, sigma: str, steps: str, delta: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _account_property(q, sigma, steps, delta, FAST[1], capsys)


@settings(max_examples=25, **_SETTINGS)
@given(
    q=st.sampled_from(PROBABILITIES),
    steps=st.sampled_from(STEPS),
    delta=st.sampled_from(DELTAS),
    target=st.sampled_from(EDGE_REALS),
    accountant=st.sampled_from(["rdp", "moments", "basic", "advanced", "gdp_clt"]),
)
def test_calibrate_never_ends_in_a_traceback(
    q: str, steps: str, delta: str, target: str, accountant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "calibrate", "--json", "--sampling-rate", q, "--steps", steps, "--delta", delta,
        "--target-epsilon", target, "--accountant", accountant,
    ]  # fmt: skip
    status, out, err = _run(argv, capsys)
    assert status in (0, 2), err
    if status == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("dpcore: error:"), err
    else:
        result = json.loads(out)
        assert result["noise_multiplier"] >= 0


def test_a_noiseless_step_has_an_infinite_certified_lower_bound_only_below_its_reach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """sigma so small that 1 / (2 sigma^2) overflows is noiseless: with probability
    1 - (1 - q)^T = 0.634 a step reveals the example, so epsilon is inf for delta below that
    (lower bound inf too) and the certified lower bound is 0 above it."""
    status, out, _ = _run(_account_argv("0.01", "1e-300", "100", "1e-5", "pld"), capsys)
    assert status == 0 and json.loads(out)[0]["epsilon_lower"] is None  # inf
    status, out, _ = _run(_account_argv("0.01", "1e-300", "100", "0.7", "pld"), capsys)
    row = json.loads(out)[0]
    assert status == 0 and row["epsilon"] is None and row["epsilon_lower"] == 0.0


def test_a_composition_beyond_the_pld_precision_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """10^18 steps once asked the PLD for 6.9 EiB; beyond 10^9 compositions the FFT's power is
    not trusted, so the command names the parameter instead."""
    status, _, err = _run(_account_argv("1", "1", "1000000000000000000", "1e-5", "pld"), capsys)
    assert status == 2 and "Expected steps <= 1e+09 compositions in one PLD" in err


@pytest.mark.slow
@settings(max_examples=1500, **_SETTINGS)
@given(
    q=st.one_of(st.sampled_from(PROBABILITIES), st.floats(0, 1).map(repr)),
    sigma=st.one_of(st.sampled_from(EDGE_REALS), st.floats(allow_nan=True).map(repr)),
    steps=st.one_of(st.sampled_from(STEPS), st.integers(0, 10**18).map(str)),
    delta=st.one_of(st.sampled_from(DELTAS), st.floats(0, 1).map(repr)),
    accountants=st.sampled_from(["basic", "advanced", "moments", "rdp", "gdp_clt", "pld"]),
)
def test_account_never_ends_in_a_traceback_wide(
    q: str, sigma: str, steps: str, delta: str, accountants: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _account_property(q, sigma, steps, delta, accountants, capsys)


def test_shuffle_lower_bound_for_tiny_noise_is_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 10: sigma <= 0.0131 with --sampler shuffle ended in a raw ValueError (exit 1); the
    certified lower bound is now a finite number (about 700 per epoch, the loss cap)."""
    argv = [
        "account", "--json", "--sampling-rate", "0.5", "--steps", "2", "--delta", "1e-5",
        "--noise-multiplier", "0.01", "--sampler", "shuffle", "--dataset-size", "20",
        "--accountants", "rdp",  # the shuffle row does not depend on them (pld here takes ~4 s)
    ]  # fmt: skip
    status, out, err = _run(argv, capsys)
    assert status == 0, err
    row = json.loads(out)[-1]
    assert row["accountant"] == "shuffle" and row["kind"] == "lower_bound"
    assert isinstance(row["epsilon"], float) and 690.0 < row["epsilon"] < 701.0


@settings(max_examples=30, **_SETTINGS)
@given(
    q=st.sampled_from([*PROBABILITIES, "0.25", "0.3333333333333333", "0.1"]),
    sigma=st.sampled_from(EDGE_REALS),
    steps=st.sampled_from(["0", "1", "2", "10", "100", "-1", "x"]),
    delta=st.sampled_from(DELTAS),
    size=st.sampled_from(["1", "3", "4", "20", "1000", "0", "-1", "1.5", None]),
    sampler=st.sampled_from(["shuffle", "balls-in-bins", "poisson", "bogus", "Shuffle", ""]),
)
@example(q="1.0", sigma="1e300", steps="10", delta="1e-5", size="2", sampler="shuffle")
@example(q="0.5", sigma="1e-300", steps="2", delta="1e-5", size="20", sampler="shuffle")
def test_samplers_never_end_in_a_traceback(
    q: str,
    sigma: str,
    steps: str,
    delta: str,
    size: str | None,
    sampler: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--sampler and --dataset-size at the edges; sigma = 1e300 with the shuffle lower bound
    was an OverflowError (sigma^2), tiny sigma a ValueError."""
    argv = [*_account_argv(q, sigma, steps, delta, "rdp"), "--sampler", sampler]
    if size is not None:
        argv += ["--dataset-size", size]
    status, out, err = _run(argv, capsys)
    _check_answer(status, out, err)
