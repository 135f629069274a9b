"""Fig. 4 reproduction of Bu et al. 2021 (MNIST accuracy vs epochs), on generated images."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from dpcore.errors import InvalidParameterError
from dpcore.runs.markers import write_between_markers
from reproductions.bu2021_jl import accuracy
from reproductions.bu2021_jl.accuracy import AccuracyConfig
from reproductions.harness import Output, cpu_settings

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
def sandbox(tmp_path: Path) -> Path:
    """A README with the table's markers in ``tmp_path``; figures go to ``tmp_path/figures``."""
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- accuracy-table:start -->\nold\n<!-- accuracy-table:end -->\nend\n")
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
    assert full.steps == 60 * 234 and len(full.seeds) >= 5 and full.checkpoint
    assert [r for _, r in accuracy.methods(full)] == [None, 1, 3, 20]


def test_compute_and_plot_end_to_end(sandbox: Path) -> None:
    output = Output.under(sandbox)
    accuracy.compute("quick", data_loader=_tiny_data, config=TINY, output=output)
    data = output.load_results(accuracy.STEM)
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
        assert output.path(item["privacy_statement"]).is_file()
        assert item["seeds_done"] == [0, 1] and item["unfinished"] == {}
    exact, jl = summary["DP-SGD"]["privacy"], summary["DP-SGD-JL r=2"]["privacy"]
    assert exact["run"]["accountant"] == "pld" and jl["run"]["accountant"] == "jl"
    # JL clipping can exceed C, so the JL accountant is never below the exact PLD.
    assert jl["run"]["lower"] >= exact["run"]["upper"]
    # the paper's schedule (2 epochs = 8 steps) costs more than the 4 steps run
    assert exact["paper_schedule"]["lower"] > exact["run"]["upper"]
    statement = json.loads(output.path(summary["DP-SGD-JL r=2"]["privacy_statement"]).read_text())
    assert statement["jl"] is True and statement["run"]["jl_dimension"] == 2

    accuracy.plot(output=output, readme=sandbox / "README.md")
    assert output.path(f"{accuracy.STEM}.png").stat().st_size > 10_000
    readme = (sandbox / "README.md").read_text()
    assert "old" not in readme and readme.endswith("end\n")
    assert "| DP-SGD-JL r=2 |" in readme and "quick: 4 steps" in readme


def test_readme_left_alone_without_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    assert not write_between_markers(readme, "<!-- a -->", "<!-- b -->", "table")
    assert readme.read_text() == "no markers here\n"
    assert not write_between_markers(tmp_path / "absent.md", "a", "b", "table")


