"""The non-private ceiling of Abadi et al. 2016's Fig. 5 projection points, and the scoreboard's
reading of it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from reproductions import scoreboard
from reproductions.abadi2016 import mnist_core, pca_ceiling, sweeps
from reproductions.harness import Output
from tests.reproductions.mnist_images import patterned_digits

MNIST_SIZE = 60_000


_fake_mnist = patterned_digits(28, 1200, 100)


@pytest.fixture
def fake_mnist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mnist_core, "load_mnist", _fake_mnist)


def test_full_profile_trains_at_least_the_private_points_steps() -> None:
    """The full profile's epochs are the private point's steps rounded up to whole epochs, with
    the sweep point's model, lot and schedule: only the seed and the epochs differ."""
    run = pca_ceiling.CeilingRun(pca_ceiling.PROFILES["full"], 10, 2)
    config = pca_ceiling.run_config(run, MNIST_SIZE)
    point = sweeps.point_config(sweeps.PROFILES["full"], "pca", 10)
    steps = pca_ceiling.private_steps(10, MNIST_SIZE)
    per_epoch = mnist_core.steps_per_epoch(point, MNIST_SIZE)
    assert config.baseline_epochs == math.ceil(steps / per_epoch)
    assert (config.baseline_epochs - 1) * per_epoch < steps <= config.baseline_epochs * per_epoch
    assert config.seed == 2 and config.pca_components == 10 and config.projection == "dp_pca"
    assert (config.hidden_units, config.lot_size, config.lr_start, config.lr_end) == (
        point.hidden_units,
        point.lot_size,
        point.lr_start,
        point.lr_end,
    )
    assert pca_ceiling.PROFILES["full"].dims == (10, 60)


@pytest.mark.parametrize(
    ("changes", "name"),
    [({"dims": ()}, "dims"), ({"dims": (0,)}, "dims"), ({"seeds": ()}, "seeds"),
     ({"epochs": 0}, "epochs")],
)  # fmt: skip
def test_config_refuses_bad_values(changes: dict[str, object], name: str) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        pca_ceiling.CeilingConfig(**changes)  # type: ignore[arg-type]


def test_unknown_profile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="profile"):
        pca_ceiling.compute("huge", output=Output.under(tmp_path))


def test_quick_profile_saves_rows_summary_and_figure(tmp_path: Path, fake_mnist: None) -> None:
    output = Output.under(tmp_path)
    config = pca_ceiling.CeilingConfig(dims=(10, 20), seeds=(0, 1), epochs=1)
    pca_ceiling.compute(config=config, output=output)
    pca_ceiling.plot(output=output)
    data = output.load_results(pca_ceiling.results_stem("quick"))
    assert [(row["dims"], row["seed"]) for row in data["rows"]] == [
        (10, 0),
        (10, 1),
        (20, 0),
        (20, 1),
    ]
    for row in data["rows"]:
        assert row["epochs"] == 1 and row["steps"] >= 1 and 0.0 <= row["test_accuracy"] <= 1.0
    summary = data["summary"]["10"]
    values = [row["test_accuracy"] for row in data["rows"] if row["dims"] == 10]
    assert summary["max"] == max(values) and summary["n"] == 2
    assert summary["mean"] == pytest.approx(sum(values) / 2)
    assert summary["paper_private"] == sweeps.PAPER_FIG5["pca"][10]
    assert (tmp_path / "figures" / "abadi2016_pca_ceiling.png").is_file()


def test_seeds_change_the_run(fake_mnist: None) -> None:
    config = pca_ceiling.CeilingConfig(epochs=1)
    rows = [pca_ceiling.ceiling_row(pca_ceiling.CeilingRun(config, 10, s)) for s in (0, 0, 5)]
    assert rows[0]["test_accuracy"] == rows[1]["test_accuracy"]  # reproducible
    assert rows[0]["train_accuracy"] != rows[2]["train_accuracy"] or (
        rows[0]["test_accuracy"] != rows[2]["test_accuracy"]
    )


# ----------------------------------------------------------------------------- scoreboard


def _fake_sweep(output: Output, pca10: float) -> None:
    rows = [{"axis": "pca", "value": 10, "run": "dp_pca10_h1000_l600", "test_accuracy": pca10}]
    output.save_results(
        "abadi2016_sweeps_full", config={"profile": "full"}, rows=rows,
        extra={"hardware": "test", "summary": {}, "paper_fig5": {"pca": {"10": 0.94}}},
    )  # fmt: skip


def _fake_ceiling(output: Output, accuracies: list[float]) -> None:
    rows = [
        {"dims": 10, "seed": seed, "epochs": 216, "steps": 21600, "private_steps": 21502,
         "test_accuracy": value, "train_accuracy": value, "wall_s": 1.0}
        for seed, value in enumerate(accuracies)
    ]  # fmt: skip
    output.save_results(
        "abadi2016_pca_ceiling_full",
        config={"profile": "full"},
        rows=rows,
        extra={"summary": pca_ceiling.summarise(rows)},
    )


def _pca10(output: Output) -> str:
    return next(
        row["verdict"]
        for row in scoreboard.build_rows(output)
        if row["quantity"] == "Fig. 5 MNIST test accuracy vs projection dimension = 10 (eps = 2)"
    )


def test_scoreboard_explains_a_reading_above_the_non_private_ceiling(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    _fake_sweep(output, 0.8988)
    assert _pca10(output) == "differs (unexplained)"  # no ceiling study saved
    _fake_ceiling(output, [0.9301, 0.9312, 0.9290])
    verdict = _pca10(output)
    assert verdict.startswith(
        "differs (explained: the paper's reading 0.94 is above what the paper's model (10 -> "
        "1,000 ReLU -> 10) reaches without privacy"
    )
    assert "216 epochs = 21600 steps, at least the private point's 21502" in verdict
    assert "mean 0.9301, max 0.9312 over 3 seeds" in verdict


def test_scoreboard_ignores_a_ceiling_that_reaches_the_reading(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    _fake_sweep(output, 0.8988)
    _fake_ceiling(output, [0.9301, 0.9400, 0.9290])  # one seed reaches the paper's 0.94
    assert _pca10(output) == "differs (unexplained)"
