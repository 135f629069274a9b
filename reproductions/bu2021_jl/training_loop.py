"""The resumable training loop of the Bu et al. 2021 training reproductions (Fig. 4 and summary).

:func:`run_training` drives a :class:`Trainable` (a :class:`~dpcore.torch.training.DPTrainer` or
a non-private stand-in) to a number of steps, evaluating the test accuracy (:func:`evaluate`) at
intervals and, with a checkpoint, saving and resuming; :func:`cpu_settings` sets torch's threads
for the run. Used by :mod:`reproductions.bu2021_jl.accuracy` and
:mod:`reproductions.bu2021_jl.summary`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from dpcore.torch.training import accuracy as batch_accuracy


def hardware_label(device: torch.device) -> str:
    """What ran the training, for the saved results: the GPU's name, or the CPU threads."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    return f"{torch.get_num_threads()} torch thread(s) on a shared CPU"


def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Test accuracy in batches of 1,000 (argmax of class scores, sign of a single logit)."""
    model.eval()
    correct = 0.0
    with torch.no_grad():
        for start in range(0, len(inputs), 1000):
            chunk = slice(start, start + 1000)
            batch = len(inputs[chunk])
            correct += batch_accuracy(model(inputs[chunk]), targets[chunk]) * batch
    return round(correct / len(inputs), 10)


@contextlib.contextmanager
def cpu_settings(threads: int | None, *, flush_denormal: bool = False) -> Iterator[None]:
    """Set torch's thread count (and flush-to-zero of denormal floats) for a block, then restore."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    if flush_denormal:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
        if flush_denormal:
            torch.set_flush_denormal(False)


class Trainable(Protocol):
    """What :func:`run_training` drives: a :class:`DPTrainer` or a non-private stand-in."""

    model: nn.Module

    @property
    def steps_done(self) -> int: ...

    def step(self) -> object: ...

    def save_checkpoint(self, path: str | Path) -> None: ...

    def load_checkpoint(self, path: str | Path) -> None: ...


def run_training(
    trainer: Trainable,
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    eval_every: int,
    per_epoch: int,
    fingerprint: dict[str, Any],
    checkpoint: Path | None = None,
    row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train to ``steps`` steps, evaluating every ``eval_every``; resumable.

    With ``checkpoint`` (a path stem), the trainer is saved to ``<stem>.pt`` and the rows so far
    to ``<stem>.json`` at every evaluation; a run saved with the same ``fingerprint`` (config,
    method, seed) resumes from there, and a finished one is read back instead of retrained.
    Every row holds ``row``, the step, the epoch (``step / per_epoch``) and the test accuracy.
    Returns ``{"rows": [...], "train_seconds": ..., "done": True, **fingerprint}``.
    """
    from tqdm import tqdm

    fingerprint = json.loads(json.dumps(fingerprint))  # tuples -> lists, as read back
    state: dict[str, Any] = {"rows": [], "train_seconds": 0.0, "done": False, **fingerprint}
    if checkpoint is not None and checkpoint.with_suffix(".json").is_file():
        saved: dict[str, Any] = json.loads(checkpoint.with_suffix(".json").read_text())
        weights = checkpoint.with_suffix(".pt")
        if all(saved.get(k) == v for k, v in fingerprint.items()) and weights.is_file():
            trainer.load_checkpoint(weights)
            if saved["done"]:
                return saved
            state = saved
    bar = tqdm(
        total=steps,
        initial=trainer.steps_done,
        desc=" ".join(str(v) for v in (row or {}).values()),
        unit="step",
        leave=False,
        disable=None,
    )
    while trainer.steps_done < steps:
        start = time.perf_counter()
        for _ in range(min(eval_every, steps - trainer.steps_done)):
            trainer.step()
            bar.update(1)
        state["train_seconds"] += time.perf_counter() - start
        state["rows"].append(
            {
                **(row or {}),
                "step": trainer.steps_done,
                "epoch": round(trainer.steps_done / per_epoch, 4),
                "test_accuracy": evaluate(trainer.model, *test),
            }
        )
        state["done"] = trainer.steps_done >= steps
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(checkpoint.with_suffix(".pt"))
            checkpoint.with_suffix(".json").write_text(json.dumps(state, indent=1) + "\n")
    bar.close()
    state["done"] = True
    return state
