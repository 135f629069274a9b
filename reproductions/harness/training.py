"""Resumable training over any :class:`Trainable`, the non-private trainer, and one evaluator.

:func:`run_training` drives a trainer (a :class:`~dpcore.torch.training.DPTrainer` or the
:class:`NonPrivateTrainer` baseline) to a number of steps, measuring at intervals (test metric,
privacy spent: whatever the reproduction's ``measure`` returns) and committing checkpoint and rows
together to its :class:`~reproductions.harness.store.RunState`. A killed run resumes from its last
commit; a finished one is read back without training; a run past its ``deadline`` stops at its
next commit and says so (``done`` is False, the rows say how far it got).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from dpcore.atomic import atomic_path
from dpcore.errors import InvalidParameterError
from dpcore.torch.seeding import torch_seeded
from reproductions.harness.store import RunState

__all__ = [
    "NonPrivateTrainer",
    "Trainable",
    "cpu_settings",
    "evaluate",
    "hardware_label",
    "run_training",
    "torch_seeded",
]

METRICS = ("accuracy", "rmse")


class Trainable(Protocol):
    """What :func:`run_training` drives: a :class:`DPTrainer` or :class:`NonPrivateTrainer`."""

    model: nn.Module

    @property
    def steps_done(self) -> int: ...

    def step(self) -> object: ...

    def save_checkpoint(self, path: str | Path) -> None: ...

    def load_checkpoint(self, path: str | Path) -> None: ...


def _predictions(outputs: torch.Tensor) -> torch.Tensor:
    if outputs.dim() == 2 and outputs.shape[1] > 1:
        return outputs.argmax(dim=1)
    return (outputs.reshape(-1) > 0).long()


def expected_rating(logits: torch.Tensor) -> torch.Tensor:
    """Expected star rating ``sum_k k softmax(logits)_k`` over classes k = 1..K (MovieLens)."""
    stars = torch.arange(1, logits.shape[1] + 1, dtype=logits.dtype, device=logits.device)
    return (torch.softmax(logits, dim=1) * stars).sum(dim=1)


def evaluate(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    metric: str = "accuracy",
    batch: int = 1000,
) -> float:
    """Test ``"accuracy"`` or ``"rmse"``, in evaluation mode, in batches of ``batch``.

    Accuracy: argmax of class scores, or the sign of a single logit. RMSE: of the expected star
    rating (:func:`expected_rating`) against ``targets + 1`` (targets are stars - 1).

    Example:
        >>> model = nn.Linear(2, 3)
        >>> 0.0 <= evaluate(model, torch.randn(5, 2), torch.tensor([0, 1, 2, 0, 1])) <= 1.0
        True
    """
    if metric not in METRICS:
        raise InvalidParameterError("metric", f"in {METRICS}", metric)
    if len(inputs) == 0:
        raise InvalidParameterError("inputs", "at least one test row", 0)
    if batch < 1:
        raise InvalidParameterError("batch", ">= 1", batch)
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            outputs = model(inputs[start : start + batch])
            target = targets[start : start + batch]
            if metric == "rmse":
                error = expected_rating(outputs) - (target + 1).to(outputs.dtype)
                total += float((error**2).sum())
            else:
                total += float((_predictions(outputs) == target.reshape(-1)).sum())
    model.train(was_training)
    mean = total / len(inputs)
    return round(mean**0.5 if metric == "rmse" else mean, 10)


def hardware_label(device: torch.device | str = "cpu") -> str:
    """What ran the training, for the saved results: the GPU's name, or the CPU threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA)"
    return f"{torch.get_num_threads()} torch thread(s), CPU"


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


