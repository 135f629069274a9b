"""Fig. 1-style IMDb summary of Bu et al. 2021, on generated token sequences (no real data)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import dpcore.data.text
from dpcore.errors import InvalidParameterError
from dpcore.torch.models import IMDbLSTM, imdb_lstm
from reproductions.bu2021_jl import summary, summary_setup
from reproductions.bu2021_jl.summary import SummaryConfig
from reproductions.harness import NonPrivateTrainer, Output

#: 96 short reviews, lots of 24, 2 steps; JL with r = 2; a tiny LSTM (see ``small_model``).
TINY = SummaryConfig(
    jl_dimensions=(2,),
    steps=2,
    eval_every=1,
    paper_epochs=1,
    dataset_size=96,
    lot_size=24,
    test_size=None,
    jl_bins=8,
)


def _reviews(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    tokens = torch.randint(2, 40, (n, 6), generator=generator)
    tokens[:, -1] = 40 + labels  # the last token gives the sentiment away
    return tokens, labels.float()


def _tiny_data(config: SummaryConfig) -> summary.Data:
    return (*_reviews(config.dataset_size, 0), *_reviews(40, 1))


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A README with the table's markers in ``tmp_path``; a small LSTM instead of the paper's."""

    def small_model(recurrent: str = "dplstm") -> IMDbLSTM:
        return imdb_lstm(50, 8, 8, recurrent=recurrent)  # type: ignore[arg-type]

    monkeypatch.setattr(summary_setup, "imdb_lstm", small_model)
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- summary-table:start -->\n<!-- summary-table:end -->\nz\n")
    return tmp_path


def _fake_speed(folder: Path) -> None:
    """A speed file as Table 2's module writes it, with a TF Privacy row to be ignored."""
    rows = [
        {"method": "nonprivate", "r": None, "seconds_per_epoch": 10.0,
         "ratio_to_nonprivate": 1.0, "extrapolated": True, "source": "dpcore"},
        {"method": "dp_adam_exact", "r": None, "seconds_per_epoch": 15.0,
         "ratio_to_nonprivate": 1.5, "extrapolated": False, "source": "dpcore"},
        {"method": "tf_privacy_vanilla", "r": None, "seconds_per_epoch": 9999.0,
         "ratio_to_nonprivate": 999.0, "extrapolated": True, "source": "tf_privacy"},
    ]  # fmt: skip
    Output.under(folder).save_results(summary.SPEED_STEM, config={"profile": "full"}, rows=rows)


def test_end_to_end_with_speed_file(sandbox: Path) -> None:
    output = Output.under(sandbox)
    summary.compute("quick", data_loader=_tiny_data, config=TINY, output=output)
    data = output.load_results(summary.STEM)
    rows = {row["method"]: row for row in data["rows"]}
    assert list(rows) == ["Adam (non-private)", "DP-Adam (exact)", "DP-Adam-JL r=2"]
    assert all(row["step"] == 2 and 0 <= row["test_accuracy"] <= 1 for row in rows.values())
    assert rows["Adam (non-private)"]["privacy"] is None
    exact, jl = rows["DP-Adam (exact)"]["privacy"], rows["DP-Adam-JL r=2"]["privacy"]
    assert exact["run"]["accountant"] == "pld" and jl["run"]["accountant"] == "jl"
    assert jl["run"]["lower"] >= exact["run"]["upper"]
    # the paper's schedule: round(1 epoch x 96 / 24) = 4 steps, more than the 2 run
    assert exact["paper_steps"] == 4
    assert exact["paper_schedule"]["lower"] > exact["run"]["upper"]
    assert output.path(rows["DP-Adam-JL r=2"]["privacy_statement"]).is_file()
    assert {row["status"] for row in rows.values()} == {"done"}

    _fake_speed(sandbox)
    summary.plot(output=output, readme=sandbox / "README.md")
    assert output.path(f"{summary.STEM}.png").stat().st_size > 10_000
    table = (sandbox / "README.md").read_text()
    assert table.startswith("a\n<!-- summary-table:start -->\nProfile **quick: 2 steps")
    assert "| Adam (non-private) |" in table and "| 10 (extrapolated) | 1 |" in table
    assert "| 15 | 1.5 |" in table  # exact DP-Adam, read from the speed file
    assert "9999" not in table  # TF Privacy's rows are not ours
    assert "| DP-Adam-JL r=2 |" in table and "| not timed | - |" in table
    assert "full profile" in table and summary.SPEED_MISSING not in table