def test_full_profile_stopped_by_a_deadline_says_so_and_resumes(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    full = dataclasses.replace(TINY, profile="full", checkpoint=True)
    accuracy.compute("full", data_loader=_tiny_data, config=full, output=output, deadline=0.0)
    stem = accuracy.results_stem("full")
    assert stem == "bu2021_jl_accuracy_full"
    stopped = output.load_results(stem)["summary"]["DP-SGD"]
    assert stopped["final_accuracy"] is None and stopped["seeds_done"] == []
    assert stopped["unfinished"] == {"0": 0, "1": 0}
    accuracy.compute("full", data_loader=_tiny_data, config=full, output=output)
    finished = output.load_results(stem)["summary"]["DP-SGD"]
    assert finished["seeds_done"] == [0, 1] and finished["final_accuracy"]["n"] == 2
    readme = tmp_path / "README.md"
    readme.write_text("<!-- accuracy-table-full:start -->\n<!-- accuracy-table-full:end -->\n")
    accuracy.plot(output=output, readme=readme)
    assert "2 seed(s) done" in readme.read_text()


def test_interval_formatting_and_cpu_settings() -> None:
    assert accuracy.fmt_interval({"lower": 457.2, "upper": None}) == "[457, inf]"
    assert accuracy.fmt_interval({"lower": 0.21746, "upper": 0.21795}) == "[0.217, 0.218]"
    assert accuracy.fmt_interval({"lower": 2.0001, "upper": 2.0002}) == "2"
    before = torch.get_num_threads()
    with cpu_settings(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_runs_go_in_the_order_of_the_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int | None, int]] = []
    original = accuracy.execute

    def recording(config: AccuracyConfig, label: str, r: int | None, seed: int, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((r, seed))
        return original(config, label, r, seed, *args, **kwargs)

    monkeypatch.setattr(accuracy, "execute", recording)
    config = dataclasses.replace(TINY, jl_dimensions=(3, 2))
    accuracy.compute("quick", data_loader=_tiny_data, config=config, output=Output.under(tmp_path))
    # DP-SGD with JL(3) seed by seed first; r = 2 is in no phase, so it goes last
    assert calls == [(None, 0), (3, 0), (None, 1), (3, 1), (2, 0), (2, 1)]
    summary = Output.under(tmp_path).load_results(accuracy.STEM)["summary"]
    assert all(item["seeds_done"] == [0, 1] for item in summary.values())


def test_interleaved_rounds_give_the_sequential_results(tmp_path: Path) -> None:
    sequential = dataclasses.replace(TINY, checkpoint=True)
    interleaved = dataclasses.replace(sequential, interleave=True)
    results = {}
    for name, config in (("seq", sequential), ("inter", interleaved)):
        output = Output.under(tmp_path / name)
        accuracy.compute("quick", data_loader=_tiny_data, config=config, output=output)
        results[name] = output.load_results(accuracy.STEM)

    def key(row: dict) -> tuple:
        return (row["method"], row["seed"], row["step"])

    seq = {key(row): row["test_accuracy"] for row in results["seq"]["rows"]}
    inter = {key(row): row["test_accuracy"] for row in results["inter"]["rows"]}
    assert seq == inter and len(seq) == 8
    assert results["inter"]["common_epoch"] == results["seq"]["common_epoch"] == 1.0
    for label, item in results["inter"]["summary"].items():
        assert (
            item["accuracy_at_common_epoch"] == results["seq"]["summary"][label]["final_accuracy"]
        )


def test_interleaved_stop_leaves_every_run_at_the_same_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The clock passes the deadline after the first round: the second round never starts.
    config = dataclasses.replace(TINY, profile="full", checkpoint=True, interleave=True)
    rounds: list[int] = []
    original = accuracy.execute

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("until"):
            rounds.append(kwargs["until"])
        return original(*args, **kwargs)

    monkeypatch.setattr(accuracy, "execute", counting)
    calls = iter(range(10**6))
    monkeypatch.setattr(accuracy.time, "time", lambda: 0.0 if next(calls) == 0 else 1e9)
    output = Output.under(tmp_path)
    accuracy.compute("full", data_loader=_tiny_data, config=config, output=output, deadline=10.0)
    data = output.load_results(accuracy.results_stem("full"))
    assert set(rounds) == {2}  # one round, to step 2, for each of the 4 runs
    assert data["common_epoch"] == 0.5
    epochs = {row["epoch"] for row in data["rows"]}
    assert epochs == {0.5}
    for item in data["summary"].values():
        assert item["seeds_done"] == [] and item["unfinished"] == {"0": 0.5, "1": 0.5}
        assert item["accuracy_at_common_epoch"]["n"] == 2
    readme = tmp_path / "README.md"
    readme.write_text("<!-- accuracy-table-full:start -->\n<!-- accuracy-table-full:end -->\n")
    accuracy.plot(output=output, readme=readme)
    table = readme.read_text()
    assert "every run stopped at epoch 0.5 (deadline)" in table
    assert table.count("not finished; at epoch 0.5 (2 seeds): ") == 2
    assert output.path(f"{accuracy.results_stem('full')}.png").stat().st_size > 10_000
    # resumed without a deadline, the runs finish and match an uninterrupted sequential run
    accuracy.compute("full", data_loader=_tiny_data, config=config, output=output)
    resumed = output.load_results(accuracy.results_stem("full"))
    reference = Output.under(tmp_path / "ref")
    accuracy.compute(
        "full",
        data_loader=_tiny_data,
        config=dataclasses.replace(config, interleave=False),
        output=reference,
    )
    expected = reference.load_results(accuracy.results_stem("full"))
    assert [
        r["test_accuracy"]
        for r in sorted(resumed["rows"], key=lambda r: (r["method"], r["seed"], r["step"]))
    ] == [
        r["test_accuracy"]
        for r in sorted(expected["rows"], key=lambda r: (r["method"], r["seed"], r["step"]))
    ]


def test_fanned_out_runs_give_the_in_process_results(tmp_path: Path) -> None:
    """Runs trained in spawned worker processes (as on a GPU shared by many runs) equal the
    same runs trained here one after another, and the saved results name what trained them."""
    full = dataclasses.replace(TINY, profile="full", checkpoint=True, seeds=(0,))
    here, spread_out = Output.under(tmp_path / "here"), Output.under(tmp_path / "workers")
    accuracy.compute("full", data_loader=_tiny_data, config=full, output=here)
    reached = accuracy.fan_out(
        "full", executor="processes:2", data_loader=_tiny_data, config=full, output=spread_out
    )
    assert [(item["label"], item["done"]) for item in reached] == [
        (label, True) for label, _, _ in accuracy.run_order(full)
    ]
    accuracy.compute("full", data_loader=_tiny_data, config=full, output=spread_out, deadline=0.0)
    stem = accuracy.results_stem("full")
    ours, theirs = here.load_results(stem), spread_out.load_results(stem)

    def key(row: dict) -> tuple:
        return row["method"], row["seed"], row["step"], row["test_accuracy"]

    assert sorted(map(key, ours["rows"])) == sorted(map(key, theirs["rows"]))
    assert "CPU, torch" in theirs["hardware"] and "2 runs at once" in theirs["hardware"]
    assert ours["hardware"].endswith("CPU") and "runs at once" not in ours["hardware"]


class _Inline:
    """An executor that runs each call at once, here (``submit()`` returning a done future)."""

    def __init__(self) -> None:
        self.calls = 0

    def submit(self, fn: Any, /, *args: Any) -> Future:
        self.calls += 1
        future: Future = Future()
        future.set_result(fn(*args))
        return future


def test_the_quick_profile_fans_out_through_the_executor_option(tmp_path: Path) -> None:
    """``compute(executor=...)`` (``--executor``) on a profile that keeps no checkpoints trains
    every run through the executor into the run store and saves the in-process rows."""
    quick = dataclasses.replace(TINY, seeds=(0,))
    here, spread_out = Output.under(tmp_path / "here"), Output.under(tmp_path / "workers")
    accuracy.compute("quick", data_loader=_tiny_data, config=quick, output=here, executor="local")
    assert not here.runs.exists()  # in process, the quick profile keeps no run store
    inline = _Inline()
    accuracy.compute(
        "quick", data_loader=_tiny_data, config=quick, output=spread_out, executor=inline
    )
    stem = accuracy.results_stem("quick")
    ours, theirs = here.load_results(stem), spread_out.load_results(stem)

    def untimed(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in rows]

    assert untimed(ours["rows"]) == untimed(theirs["rows"]) and len(ours["rows"]) == 4
    assert {k: v["final_accuracy"] for k, v in ours["summary"].items()} == {
        k: v["final_accuracy"] for k, v in theirs["summary"].items()
    }
    runs = len(accuracy.run_order(quick))
    assert inline.calls == runs and len(list(spread_out.store(stem).iterdir())) == runs
    assert "fanned out" in theirs["hardware"]


def test_fan_out_refuses_an_executor_that_does_not_fan_out(tmp_path: Path) -> None:
    full = dataclasses.replace(TINY, profile="full", checkpoint=True)
    output = Output.under(tmp_path)
    for executor in ("processes:0", "local", "threads:2"):
        with pytest.raises(InvalidParameterError, match="executor"):
            accuracy.fan_out(
                "full", executor=executor, data_loader=_tiny_data, config=full, output=output
            )
    assert list(tmp_path.iterdir()) == []  # refused before anything ran or was written


def test_a_run_moved_between_machines_is_labelled_so(tmp_path: Path) -> None:
    """Some runs finished, others stopped; seconds per step are not quoted across machines."""
    output = Output.under(tmp_path)
    full = dataclasses.replace(TINY, profile="full", checkpoint=True, seeds=(0,))
    accuracy.compute("full", data_loader=_tiny_data, config=full, output=output)
    stem = accuracy.results_stem("full")
    data = output.load_results(stem)
    assert ", every run" not in accuracy.profile_label(data)
    assert "n/a (runs" not in accuracy.readme_table(data)
    data["summary"]["DP-SGD"]["unfinished"] = {"1": 1.5}
    data["common_epoch"] = 1.5
    data["hardware"] = "NVIDIA H100 (CUDA), 20 runs at once + 1 torch thread(s), CPU"
    assert "1 of 3 runs stopped by the deadline, every run reached epoch 1.5" in (
        accuracy.profile_label(data)
    )
    assert "n/a (runs moved between machines)" in accuracy.readme_table(data)
