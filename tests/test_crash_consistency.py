"""SIGKILL at random moments while dpcore writes its files: every file is afterwards absent, the
old version or the new one complete (it parses and validates), never half; the next write to a
target removes the temporaries the killed writers left; and a trainer killed at a random step
resumes from its last checkpoint to exactly the uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dpcore.ledger
from audits import results_io
from dpcore.accountants import accountant_class
from dpcore.events import GaussianEvent
from dpcore.ledger import PrivacyLedger, write_statement
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer

KILLS_PER_KIND = 6
PADDING = "x" * 1_000_000  # a write that takes a while, so that some kills land inside one


def _trainer() -> DPTrainer:
    torch.manual_seed(0)
    inputs = torch.randn(64, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = nn.Sequential(nn.Linear(4, 256), nn.Tanh(), nn.Linear(256, 2)).double()
    return DPTrainer.dp_sgd(
        model,
        lr=0.1,
        inputs=inputs,
        targets=(inputs[:, 0] > 0).long(),
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=PoissonSampler(64, sampling_probability=0.25, seed=3),
        engine="fast",
        seed=11,
    )


class _Kind:
    """One kind of file: ``write(version)`` writes version ``version``; ``read`` returns the
    version on disk after validating it (raising on a half or damaged file)."""

    def __init__(self, path: Path, write: Callable[[int], None], read: Callable[[], int]) -> None:
        self.path, self.write, self.read = path, write, read


def _kinds(folder: Path) -> dict[str, _Kind]:
    ledger = PrivacyLedger(dataset_size=100)
    ledger.record(sampling_probability=0.01, noise_multiplier=1.0)
    statement = ledger.statement(delta=1e-5, accountants=("rdp",), padding=PADDING, version=0)
    statement_path = folder / "statement.json"

    def write_statement_version(version: int) -> None:  # the writing dominates the loop
        statement["run"]["version"] = version
        write_statement(statement_path, statement)

    def read_statement() -> int:
        saved = json.loads(statement_path.read_text())
        assert saved["run"]["padding"] == PADDING and saved["steps"] == 1
        assert saved["epsilon"]["rdp"]["epsilon"] > 0
        return int(saved["run"]["version"]) + 1

    accountant = accountant_class("rdp")()
    accountant_path = folder / "rdp.json"

    def write_accountant(version: int) -> None:
        accountant.compose(GaussianEvent(float(version + 1)))
        accountant.save(accountant_path)

    def read_accountant() -> int:
        loaded = accountant_class("rdp").load(accountant_path)
        history = loaded.history
        assert [event.noise_multiplier for event, _ in history] == [  # type: ignore[attr-defined]
            float(i + 1) for i in range(len(history))
        ]
        return len(history)

    trainer = _trainer()
    first = trainer.model[0].weight.detach().clone()  # type: ignore[index]
    checkpoint_path = folder / "checkpoint.pt"

    def write_checkpoint(version: int) -> None:
        trainer.sampler.sample()  # the ledger's next lot stays the sampler's (tiny tensors)
        trainer.ledger.record(sampling_probability=0.25, noise_multiplier=1.0)
        with torch.no_grad():
            trainer.model[0].weight.add_(1.0)  # type: ignore[index]
        trainer.save_checkpoint(checkpoint_path)

    reader = _trainer()

    def read_checkpoint() -> int:
        reader.load_checkpoint(checkpoint_path)  # integrity digest and validation
        steps = reader.steps_done
        shift = reader.model[0].weight.detach() - first  # type: ignore[index]
        assert torch.equal(shift, torch.full_like(shift, float(steps)))
        return steps

    results_path = results_io.RESULTS / "crash.json"

    def write_results(version: int) -> None:
        results_io.save("crash", [{"version": version, "padding": PADDING}], {"v": version})

    def read_results() -> int:
        rows = results_io.load("crash")
        assert rows[0]["padding"] == PADDING
        meta = results_io.RESULTS / "crash.meta.json"  # written second: absent after an early kill
        if meta.exists():
            assert json.loads(meta.read_text())["config"]["v"] >= 0
        return int(rows[0]["version"]) + 1

    return {
        "statement": _Kind(statement_path, write_statement_version, read_statement),
        "accountant": _Kind(accountant_path, write_accountant, read_accountant),
        "checkpoint": _Kind(checkpoint_path, write_checkpoint, read_checkpoint),
        "results": _Kind(results_path, write_results, read_results),
    }


def _write_until_killed(kind: _Kind, rng: random.Random) -> None:
    """Fork a child that writes new versions until killed; SIGKILL it a random few ms after its
    first complete write (so that the kill lands in a later write or between two)."""
    readable, writable = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        pid = os.fork()
    if pid == 0:  # the child: write forever, never return into pytest
        try:
            os.close(readable)
            version = 0
            while True:
                kind.write(version)
                version += 1
                if version == 1:
                    os.write(writable, b"1")
        finally:
            os._exit(1)
    os.close(writable)
    try:
        assert os.read(readable, 1) == b"1", "the writer died before its first write"
        time.sleep(rng.uniform(0.0, 0.02))
    finally:
        os.close(readable)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _temporaries(path: Path) -> list[str]:
    """Temporary files in ``path``'s folder (the kinds run one after another)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.endswith(".part"))