def test_missing_speed_file(sandbox: Path) -> None:
    config = dataclasses.replace(TINY, jl_dimensions=())
    output = Output.under(sandbox)
    summary.compute("quick", data_loader=_tiny_data, config=config, output=output)
    assert summary.speed_rows(output) is None
    summary.plot(output=output, readme=sandbox / "README.md")
    assert output.path(f"{summary.STEM}.png").is_file()
    table = (sandbox / "README.md").read_text()
    assert f"Seconds per epoch: {summary.SPEED_MISSING}." in table
    assert "| DP-Adam (exact) |" in table and "| - | - |" in table


def test_a_deadline_leaves_rows_that_say_how_far_each_method_got(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped and never-started methods stay in the results, table and figure (no gaps)."""
    import itertools
    import types

    import reproductions.harness.training as harness_training

    ticks = itertools.count()  # a clock that advances one second per deadline check
    clock = types.SimpleNamespace(time=lambda: float(next(ticks)), perf_counter=lambda: 0.0)
    monkeypatch.setattr(harness_training, "time", clock)
    output = Output.under(sandbox)
    # checks at 0, 1 (Adam: 2 steps, done), 2 (DP-Adam: 1 step), 3 >= 2.5: stop; JL: 4, none
    summary.compute("quick", data_loader=_tiny_data, config=TINY, output=output, deadline=2.5)
    rows = {row["method"]: row for row in output.load_results(summary.STEM)["rows"]}
    assert rows["Adam (non-private)"]["status"] == "done"
    stopped, missing = rows["DP-Adam (exact)"], rows["DP-Adam-JL r=2"]
    assert stopped["status"] == "stopped at step 1 of 2 (deadline)" and stopped["step"] == 1
    assert stopped["privacy"]["steps"] == 1  # epsilon of the step it ran, not of the plan
    assert missing["status"].startswith("not started") and "test_accuracy" not in missing
    _fake_speed(sandbox)
    summary.plot(output=output, readme=sandbox / "README.md")
    table = (sandbox / "README.md").read_text()
    assert "(stopped at step 1 of 2 (deadline))" in table and "(after step 1)" in table
    assert "| DP-Adam-JL r=2 | not started (the deadline came first) | - |" in table


def test_nonprivate_resume_is_exact(tmp_path: Path) -> None:
    x, y = _reviews(50, 0)
    torch.manual_seed(0)
    model = imdb_lstm(50, 8, 8, recurrent="lstm")
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    def fresh() -> NonPrivateTrainer:
        model.load_state_dict(initial)
        return NonPrivateTrainer(
            model,
            x,
            y,
            optimizer=lambda params: torch.optim.Adam(params, lr=1e-2),
            loss_fn=torch.nn.BCEWithLogitsLoss(),
            batch_size=16,
            seed=3,
        )

    straight = fresh()
    losses = [straight.step() for _ in range(5)]  # 3 lots per pass: crosses a reshuffle
    final = {k: v.clone() for k, v in model.state_dict().items()}
    first = fresh()
    for _ in range(2):
        first.step()
    first.save_checkpoint(tmp_path / "np.pt")
    resumed = fresh()
    resumed.load_checkpoint(tmp_path / "np.pt")
    assert resumed.steps_done == 2
    assert [resumed.step() for _ in range(3)] == losses[2:]
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, final[key])


def test_test_subset_is_random_not_a_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    sorted_labels = np.repeat([0, 1], 50)  # like the real test split: negatives first

    def fake_sequences(length: int) -> tuple[np.ndarray, ...]:
        assert length == 3  # the config's sequence_length is passed on
        ids = np.arange(100 * 3).reshape(100, 3)
        return ids, sorted_labels, ids, sorted_labels

    monkeypatch.setattr(dpcore.data.text, "imdb_sequences", fake_sequences)
    tiny = dataclasses.replace(TINY, test_size=20, sequence_length=3)
    _, y_train, x_test, y_test = summary.load_data(tiny)
    assert len(y_train) == 100 and x_test.shape == (20, 3) and y_test.dtype == torch.float32
    assert 0 < float(y_test.mean()) < 1  # both classes, unlike the first 20
    again = summary.load_data(tiny)[2]
    assert torch.equal(x_test, again)


def test_profiles() -> None:
    full = summary.PROFILES["full"]
    assert [r for _, _, r in summary.methods(full)] == [None, None, 1, 5, 10, 30]
    assert full.steps == 1953  # round(20 epochs x 25,000 / 256)
    assert summary.PROFILES["quick"].jl_dimensions == (1,)


def test_runs_of_earlier_code_are_reported_only_when_asked(sandbox: Path) -> None:
    """``Output.runs_code`` reads runs stored under another code fingerprint (``--runs-code``)."""
    import time

    from reproductions.__main__ import main

    config = dataclasses.replace(TINY, checkpoint=True)
    output = Output.under(sandbox)
    summary.compute("quick", data_loader=_tiny_data, config=config, output=output)
    current = output.code(*summary.CODE_MODULES)
    earlier = "0123456789abcdef"  # as if an earlier commit had trained these runs
    folders = sorted(output.store(summary.STEM).iterdir())
    assert len(folders) == 3 and all(f.name.endswith(f"-{current}") for f in folders)
    for folder in folders:
        state = folder / "state.json"
        state.write_text(state.read_text().replace(current, earlier))
        folder.rename(folder.with_name(folder.name.replace(current, earlier)))
    past = time.time() - 1  # nothing may train: rows can only be read back

    summary.compute("quick", data_loader=_tiny_data, config=config, output=output, deadline=past)
    statuses = {row["status"] for row in output.load_results(summary.STEM)["rows"]}
    assert statuses == {"not started (the deadline came first)"}

    again = dataclasses.replace(output, runs_code=earlier)
    summary.compute("quick", data_loader=_tiny_data, config=config, output=again, deadline=past)
    data = again.load_results(summary.STEM)
    assert {row["status"] for row in data["rows"]} == {"done"}
    assert all(row["step"] == 2 for row in data["rows"])
    assert data["code_fingerprint"] == earlier and data["reporting_code_fingerprint"] == current

    with pytest.raises(InvalidParameterError, match="runs_code"):
        Output(runs_code="not-a-fingerprint").code("reproductions.harness")
    with pytest.raises(SystemExit):  # Abadi's Fig. 2 keeps no run store
        main(["--only", "abadi2016_fig2", "--runs-code", earlier])


def test_run_spec_names_the_review_length_only_when_not_the_papers() -> None:
    """Runs stored before ``sequence_length`` existed (all at 150 tokens) keep their key."""
    full, quick = summary.PROFILES["full"], summary.PROFILES["quick"]
    assert full.sequence_length == 150 and quick.sequence_length < 150
    assert "sequence_length" not in summary._run_spec(full, "dp_adam_exact", None)
    assert summary._run_spec(quick, "dp_adam_exact", None)["sequence_length"] == 50


def _untimed(rows: list[dict]) -> list[dict]:
    timed = ("wall_s", "train_seconds_per_step")
    return [{k: v for k, v in row.items() if k not in timed} for row in rows]


def test_methods_fanned_out_on_threads_give_the_in_process_results(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The methods trained at once on a thread pool, into the run store, give the rows of the
    methods trained here one after another; run again on the same store, nothing trains."""
    from concurrent.futures import ThreadPoolExecutor

    from dpcore.torch.training import DPTrainer

    here, threads = Output.under(sandbox / "here"), Output.under(sandbox / "threads")
    summary.compute("quick", data_loader=_tiny_data, config=TINY, output=here)
    assert not here.runs.exists()  # in process, the quick profile keeps no run store
    with ThreadPoolExecutor(2) as pool:
        summary.compute("quick", data_loader=_tiny_data, config=TINY, output=threads, executor=pool)
    ours, theirs = here.load_results(summary.STEM), threads.load_results(summary.STEM)
    assert _untimed(ours["rows"]) == _untimed(theirs["rows"]) and len(ours["rows"]) == 3
    assert all(row["status"] == "done" for row in theirs["rows"])
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert ours["runs_spread"] == "one run after another, in this process"
    assert len(list(threads.store(summary.STEM).iterdir())) == len(summary.methods(TINY))

    def refuse(self: object) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(DPTrainer, "step", refuse)
    monkeypatch.setattr(NonPrivateTrainer, "step", refuse)
    with ThreadPoolExecutor(2) as pool:
        summary.compute("quick", data_loader=_tiny_data, config=TINY, output=threads, executor=pool)
    assert threads.load_results(summary.STEM)["rows"] == theirs["rows"]
    with pytest.raises(InvalidParameterError, match="executor"):
        summary.compute("quick", data_loader=_tiny_data, config=TINY, executor="threads:2")
