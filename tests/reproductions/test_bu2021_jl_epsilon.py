"""Figure 3 of the Bu et al. 2021 reproduction: JL accounting on a tiny setting, and its table.

Reference values: the certified DP-SGD PLD interval on the same (q, sigma, T) (a second
accountant); the JL mechanism tends to DP-SGD as r grows (Bu et al. 2021, Lemma 4.1: the
estimated norm's ratio sqrt(X / r), X ~ chi^2_r, concentrates at 1).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reproductions.bu2021_jl.epsilon_vs_epochs import (
    PROFILES,
    epoch_steps,
    jl_epsilon_intervals,
    readme_table,
    vanilla_epsilons,
)
from reproductions.harness import Output

Q, SIGMA, DELTA, STEPS = 0.02, 1.0, 1e-5, [5, 50]


@pytest.fixture(scope="module")
def intervals() -> dict[int, list[tuple[float, float]]]:
    return {
        r: jl_epsilon_intervals(
            sampling_probability=Q,
            noise_multiplier=SIGMA,
            jl_dimension=r,
            steps=STEPS,
            delta=DELTA,
            bins=32,
        )
        for r in (10, 30)
    }


def test_jl_epsilon_is_a_bracket_growing_in_steps(intervals: dict[int, list]) -> None:
    for per_step in intervals.values():
        for lower, upper in per_step:
            assert 0 < lower <= upper < float("inf")
        assert per_step[1][0] > per_step[0][0] and per_step[1][1] > per_step[0][1]


def test_jl_epsilon_decreases_in_r(intervals: dict[int, list]) -> None:
    for short, long in zip(intervals[10], intervals[30], strict=True):
        # certified: r = 10's lower end is above r = 30's upper end
        assert short[0] > long[1]


def test_vanilla_dpsgd_is_below_jl_as_the_jl_accountant_says(intervals: dict[int, list]) -> None:
    vanilla = vanilla_epsilons(
        sampling_probability=Q, noise_multiplier=SIGMA, steps=STEPS[1], delta=DELTA
    )
    assert vanilla["pld_lower"] <= vanilla["pld_upper"]
    assert vanilla["pld_upper"] < intervals[30][1][0]  # below JL r = 30's certified lower end
    assert vanilla["clt_mu"] > 0


def test_epoch_steps_are_round_epochs_over_q() -> None:
    # 25,000 / 256 = 97.66 lots per epoch: 98 after one epoch, 1,953 after 20.
    steps = epoch_steps(PROFILES["quick"])
    assert steps[0] == 98 and steps[-1] == 1953


def _row(method: str, r: int | None, epoch: int, lower: float, upper: float | None) -> dict:
    return {
        "method": method,
        "r": r,
        "epoch": epoch,
        "steps": epoch * 98,
        "epsilon_lower": lower,
        "epsilon_upper": upper,
    }


def test_readme_table_from_saved_results() -> None:
    data = {
        "commit": "0123456789abcdef",
        "wall_time_s": 12.0,
        "config": {
            "profile": "quick",
            "lot_size": 256,
            "dataset_size": 25_000,
            "noise_multiplier": 1.0,
            "delta": 1e-5,
            "bins": 100,
            "epochs": [1, 20],
            "jl_dimensions": [1, 30],
        },
        "rows": [
            _row("dp_sgd_pld", None, 1, 0.729, 0.731),
            _row("dp_sgd_pld", None, 20, 2.61, 2.62),
            _row("dp_sgd_clt", None, 1, 0.464, 0.464),
            _row("dp_sgd_clt", None, 20, 2.41, 2.41),
            _row("dp_sgd_jl", 1, 1, 543.0, None),
            _row("dp_sgd_jl", 1, 20, 1480.0, None),
            _row("dp_sgd_jl", 30, 1, 0.848, 0.902),
            _row("dp_sgd_jl", 30, 20, 2.71, 2.89),
        ],
    }
    table = readme_table(data)
    assert "| DP-SGD, tight PLD | [0.729, 0.731] | [2.61, 2.62] |" in table
    assert "| DP-SGD-JL, r = 1 | [543, inf] | [1.48e+03, inf] |" in table
    assert "| DP-SGD-JL, r = 30 | [0.848, 0.902] | [2.71, 2.89] |" in table
    assert "epsilon after 20 epochs" in table


def test_stored_curves_are_recomputed_when_the_accountant_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A curve stored by older accountant code must not be reused (a cache once kept the figure
    on a superseded JL accountant after a fix)."""
    from reproductions.bu2021_jl import epsilon_vs_epochs as module

    output = Output.under(tmp_path)
    calls: list[int] = []

    def fake_intervals(**kwargs: object) -> list[tuple[float, float]]:
        calls.append(1)
        return [(1.0, 2.0)] * len(kwargs["steps"])  # type: ignore[arg-type]

    monkeypatch.setattr(module, "jl_epsilon_intervals", fake_intervals)
    config = module.EpsilonConfig(epochs=(1, 2), jl_dimensions=(10,))
    module.compute(config=config, output=output)
    module.compute(config=config, output=output)
    assert len(calls) == 1  # same code: the stored curve is read back
    assert len(list(output.store(module.STEM).iterdir())) == 2  # vanilla and r = 10
    monkeypatch.setattr(module, "code_fingerprint", lambda *modules: "changed")
    module.compute(config=config, output=output)
    assert len(calls) == 2  # the accountant's source changed: recomputed


def test_curves_fanned_out_give_the_in_process_rows(tmp_path: Path) -> None:
    """Every curve at once on a thread pool gives the rows computed one after another."""
    from concurrent.futures import ThreadPoolExecutor

    from reproductions.bu2021_jl import epsilon_vs_epochs as module

    config = module.EpsilonConfig(epochs=(1, 2), jl_dimensions=(10, 30), bins=16)
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    module.compute(config=config, output=here)
    with ThreadPoolExecutor(2) as pool:
        module.compute(config=config, output=threads, executor=pool)
    ours, theirs = (out.load_results(module.STEM) for out in (here, threads))
    assert ours["rows"] == theirs["rows"] and len(ours["rows"]) == 2 * 4
    assert [row["r"] for row in ours["rows"]][-4:] == [10, 10, 30, 30]
    assert set(theirs["accountant_seconds_per_r"]) == {"10", "30"}
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"


def test_compute_and_plot_write_only_through_their_output(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from reproductions.bu2021_jl import epsilon_vs_epochs as module

    tiny = module.EpsilonConfig(epochs=(1, 2), jl_dimensions=(10,), bins=16)
    monkeypatch.setitem(module.PROFILES, "quick", tiny)
    monkeypatch.setattr(
        module, "jl_epsilon_intervals", lambda **kwargs: [(1.0, 2.0)] * len(kwargs["steps"])
    )
    output = Output.under(tmp_path)
    module.compute("quick", output=output)
    data = output.load_results(module.STEM)
    assert [(row["method"], row["epoch"]) for row in data["rows"]][-2:] == [
        ("dp_sgd_jl", 1),
        ("dp_sgd_jl", 2),
    ]
    assert output.path(f"{module.STEM}.csv").is_file()
    assert len(list(output.store(module.STEM).iterdir())) == 2  # vanilla and r = 10
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- {module.TABLE}:start -->\nold\n<!-- {module.TABLE}:end -->\n")
    module.plot(output=output, readme=readme)
    assert output.path("bu2021_jl_epsilon_vs_epochs.png").stat().st_size > 1000
    assert "| DP-SGD-JL, r = 10 | [1, 2] | [1, 2] | not read |" in readme.read_text()