class NonPrivateTrainer:
    """The non-private baseline: a torch optimizer on shuffled batches of exactly ``batch_size``.

    Each pass over the data is a fresh permutation; its last partial batch is dropped (so every
    step sees ``batch_size`` examples, like the expected lot of the private run). Same interface
    as :class:`~dpcore.torch.training.DPTrainer` (``step``, ``steps_done``, checkpoints).
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        optimizer: Callable[[Any], torch.optim.Optimizer],
        loss_fn: nn.Module,
        batch_size: int,
        seed: int,
    ) -> None:
        if not 1 <= batch_size <= len(inputs):
            raise InvalidParameterError("batch_size", f"in [1, {len(inputs)}]", batch_size)
        self.model, self.inputs, self.targets = model, inputs, targets
        self.batch_size = batch_size
        self.optimizer = optimizer(model.parameters())
        self.loss_fn = loss_fn
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.empty(0, dtype=torch.long)
        self.position = 0
        self.steps = 0

    @property
    def steps_done(self) -> int:
        return self.steps

    @property
    def steps_per_epoch(self) -> int:
        """Full batches in one pass over the data."""
        return len(self.inputs) // self.batch_size

    def step(self) -> float:
        """One optimizer step on the next batch; returns its mean loss."""
        if self.position + self.batch_size > len(self.order):
            self.order = torch.randperm(len(self.inputs), generator=self.generator)
            self.position = 0
        rows = self.order[self.position : self.position + self.batch_size].to(self.inputs.device)
        self.position += self.batch_size
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.inputs[rows]), self.targets[rows])
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(loss.detach())

    def save_checkpoint(self, path: str | Path) -> None:
        """Model, optimizer, shuffling state and step count (written atomically)."""
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "order": self.order,
            "position": self.position,
            "steps": self.steps,
        }
        with atomic_path(path) as temporary:
            torch.save(state, temporary)

    def load_checkpoint(self, path: str | Path) -> None:
        """Resume from :meth:`save_checkpoint`'s file."""
        state = torch.load(Path(path), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.order, self.position, self.steps = state["order"], state["position"], state["steps"]


def run_training(
    trainer: Trainable,
    state: RunState,
    *,
    steps: int,
    eval_every: int,
    per_epoch: float,
    measure: Callable[[Trainable], dict[str, Any]],
    row: dict[str, Any] | None = None,
    deadline: float | None = None,
    until: int | None = None,
    label: str = "",
) -> RunState:
    """Train to ``steps`` steps, measuring and committing every ``eval_every`` steps; resumable.

    Every row holds ``row``, the step, the epoch (``step / per_epoch``), what ``measure(trainer)``
    returns, and ``wall_s``, the training seconds so far (measuring excluded). ``deadline`` (a
    ``time.time()`` value) stops the run at its first commit past it, with ``state.done`` False.
    ``until`` stops it at that step for now (not part of the run: a later call with a larger
    ``until``, the same ``trainer`` and ``state``, goes on from there without reloading).
    """
    from tqdm import tqdm

    if steps < 1:
        raise InvalidParameterError("steps", ">= 1", steps)
    if eval_every < 1:
        raise InvalidParameterError("eval_every", ">= 1", eval_every)
    if until is not None and until < 0:
        raise InvalidParameterError("until", ">= 0", until)
    saved = state.rows[-1]["step"] if state.rows else 0
    in_step = trainer.steps_done == saved  # a trainer kept between calls is at the saved step
    if state.checkpoint_path is not None:
        if not in_step:
            trainer.load_checkpoint(state.checkpoint_path)
        if state.done:
            return state
    elif state.rows and not in_step:
        state.rows, state.seconds = [], 0.0  # rows without weights: start over
    limit = steps if until is None else min(steps, until)
    bar = tqdm(
        total=steps,
        initial=trainer.steps_done,
        desc=label,
        unit="step",
        leave=False,
        disable=None,
    )
    while trainer.steps_done < limit:
        if deadline is not None and time.time() >= deadline:
            break
        start = time.perf_counter()
        for _ in range(min(eval_every, limit - trainer.steps_done)):
            trainer.step()
            bar.update(1)
        state.seconds += time.perf_counter() - start
        done = trainer.steps_done
        state.rows.append(
            {
                **(row or {}),
                "step": done,
                "epoch": round(done / per_epoch, 4),
                **measure(trainer),
                "wall_s": round(state.seconds, 2),
            }
        )
        state.done = done >= steps
        state.commit(trainer.save_checkpoint, tag=done)
    bar.close()
    return state
