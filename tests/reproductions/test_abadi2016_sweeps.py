"""Fig. 5-style parameter sweeps of the Abadi et al. 2016 reproduction, on generated data."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from dpcore.accountants import MomentsAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import ComposedEvent, GaussianEvent, dpsgd_event
from reproductions.abadi2016 import mnist_core, sweeps
from reproductions.abadi2016.sweeps import SweepConfig
from reproductions.harness import ROOT, Output
from tests.reproductions.mnist_images import patterned_digits

TINY = SweepConfig(
    profile="test",
    reference_pca=4,
    reference_hidden=8,
    reference_lot=20,
    pca_dims=(0, 2, 4),
    hidden_units=(4, 8),
    lot_sizes=(10, 20, 40),
    random_projection=True,
    epochs=1,
)


_fake_mnist = patterned_digits(5, 200, 50)


@pytest.fixture(autouse=True)
def _generated_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mnist_core, "load_mnist", _fake_mnist)


def test_points_share_the_reference_model() -> None:
    result = sweeps.run(TINY)
    rows = result["rows"]
    assert [(row["axis"], row["value"]) for row in rows] == [
        ("pca", 0),
        ("pca", 2),
        ("pca", 4),
        ("hidden", 4),
        ("hidden", 8),
        ("lot", 10),
        ("lot", 20),
        ("lot", 40),
        ("random", 4),
    ]
    # The reference (PCA 4, 8 hidden, lot 20) appears on every axis but is trained once.
    reference = [row for row in rows if row["run"] == "dp_pca4_h8_l20"]
    assert len(reference) == 3 and len({row["test_accuracy"] for row in reference}) == 1
    assert len(result["statements"]) == 7
    # One epoch each: N / L steps (200 / 10 = 20 for the smallest lot).
    by_point = {(row["axis"], row["value"]): row for row in rows}
    assert by_point[("lot", 10)]["steps"] == 20 and by_point[("lot", 40)]["steps"] == 5
    # No projection and the random one release nothing but the training steps.
    no_pca = by_point[("pca", 0)]
    training = dpsgd_event(sampling_probability=0.1, noise_multiplier=4.0, steps=10)
    alone = MomentsAccountant().compose(training).get_epsilon(1e-5)
    assert no_pca["epsilon_moments_with_pca"] == pytest.approx(alone)
    assert by_point[("random", 4)]["epsilon_moments_with_pca"] == pytest.approx(alone)
    with_pca = MomentsAccountant().compose(ComposedEvent([GaussianEvent(7.0), training]))
    assert by_point[("pca", 2)]["epsilon_moments_with_pca"] == pytest.approx(
        with_pca.get_epsilon(1e-5)
    )
    assert result["statements"]["none_h8_l20"]["projection"] == "none"
    assert "dp_pca" in result["statements"]["dp_pca2_h8_l20"]


def test_budget_mode_trains_until_the_target_epsilon() -> None:
    config = SweepConfig(
        profile="test",
        reference_pca=4,
        reference_hidden=8,
        reference_lot=20,
        pca_dims=(4,),
        hidden_units=(),
        lot_sizes=(),
        epochs=None,
        noise_multiplier=1.0,
        pca_noise=20.0,
        target_epsilon=3.0,
    )
    row = sweeps.run(config)["rows"][0]
    assert row["epochs"] == row["steps"] / 10
    assert 0 < row["epsilon_moments_with_pca"] <= 3.0
    point = sweeps.point_config(config, "pca", 4)
    one_more = ComposedEvent(
        [
            GaussianEvent(20.0),
            dpsgd_event(sampling_probability=0.1, noise_multiplier=1.0, steps=row["steps"] + 1),
        ]
    )
    assert MomentsAccountant().compose(one_more).get_epsilon(1e-5) > 3.0
    assert point.projection == "dp_pca" and point.lot_size == 20


def test_point_config_rejects_unknown_axis() -> None:
    with pytest.raises(InvalidParameterError):
        sweeps.point_config(TINY, "depth", 2)


def _readme(tmp_path: Path) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{sweeps.TABLE_START}\nold\n{sweeps.TABLE_END}\nrest\n")
    return readme


def _evaluations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original: Callable[..., float] = mnist_core.evaluate

    def counting(*args: Any, **kwargs: Any) -> float:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(mnist_core, "evaluate", counting)
    return calls


def test_compute_and_plot_write_results_and_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = Output.under(tmp_path)
    config = dataclasses.replace(TINY, checkpoint=True)
    sweeps.compute(config=config, output=output)
    readme = _readme(tmp_path)
    sweeps.plot(output=output, readme=readme)
    saved = output.load_results("abadi2016_sweeps")
    assert len(saved["rows"]) == 9 and saved["config"]["epochs"] == 1
    assert {item["status"] for item in saved["summary"].values()} == {"done"}
    assert len(list(output.store("abadi2016_sweeps").iterdir())) == 7  # one run per model
    assert output.path("abadi2016_sweeps.png").stat().st_size > 0
    statements = json.loads(output.path("abadi2016_sweeps_privacy.json").read_text())
    assert statements["dp_pca4_h8_l20"]["run"]["noise_multiplier"] == 4.0
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    assert "NOT comparable" in text and "| lot size | 40 |" in text
    # Again: every run is read back from the run store, none trained or evaluated.
    calls = _evaluations(monkeypatch)
    sweeps.compute(config=config, output=output)
    assert calls == [] and output.load_results("abadi2016_sweeps")["rows"] == saved["rows"]


def test_deadline_saves_a_summary_that_says_it_stopped(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    sweeps.compute(config=TINY, output=output, deadline=0.0)
    saved = output.load_results("abadi2016_sweeps")
    assert len(saved["summary"]) == 7
    assert saved["summary"]["dp_pca4_h8_l20"]["status"] == "stopped at epoch 0 of 1 (deadline)"
    assert all(row["test_accuracy"] is None for row in saved["rows"])
    readme = _readme(tmp_path)
    sweeps.plot(output=output, readme=readme)
    assert "| lot size | 40 | 0, stopped at epoch 0 of 1 (deadline) | - | - |" in readme.read_text()


def test_plot_reads_the_committed_results(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    output.figures.mkdir(parents=True)
    shutil.copy(ROOT / "figures" / "abadi2016_sweeps.json", output.figures)
    readme = _readme(tmp_path)
    sweeps.plot(output=output, readme=readme)
    assert output.path("abadi2016_sweeps.png").stat().st_size > 10_000
    assert "| lot size | 1200 | 2 |" in readme.read_text()


class _Inline:
    """An executor that runs each call at once, here (``submit()`` returning a done future)."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future:
        self.calls += 1
        future: Future = Future()
        future.set_result(fn(*args))
        return future


