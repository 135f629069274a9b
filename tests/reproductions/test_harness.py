"""The reproduction harness: run store, resumable training, non-private trainer, fan-out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.runs import RunStore
from reproductions.harness import (
    NonPrivateTrainer,
    Output,
    RunState,
    Trainable,
    TrainingSpec,
    evaluate,
    run_training,
)


def _trainer(seed: int = 0) -> NonPrivateTrainer:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(40, 3, generator=generator)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(seed)
    return NonPrivateTrainer(
        nn.Linear(3, 2),
        x,
        y,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=8,
        seed=seed,
    )


def _run(trainer: Trainable, state: RunState, steps: int = 12) -> RunState:
    model = trainer.model
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(9))
    return run_training(
        trainer,
        state,
        steps=steps,
        eval_every=5,
        per_epoch=5,
        measure=lambda t: {"test_accuracy": evaluate(model, x, (x[:, 0] > 0).long())},
        row={"method": "sgd"},
    )


class _KilledError(Exception):
    pass


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    spec = {"method": "sgd", "seed": 0}
    reference_trainer = _trainer()
    reference = _run(reference_trainer, RunState.open(None, spec, "code"))
    assert [row["step"] for row in reference.rows] == [5, 10, 12]  # the last interval is short
    assert [row["epoch"] for row in reference.rows] == [1.0, 2.0, 2.4]

    killed = _trainer()
    original = killed.step

    def dies_at_step_seven() -> float:
        if killed.steps_done == 7:
            raise _KilledError
        return original()

    killed.step = dies_at_step_seven  # type: ignore[method-assign]
    with pytest.raises(_KilledError):
        _run(killed, RunState.open(tmp_path, spec, "code"))
    (folder,) = tmp_path.iterdir()
    assert folder == RunStore(tmp_path, "code").folder(TrainingSpec.of(spec))  # the store's folder
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-5.pt", "state.json"]

    resumed = _trainer()
    state = _run(resumed, RunState.open(tmp_path, spec, "code"))
    assert state.done and resumed.steps_done == 12
    strip = [{k: v for k, v in row.items() if k != "wall_s"} for row in state.rows]
    assert strip == [{k: v for k, v in row.items() if k != "wall_s"} for row in reference.rows]
    for a, b in zip(resumed.model.parameters(), reference_trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint-12.pt", "state.json"]

    # finished: read back with its weights, never retrained
    again = _trainer()
    again.step = dies_at_step_seven  # type: ignore[method-assign]
    assert _run(again, RunState.open(tmp_path, spec, "code")).rows == state.rows
    assert again.steps_done == 12
    # another code fingerprint or spec: a folder of its own, trained afresh
    assert RunState.open(tmp_path, spec, "other").rows == []
    assert RunState.open(tmp_path, {**spec, "seed": 1}, "code").rows == []


def test_unreadable_or_orphaned_state_starts_over(tmp_path: Path) -> None:
    spec = {"seed": 0}
    state = RunState.open(tmp_path, spec, "c")
    state.rows = [{"step": 1}]
    state.commit(lambda path: torch.save({}, path), tag=1)
    assert RunState.open(tmp_path, spec, "c").rows == [{"step": 1}]
    saved = RunStore(tmp_path, "c").read_checkpoint(TrainingSpec.of(spec), "state.json")
    assert saved is not None and json.loads(saved)["checkpoint"] == "checkpoint-1.pt"
    assert state.fresh().rows == [] and state.fresh().folder == state.folder
    assert state.folder is not None
    (state.folder / "checkpoint-1.pt").unlink()  # rows without their weights
    assert RunState.open(tmp_path, spec, "c").rows == []
    (state.folder / "state.json").write_text("{not json")
    assert RunState.open(tmp_path, spec, "c").rows == []


def test_deadline_stops_at_a_commit(tmp_path: Path) -> None:
    trainer = _trainer()
    state = run_training(
        trainer,
        RunState.open(tmp_path, {"s": 1}, "c"),
        steps=12,
        eval_every=5,
        per_epoch=5,
        measure=lambda t: {},
        deadline=0.0,
    )
    assert not state.done and state.rows == [] and trainer.steps_done == 0


def test_bad_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="steps"):
        _run(_trainer(), RunState.open(None, {}, "c"), steps=0)
    with pytest.raises(InvalidParameterError, match="batch_size"):
        NonPrivateTrainer(
            nn.Linear(1, 1),
            torch.zeros(3, 1),
            torch.zeros(3),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            loss_fn=nn.MSELoss(),
            batch_size=4,
            seed=0,
        )
    with pytest.raises(InvalidParameterError, match="metric"):
        evaluate(nn.Linear(1, 2), torch.zeros(2, 1), torch.zeros(2), metric="auc")


def test_non_private_trainer_drops_the_partial_batch_and_reshuffles() -> None:
    trainer = _trainer()
    assert trainer.steps_per_epoch == 5
    seen: list[int] = []
    for _ in range(5):
        trainer.step()
        seen += trainer.order[trainer.position - 8 : trainer.position].tolist()
    assert sorted(seen) == list(range(40))  # one pass, every example once


def test_output_writes_json_and_csv_with_every_column(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    output.save_results("x", config={"a": 1}, rows=[{"p": 1}, {"p": 2, "q": 3}])
    assert output.load_results("x")["config"] == {"a": 1} and output.has_results("x")
    assert (tmp_path / "figures" / "x.csv").read_text().splitlines() == ["p,q", "1,", "2,3"]
    assert "commit" in json.loads((tmp_path / "figures" / "x.json").read_text())


def test_every_save_of_a_run_records_the_commit_it_started_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first save rewrites tracked files; later saves must not read the checkout as dirty."""
    # the globals Output's methods run with (a doctest run may have imported output.py twice)
    namespace = Output.save_results.__globals__
    states = iter(["abc123", "abc123-dirty", "abc123-dirty"])
    monkeypatch.setitem(namespace, "git_commit", lambda root=None: next(states))
    run_commit = namespace["run_commit"]
    run_commit.cache_clear()
    try:
        output = Output.under(tmp_path)
        for stem in ("a", "b"):
            output.save_results(stem, config={}, rows=[{"p": 1}])
            assert output.load_results(stem)["commit"] == "abc123"
        # re-saving loaded results keeps the commit they were made by
        output.save_results("c", config={}, rows=[{"p": 1}], extra={"commit": "old456"})
        assert output.load_results("c")["commit"] == "old456"
    finally:
        run_commit.cache_clear()
