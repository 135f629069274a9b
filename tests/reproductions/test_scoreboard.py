"""The scoreboard: generated from the committed results, and a guard on the ones that match."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reproductions import scoreboard
from reproductions.harness import ROOT, Output

COMMITTED = ROOT / "figures" / "scoreboard.json"


def _committed() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(COMMITTED.read_text())
    return loaded


def test_committed_scoreboard_is_what_the_committed_results_say() -> None:
    rows = scoreboard.build_rows(Output())
    committed = _committed()
    assert committed["rows"] == rows, "regenerate: python -m reproductions --only scoreboard"
    assert committed["totals"] == scoreboard.totals(rows)
    assert scoreboard.MARKDOWN.read_text() == scoreboard.markdown(rows)
    start, end = scoreboard.TOTALS_MARKERS
    assert f"{start}\n{scoreboard.totals_sentence(rows)}\n{end}" in scoreboard.README.read_text()


def test_every_committed_match_is_still_within_its_tolerance() -> None:
    """A change that silently breaks a committed result turns a ``matches`` row red here."""
    now = {(row["paper"], row["quantity"]): row for row in scoreboard.build_rows(Output())}
    matched = [row for row in _committed()["rows"] if row["verdict"] == "matches"]  # type: ignore[attr-defined]
    assert any(row["profile"] == "full" for row in matched)  # trained results are guarded too
    for row in matched:
        current = now.get((row["paper"], row["quantity"]))
        assert current is not None, f"row disappeared: {row['quantity']}"
        assert current["ours"] is not None, f"result missing: {row['quantity']}"
        gap = abs(current["ours"] - row["paper_value"])
        assert gap <= row["tolerance"] + scoreboard.SLACK, row["quantity"]


def test_rows_have_every_field_and_a_known_verdict() -> None:
    for row in _committed()["rows"]:  # type: ignore[attr-defined]
        assert set(row) == {f.name for f in scoreboard.dataclasses.fields(scoreboard.Row)}
        assert row["paper"] in (scoreboard.ABADI, scoreboard.BU2019, scoreboard.BU2021)
        assert row["verdict"] == "matches" or row["verdict"].startswith(
            ("differs (explained: ", "differs (unexplained)", "not run (")
        )
        assert row["profile"] in ("quick", "full", "any")
        if row["verdict"] == "matches":
            assert row["ours"] is not None and math.isfinite(row["ours"])


def _fake_mnist(output: Output, accuracy: float) -> None:
    summary = {
        level: {"test_accuracy": accuracy, "paper_epochs": 16, "epsilon_paper_epochs_with_pca": {}}
        for level in ("large", "medium", "small")
    }
    output.save_results(
        "abadi2016_mnist_full",
        config={"profile": "full"},
        rows=[],
        extra={"hardware": "test", "summary": summary},
    )


def test_a_drifted_result_stops_matching(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    _fake_mnist(output, 0.9)
    first = {row["quantity"]: row for row in scoreboard.build_rows(output)}
    large = next(q for q in first if q.startswith("Sec. 5.2 / Fig. 3 MNIST test accuracy, large"))
    assert first[large]["verdict"] == "matches" and first[large]["profile"] == "full"
    _fake_mnist(output, 0.85)  # five points below the paper's 90 %
    drifted = {row["quantity"]: row for row in scoreboard.build_rows(output)}
    assert drifted[large]["verdict"] == "differs (unexplained)"


def test_compute_writes_json_and_markdown(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    _fake_mnist(output, 0.95)
    page, readme = tmp_path / "SCOREBOARD.md", tmp_path / "README.md"
    readme.write_text("a\n<!-- scoreboard-totals:start -->\n<!-- scoreboard-totals:end -->\n")
    scoreboard.compute("quick", output=output, markdown_path=page, readme=readme)
    assert "numbers:" in readme.read_text()
    saved = output.load_results("scoreboard")
    assert saved["totals"]["rows"] == len(saved["rows"]) > 0
    assert f"**{saved['totals']['rows']} numbers:" in page.read_text()


@pytest.mark.parametrize(
    ("paper", "ours", "tolerance", "expected"),
    [
        (0.95, 0.94, 0.01, "matches"),
        (0.95, 0.9399, 0.01, "differs (unexplained)"),
        (None, 0.9, 0.01, "not run (no result saved)"),
    ],
)
def test_verdict(paper: float | None, ours: float | None, tolerance: float, expected: str) -> None:
    assert scoreboard.verdict(paper, ours, tolerance) == expected


def _fake_fig4(output: Output, means: dict[str, float]) -> None:
    summary = {
        label: {
            "final_accuracy": None,
            "seeds_done": [],
            "unfinished": {str(seed): 9.0 for seed in range(5)},
            "accuracy_at_common_epoch": {"mean": mean, "min": mean, "max": mean, "n": 5},
        }
        for label, mean in means.items()
    }
    output.save_results(
        "bu2021_jl_accuracy_full",
        config={"profile": "full", "paper_epochs": 60},
        rows=[],
        extra={"hardware": "test", "common_epoch": 9.0, "summary": summary},
    )


def test_fig4_stopped_early_compares_at_the_common_epoch(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    _fake_fig4(
        output,
        {"DP-SGD": 0.95, "DP-SGD-JL r=1": 0.96, "DP-SGD-JL r=3": 0.925, "DP-SGD-JL r=20": 0.945},
    )
    rows = {row["quantity"]: row for row in scoreboard.build_rows(output)}
    final = [q for q in rows if q.startswith("Fig. 4 MNIST final test accuracy")]
    assert len(final) == 2 and all(rows[q]["verdict"].startswith("not run (") for q in final)
    at = {
        q: row for q, row in rows.items() if q.startswith("Fig. 4 MNIST test accuracy at epoch 9")
    }
    assert len(at) == 2  # r = 20 and r = 3 (the paper claims nothing for r = 1)
    r20 = next(row for q, row in at.items() if "r = 20" in q)
    r3 = next(row for q, row in at.items() if "r = 3" in q)
    assert r20["ours"] == pytest.approx(-0.005) and r20["verdict"] == "matches"
    assert r3["ours"] == pytest.approx(-0.025) and r3["verdict"] == "differs (unexplained)"
    assert "of 60" in next(iter(at)) and "5 seeds" in next(iter(at))


def _fake_bu2019(output: Output, keras_mean: float | None) -> None:
    setting = {
        "name": "mnist_sigma1.3_e15", "dataset": "mnist", "metric": "accuracy",
        "noise_multiplier": 1.3, "epochs": 15, "paper_metric": 0.95, "note": "",
    }  # fmt: skip
    summary = {
        "mnist_sigma1.3_e15": {
            "task": "mnist", "setting": setting, "status": "done", "epochs_run": 15,
            "test_metric": 0.936,
        }
    }  # fmt: skip
    output.save_results(
        "bu2019_training_full", config={"profile": "full"}, rows=[],
        extra={"hardware": "test", "summary": summary},
    )  # fmt: skip
    if keras_mean is not None:
        output.save_results(
            "bu2019_initialisation_full", config={"profile": "full"}, rows=[],
            extra={
                "setting": setting,
                "summary": {
                    "keras": {"mean": keras_mean, "final_accuracy": {"0": keras_mean}},
                    "torch": {"mean": 0.935, "final_accuracy": {"0": 0.935}},
                },
            },
        )  # fmt: skip


@pytest.mark.parametrize(
    ("keras_mean", "explained"), [(None, False), (0.9497, True), (0.93, False)]
)
def test_bu2019_gap_is_explained_only_by_a_measured_initialisation_check(
    tmp_path: Path, keras_mean: float | None, explained: bool
) -> None:
    output = Output.under(tmp_path)
    _fake_bu2019(output, keras_mean)
    row = next(
        row for row in scoreboard.build_rows(output) if row["quantity"].startswith("mnist test")
    )
    if explained:
        assert row["verdict"].startswith("differs (explained: torch's default layer init")
        assert "0.9497 (mean of 1 seeds; torch's init 0.9350)" in row["verdict"]
    else:
        assert row["verdict"] == "differs (unexplained)"


def test_sweep_points_stopped_by_a_deadline_are_not_run(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    rows = [
        {"axis": "pca", "value": 0, "run": "none_h1000_l600", "test_accuracy": 0.93},
        {"axis": "pca", "value": 10, "run": "dp_pca10_h1000_l600", "test_accuracy": 0.80},
    ]
    summary = {
        "none_h1000_l600": {"status": "done"},
        "dp_pca10_h1000_l600": {"status": "stopped at epoch 50 of 215 (deadline)"},
    }
    output.save_results(
        "abadi2016_sweeps_full", config={"profile": "full"}, rows=rows,
        extra={"hardware": "test", "summary": summary,
               "paper_fig5": {"pca": {"0": 0.931, "10": 0.94, "20": 0.947}}},
    )  # fmt: skip
    got = {row["quantity"]: row for row in scoreboard.build_rows(output)}
    done = got["Fig. 5 MNIST test accuracy vs projection dimension = 0 (eps = 2)"]
    assert done["verdict"] == "matches" and done["ours"] == 0.93 and done["profile"] == "full"
    stopped = got["Fig. 5 MNIST test accuracy vs projection dimension = 10 (eps = 2)"]
    assert stopped["ours"] is None
    assert stopped["verdict"] == (
        "not run (the full sweep stopped before this point was trained to eps = 2 "
        "(stopped at epoch 50 of 215 (deadline)))"
    )
    absent = got["Fig. 5 MNIST test accuracy vs projection dimension = 20 (eps = 2)"]
    assert absent["ours"] is None and "(not reached)" in absent["verdict"]