def test_fanned_out_models_give_the_in_process_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(TINY, lot_sizes=(10, 20), pca_dims=(0, 4), random_projection=False)
    here, spread_out = Output.under(tmp_path / "here"), Output.under(tmp_path / "spread")
    sweeps.compute(config=config, output=here)
    inline = _Inline()
    sweeps.compute(config=config, output=spread_out, executor=inline)
    assert inline.calls == 4  # distinct models: no PCA, the reference, hidden 4, lot 10
    assert len(list(spread_out.store("abadi2016_sweeps").iterdir())) == 4

    def key(row: dict[str, Any]) -> tuple:
        return tuple(v for k, v in sorted(row.items()) if "wall" not in k and "second" not in k)

    ours = here.load_results("abadi2016_sweeps")["rows"]
    theirs = spread_out.load_results("abadi2016_sweeps")["rows"]
    assert [key(row) for row in ours] == [key(row) for row in theirs]
    # read back, never trained again
    calls = _evaluations(monkeypatch)
    sweeps.compute(config=config, output=spread_out, executor=_Inline())
    assert calls == []


class _Recorder:
    """An executor that records what it is given and trains nothing."""

    def __init__(self) -> None:
        self.jobs: list[sweeps.PointJob] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future:
        self.jobs.extend(args)
        future: Future = Future()
        future.set_result({"run": "-", "done": False})
        return future


def test_the_longest_runs_are_submitted_first(tmp_path: Path) -> None:
    config = dataclasses.replace(TINY, lot_sizes=(20, 40, 10), pca_dims=(), hidden_units=())
    recorder = _Recorder()
    sweeps.fan_out(config, recorder, store=tmp_path, fingerprint="f")
    axes = [(job.axis, job.value) for job in recorder.jobs]
    # lot 20 and the random projection (at the reference lot, 20) take equal steps: kept in order
    assert axes == [("lot", 10), ("lot", 20), ("random", 4), ("lot", 40)]


def test_the_saved_hardware_is_this_process_unless_given(tmp_path: Path) -> None:
    config = dataclasses.replace(TINY, pca_dims=(), hidden_units=(), lot_sizes=(20,))
    here = Output.under(tmp_path / "here")
    sweeps.compute(config=config, output=here)
    assert here.load_results("abadi2016_sweeps")["hardware"].endswith(
        "CPU, one run after another, in this process"
    )
    told = Output.under(tmp_path / "told")
    sweeps.compute(config=config, output=told, hardware="a GPU, then a CPU")
    assert told.load_results("abadi2016_sweeps")["hardware"] == "a GPU, then a CPU"
    with pytest.raises(InvalidParameterError, match="hardware"):
        sweeps.compute(config=config, output=Output.under(tmp_path / "x"), hardware=" ")
    assert not (tmp_path / "x").exists()


def test_a_bad_executor_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="executor"):
        sweeps.compute(config=TINY, output=Output.under(tmp_path), executor="threads:2")
    assert not tmp_path.joinpath("runs").exists() and not tmp_path.joinpath("figures").exists()