def test_files_killed_mid_write_are_old_or_new_and_leave_no_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dpcore.ledger, "git_commit", lambda: "test")  # no git per write
    monkeypatch.setattr(results_io, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(results_io, "provenance", lambda **extra: {"config": extra["config"]})
    rng = random.Random(20261128)
    kinds = _kinds(tmp_path)
    kills, left_behind = 0, 0
    for name, kind in kinds.items():
        for _ in range(KILLS_PER_KIND):
            _write_until_killed(kind, rng)
            kills += 1
            assert kind.read() >= 1, name  # parses and validates: a complete version
            left_behind += len(_temporaries(kind.path))
        kind.write(0)  # one more write: the killed writers' temporaries go
        assert _temporaries(kind.path) == [], name
        assert kind.read() >= 1
    assert kills >= 20
    print(f"{kills} kills; {left_behind} temporaries of killed writers found before the cleanup")


def test_a_trainer_killed_at_a_random_step_resumes_to_the_straight_run(tmp_path: Path) -> None:
    """A trainer (``tests/torch/resume_worker.py``'s) checkpoints after every step in a child
    process that is SIGKILLed at a random moment, possibly inside a checkpoint write; the last
    complete checkpoint resumes to the uninterrupted run, parameters and ledger."""
    from tests.torch import resume_worker

    rng = random.Random(7)
    straight = resume_worker.build()
    while straight.steps_done < 10:
        straight.step()
    path = tmp_path / "checkpoint.pt"
    readable, writable = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python 3.12+)
        pid = os.fork()
    if pid == 0:  # the child: train, checkpoint and report every step, never return into pytest
        try:
            os.close(readable)
            torch.set_num_threads(1)  # no intra-op thread pool after fork
            trainer = resume_worker.build()
            while True:
                if trainer.steps_done < 10:
                    trainer.step()
                    trainer.save_checkpoint(path)
                    os.write(writable, b"%d\n" % trainer.steps_done)
                else:
                    signal.pause()
        finally:
            os._exit(1)
    os.close(writable)
    target = rng.randint(1, 8)
    try:
        with os.fdopen(readable) as steps:
            for line in steps:
                if int(line) == target:
                    break
            else:
                raise AssertionError("the training child stopped early")
            time.sleep(rng.uniform(0.0, 0.01))
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    resumed: Any = resume_worker.build()
    resumed.load_checkpoint(path)
    assert target <= resumed.steps_done <= 10
    while resumed.steps_done < 10:
        resumed.step()
    assert resumed.ledger == straight.ledger
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)
