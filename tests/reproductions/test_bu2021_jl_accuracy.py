"""Fig. 4 reproduction of Bu et al. 2021 (MNIST accuracy vs epochs), on generated images."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import reproductions.common as common
from dpcore.errors import InvalidParameterError
from reproductions.bu2021_jl import accuracy, accuracy_report
from reproductions.bu2021_jl.accuracy import AccuracyConfig

#: A tiny configuration: 128 generated images, lots of 32, two seeds, JL with r = 2.
TINY = AccuracyConfig(
    profile="quick",
    jl_dimensions=(2,),
    seeds=(0, 1),
    steps=4,
    eval_every=2,
    paper_epochs=2,
    dataset_size=128,
    lot_size=32,
    jl_bins=8,
)


def _images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = torch.rand(n, 1, 28, 28, generator=generator) * 0.1
    images[torch.arange(n), 0, labels * 2, :] = 1.0  # the label is a bright row
    return images, labels


def _tiny_data(config: AccuracyConfig) -> accuracy.Data:
    return (*_images(config.dataset_size, 0), *_images(64, 1))


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Figures, README and checkpoints of the module redirected into ``tmp_path``."""
    monkeypatch.setattr(common, "FIGURES", tmp_path)
    monkeypatch.setattr(accuracy, "FIGURES", tmp_path)
    monkeypatch.setattr(accuracy_report, "FIGURES", tmp_path)
    monkeypatch.setattr(accuracy, "CHECKPOINTS", tmp_path / "checkpoints")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- accuracy-table:start -->\nold\n<!-- accuracy-table:end -->\nend\n")
    monkeypatch.setattr(accuracy_report, "README", readme)
    return tmp_path


def test_spread() -> None:
    result = accuracy.spread([0.90, 0.96, 0.93])
    assert result["mean"] == pytest.approx(0.93)
    assert (result["min"], result["max"], result["n"]) == (0.90, 0.96, 3)
    assert result["std"] == pytest.approx(0.03)  # sample std of 0.90, 0.93, 0.96
    assert accuracy.spread([0.5])["std"] == 0.0
    with pytest.raises(InvalidParameterError):
        accuracy.spread([])


def test_steps_per_epoch_and_methods() -> None:
    full = accuracy.PROFILES["full"]
    # TF Privacy tutorial: 60000 // 256 = 234 lots per epoch, 60 epochs.
    assert accuracy.steps_per_epoch(full) == 234
    assert full.steps == 60 * 234 and len(full.seeds) >= 3
    assert [r for _, r in accuracy.methods(full)] == [None, 1, 3, 20]


def test_compute_and_plot_end_to_end(sandbox: Path) -> None:
    accuracy.compute("quick", data_loader=_tiny_data, config=TINY)
    data = json.loads((sandbox / f"{accuracy.STEM}.json").read_text())
    rows = data["rows"]
    # 2 methods x 2 seeds x (4 steps / eval every 2) evaluations
    assert len(rows) == 8
    assert {row["method"] for row in rows} == {"DP-SGD", "DP-SGD-JL r=2"}
    summary = data["summary"]
    for label, item in summary.items():
        finals = [r["test_accuracy"] for r in rows if r["method"] == label and r["step"] == 4]
        assert item["final_accuracy"]["min"] == min(finals)
        assert item["final_accuracy"]["max"] == max(finals)
        assert item["privacy"]["steps"] == 4
        assert (sandbox / item["privacy_statement"]).is_file()
    exact, jl = summary["DP-SGD"]["privacy"], summary["DP-SGD-JL r=2"]["privacy"]
    assert exact["run"]["accountant"] == "pld" and jl["run"]["accountant"] == "jl"
    # JL clipping can exceed C, so the JL accountant is never below the exact PLD.
    assert jl["run"]["lower"] >= exact["run"]["upper"]
    # the paper's schedule (2 epochs = 8 steps) costs more than the 4 steps run
    assert exact["paper_schedule"]["lower"] > exact["run"]["upper"]
    statement = json.loads((sandbox / summary["DP-SGD-JL r=2"]["privacy_statement"]).read_text())
    assert statement["jl"] is True and statement["run"]["jl_dimension"] == 2

    accuracy.plot()
    assert (sandbox / f"{accuracy.STEM}.png").stat().st_size > 10_000
    readme = (sandbox / "README.md").read_text()
    assert "old" not in readme and readme.endswith("end\n")
    assert "| DP-SGD-JL r=2 |" in readme and "quick: 4 steps" in readme


def test_readme_left_alone_without_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    assert not common.write_between_markers(readme, "<!-- a -->", "<!-- b -->", "table")
    assert readme.read_text() == "no markers here\n"
    assert not common.write_between_markers(tmp_path / "absent.md", "a", "b", "table")


class _InterruptedError(Exception):
    pass


def _run(
    trainer: accuracy.Trainable, test: tuple[torch.Tensor, torch.Tensor], stem: Path | None
) -> dict[str, Any]:
    return accuracy.run_training(
        trainer,
        test,
        steps=TINY.steps,
        eval_every=TINY.eval_every,
        per_epoch=accuracy.steps_per_epoch(TINY),
        fingerprint={"config": dataclasses.asdict(TINY), "method": "jl", "seed": 0},
        checkpoint=stem,
        row={"method": "jl"},
    )


def test_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    x, y, x_test, y_test = _tiny_data(TINY)
    reference_trainer = accuracy.make_trainer(TINY, 2, 0, x, y)
    reference = _run(reference_trainer, (x_test, y_test), None)
    assert [row["epoch"] for row in reference["rows"]] == [0.5, 1.0]  # 4 lots per epoch

    interrupted = accuracy.make_trainer(TINY, 2, 0, x, y)
    original_step = interrupted.step

    def failing_step() -> object:
        if interrupted.steps_done == 3:
            raise _InterruptedError
        return original_step()

    interrupted.step = failing_step  # type: ignore[method-assign,assignment]
    stem = tmp_path / "jl_seed0"
    with pytest.raises(_InterruptedError):
        _run(interrupted, (x_test, y_test), stem)
    assert not json.loads(stem.with_suffix(".json").read_text())["done"]

    resumed = accuracy.make_trainer(TINY, 2, 0, x, y)
    result = _run(resumed, (x_test, y_test), stem)
    assert resumed.steps_done == 4
    assert result["rows"] == reference["rows"]
    for a, b in zip(resumed.model.parameters(), reference_trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)

    # a finished run is read back (with its final state), not retrained
    again = accuracy.make_trainer(TINY, 2, 0, x, y)
    again.step = failing_step  # type: ignore[method-assign,assignment]  # any step now raises
    assert _run(again, (x_test, y_test), stem)["rows"] == reference["rows"]
    assert again.steps_done == 4
    # a different configuration does not reuse the checkpoint
    other = accuracy.make_trainer(TINY, 2, 0, x, y)
    result = accuracy.run_training(
        other,
        (x_test, y_test),
        steps=2,
        eval_every=2,
        per_epoch=4,
        fingerprint={"config": "other"},
        checkpoint=stem,
    )
    assert other.steps_done == 2 and len(result["rows"]) == 1


def test_interval_formatting_and_cpu_settings() -> None:
    assert accuracy.fmt_interval({"lower": 457.2, "upper": None}) == "[457, inf]"
    assert accuracy.fmt_interval({"lower": 0.21746, "upper": 0.21795}) == "[0.217, 0.218]"
    assert accuracy.fmt_interval({"lower": 2.0001, "upper": 2.0002}) == "2"
    before = torch.get_num_threads()
    with accuracy.cpu_settings(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
