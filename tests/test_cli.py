"""The command line: the table, the stable JSON shape, calibration, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dpcore.accountants import ACCOUNTANT_NAMES
from dpcore.cli import main

ACCOUNT = [
    "account",
    "--sampling-rate",
    "0.01",
    "--noise-multiplier",
    "4",
    "--steps",
    "10000",
    "--delta",
    "1e-5",
]


def test_json_has_one_stable_object_per_accountant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ACCOUNT, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["accountant"] for row in rows] == list(ACCOUNTANT_NAMES)
    for row in rows:
        assert {"accountant", "epsilon", "kind", "seconds"} <= set(row)
        assert row["kind"] in {"upper_bound", "approximate"}
        assert row["epsilon"] > 0 and row["seconds"] >= 0
    by_name = {row["accountant"]: row for row in rows}
    assert by_name["gdp_clt"]["kind"] == "approximate"
    assert by_name["pld"]["epsilon_lower"] <= by_name["pld"]["epsilon"] <= by_name["rdp"]["epsilon"]
    assert "epsilon_lower" not in by_name["rdp"]
    # Strong composition is far looser than the moments accountant here (Abadi et al. 2016, Fig. 2).
    assert by_name["advanced"]["epsilon"] > 2 * by_name["moments"]["epsilon"]


def test_table_names_every_direction(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ACCOUNT) == 0
    out = capsys.readouterr().out
    for name in ACCOUNTANT_NAMES:
        assert name in out
    assert "approximate, not a guarantee" in out
    assert "interval (certified bounds)" in out
    assert "upper bound" in out


def test_subset_and_infinite_epsilon_is_null(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "account",
        "--sampling-rate",
        "0.1",
        "--noise-multiplier",
        "0",
        "--steps",
        "10",
        "--delta",
        "1e-5",
    ]
    assert main([*args, "--json", "--accountants", "rdp,pld"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["accountant"] for row in rows] == ["rdp", "pld"]
    assert all(row["epsilon"] is None for row in rows)


def test_calibrate_meets_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "calibrate",
        "--target-epsilon",
        "2",
        "--sampling-rate",
        "0.01",
        "--steps",
        "1000",
        "--delta",
        "1e-5",
        "--accountant",
        "rdp",
        "--json",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["accountant"] == "rdp" and result["noise_multiplier"] > 0


def _run(args: list[str]) -> int:
    """main()'s status, whether it returns it or argparse exits with it."""
    try:
        return main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--sampling-rate", "1.5", "sampling_probability in [0, 1]"),
        ("--sampling-rate", "abc", "sampling_rate to be a real number"),
        ("--noise-multiplier", "-1", "noise_multiplier >= 0"),
        ("--noise-multiplier", "nan", "noise_multiplier"),
        ("--steps", "2.5", "steps to be an integer"),
        ("--steps", "-3", "count >= 0"),
        ("--delta", "-0.1", "delta in [0, 1)"),
        ("--delta", "1.5", "delta in [0, 1)"),
        ("--delta", "inf", "delta in [0, 1)"),
        ("--accountants", "magic", "accountants in"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    flag: str, value: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = list(ACCOUNT)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpcore: error:")
    assert fragment in err
    assert "Traceback" not in err


def test_module_entry_point_exits_nonzero_without_traceback() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpcore",
            "account",
            "--sampling-rate",
            "2",
            "--noise-multiplier",
            "1",
            "--steps",
            "10",
            "--delta",
            "1e-5",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip().count("\n") == 0
    assert "Traceback" not in completed.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            [
                "calibrate",
                "--target-epsilon",
                "0",
                "--sampling-rate",
                "0.01",
                "--steps",
                "10",
                "--delta",
                "1e-5",
            ],
            "target_epsilon",
        ),
        (
            [
                "calibrate",
                "--target-epsilon",
                "-1",
                "--sampling-rate",
                "0.01",
                "--steps",
                "10",
                "--delta",
                "1e-5",
            ],
            "target_epsilon",
        ),
        (["account", "--sampling-rate", "0.01"], "required"),
        (["teleport"], "invalid choice"),
    ],
)
def test_more_bad_inputs(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_jl_dimension_adds_a_certified_jl_row(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["account", "--sampling-rate", "0.01", "--noise-multiplier", "1", "--steps", "200"]
    argv += ["--delta", "1e-5", "--jl-dimension", "30", "--accountants", "pld", "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["accountant"] for row in rows] == ["pld", "jl"]
    pld, jl = rows
    assert jl["kind"] == "upper_bound" and jl["epsilon_lower"] <= jl["epsilon"]
    assert jl["epsilon"] > pld["epsilon"]  # r = 30 costs privacy at sigma = 1


def test_bad_jl_dimension_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["account", "--sampling-rate", "0.01", "--noise-multiplier", "1", "--steps", "10"]
    assert main([*argv, "--delta", "1e-5", "--jl-dimension", "0"]) == 2
    assert "Expected jl_dimension" in capsys.readouterr().err


SHUFFLE = [
    "account",
    "--sampling-rate",
    "0.01",
    "--noise-multiplier",
    "1.1",
    "--steps",
    "300",
    "--delta",
    "1e-5",
    "--sampler",
    "shuffle",
    "--dataset-size",
    "10000",
]


def test_shuffle_marks_poisson_rows_invalid_and_adds_a_lower_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SHUFFLE, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {row["accountant"]: row for row in rows}
    assert list(by_name)[-1] == "shuffle" and by_name["shuffle"]["kind"] == "lower_bound"
    assert all(row["valid"] is False for name, row in by_name.items() if name != "shuffle")
    # Three shuffled epochs leak provably more than the Poisson analysis claims.
    assert by_name["shuffle"]["epsilon"] > by_name["pld"]["epsilon"]
    assert main(SHUFFLE) == 0
    out = capsys.readouterr().out
    assert "certified lower bound" in out and "not valid here" in out


def test_balls_in_bins_rows_say_which_accountants_cannot_analyse_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [*ACCOUNT[:-2], "--delta", "1e-5", "--sampler", "balls-in-bins", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["accountant"] for row in rows] == list(ACCOUNTANT_NAMES)
    for row in rows:
        assert ("unsupported" in row) == (row["epsilon"] is None)
    assert any("unsupported" in row for row in rows)
    assert next(row for row in rows if row["accountant"] == "rdp")["epsilon"] > 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (SHUFFLE[:-2], "dataset_size to be given"),
        ([*SHUFFLE[:-1], "333"], "sampling_rate to be B / N"),
        ([*ACCOUNT, "--sampler", "balls-in-bins", "--sampling-rate", "0.003"], "1 / T"),
        ([*ACCOUNT, "--sampler", "shuffle", "--jl-dimension", "3"], "jl_dimension"),
        ([*ACCOUNT, "--sampler", "uniform"], "invalid choice"),
    ],
)
def test_bad_sampler_input_exits_2(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(args) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_delta_zero_is_infinite_for_gaussian_steps(capsys: pytest.CaptureFixture[str]) -> None:
    # A Gaussian step has unbounded privacy loss: no finite pure-DP epsilon (any accountant).
    args = list(ACCOUNT)
    args[args.index("--delta") + 1] = "0"
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(row["epsilon"] is None for row in rows)


def test_epochs_batch_size_and_dataset_size_derive_q_and_t(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--noise-multiplier", "1.1", "--delta", "1e-5", "--accountants", "rdp", "--json"]
    assert main(["account", "--sampling-rate", "0.04", "--steps", "50", *common]) == 0
    explicit = json.loads(capsys.readouterr().out)
    opacus = ["--batch-size", "240", "--dataset-size", "6000", "--epochs", "2"]
    assert main(["account", *opacus, *common]) == 0
    derived = json.loads(capsys.readouterr().out)
    assert derived[0]["epsilon"] == explicit[0]["epsilon"]
    assert main(["calibrate", *opacus, "--target-epsilon", "3", "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    assert "q = B / N = 240 / 6000 = 0.04" in out
    assert "T = epochs x round(N / B) = 2 x 25 = 50" in out
    assert "under the pld accountant" in out


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--batch-size", "10", "--dataset-size", "100"], "Expected steps given"),
        (["--epochs", "2"], "Expected sampling_rate given"),
        (["--sampling-rate", "0.1", "--batch-size", "10", "--steps", "5"], "batch_size not"),
        (["--batch-size", "200", "--dataset-size", "100", "--epochs", "1"], "batch_size in [1,"),
        (["--sampling-rate", "0.1", "--steps", "5", "--accountants", "prv"], "use pld"),
    ],
)
def test_run_shape_errors_are_one_line(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(["account", "--noise-multiplier", "1", "--delta", "1e-5", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
