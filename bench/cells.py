"""The training benchmark's cells: its models, random lots and optimizer steps, run in workers.

The measuring machinery (a :class:`~dpcore.runs.cells.Cell` run in a fresh ``python -m <module>
--worker`` process, timed or under a memory cap, its row read back from its one result line) is
:mod:`dpcore.runs.cells`; this module holds what the benchmarks of :mod:`bench.training`,
:mod:`bench.training_memory` and :mod:`bench.logical_lots` measure with it:

- :func:`make_model`, :func:`make_lot` and :func:`step_function` build a cell's model, random lot
  and full optimizer step (dpcore's steps and lots are :mod:`dpcore.runs.torch_cells`', shared
  with the Bu et al. 2021 memory reproduction; Opacus' are built here); :func:`build_timing` and
  :func:`build_memory` are the ``build`` hooks made of them;
- :func:`timing_worker`, :func:`memory_worker`, :func:`run_cell`, :func:`run_timing` and
  :func:`run_capped` are :mod:`dpcore.runs.cells`' with the benchmark's hooks, worker modules
  and the repository root (where ``python -m bench...`` imports) filled in.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpcore.runs import cells as runs_cells
from dpcore.runs import torch_cells
from dpcore.runs.cells import Cell, MemoryBuild, TimingBuild
from dpcore.runs.workers import POLL_SECONDS, WorkerResult

__all__ = [
    "BATCH_SIZE",
    "LEARNING_RATE",
    "MAX_GRAD_NORM",
    "NOISE_MULTIPLIER",
    "OPACUS_MODES",
    "ROOT",
    "build_memory",
    "build_timing",
    "make_lot",
    "make_model",
    "memory_worker",
    "run_capped",
    "run_cell",
    "run_timing",
    "step_function",
    "timing_worker",
]

#: The repository root: workers run there (``python -m bench...`` / ``reproductions...``).
ROOT = Path(__file__).resolve().parents[1]
#: The training benchmark's lot; its noise multiplier, clipping norm and SGD learning rate are
#: those of every step of :mod:`dpcore.runs.torch_cells`.
BATCH_SIZE = 256
NOISE_MULTIPLIER = torch_cells.NOISE_MULTIPLIER
MAX_GRAD_NORM = torch_cells.MAX_GRAD_NORM
LEARNING_RATE = torch_cells.LEARNING_RATE
#: Opacus' ``grad_sample_mode`` values, each an ``opacus_<mode>`` method.
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")

# ----------------------------------------------------------------------------- model, lot, step


def make_lot(model: str, device: Any, batch_size: int = BATCH_SIZE) -> tuple[Any, Any]:
    """:func:`dpcore.runs.torch_cells.random_lot` at :data:`BATCH_SIZE` unless ``batch_size``."""
    return torch_cells.random_lot(model, device, batch_size)


def make_model(cell: Cell) -> Any:
    """The seeded model of ``cell`` (on CPU): the TF Privacy MNIST CNN, or the IMDb LSTM with
    ``nn.LSTM`` (variant ``lstm``), dpcore's ``DPLSTM`` (``dplstm``) or Opacus' ``DPLSTM``
    (``opacus_dplstm``)."""
    import torch

    from dpcore.torch.models import imdb_lstm, tf_privacy_mnist_cnn

    torch.manual_seed(0)
    if cell.model == "mnist_cnn":
        return tf_privacy_mnist_cnn()
    if cell.variant == "opacus_dplstm":
        from opacus import layers as opacus_layers

        model = imdb_lstm(recurrent="lstm")
        model.lstm = opacus_layers.DPLSTM(64, 64, batch_first=True, bidirectional=True)
        return model
    return imdb_lstm(recurrent="dplstm" if cell.variant == "dplstm" else "lstm")


def step_function(
    cell: Cell, model: Any, inputs: Any, targets: Any, batch_size: int = BATCH_SIZE
) -> Callable[[], None]:
    """A closure doing one full optimizer step of ``cell``'s method on the fixed lot.

    dpcore's methods (``nonprivate``, ``dpsgd_exact``, ``dpsgd_vmap``, ``dpsgd_jl``) are
    :func:`dpcore.runs.torch_cells.step_function`'s; ``opacus_<mode>``: Opacus' own loop.
    ``batch_size`` is the (expected) lot size the DP optimizers are told; it should match
    ``len(inputs)``.
    """
    if cell.method.startswith("opacus_"):
        _, mean_loss = torch_cells.losses(cell.model)
        mode = cell.method.removeprefix("opacus_")
        return _opacus_step(mode, model, inputs, targets, mean_loss, batch_size)
    return torch_cells.step_function(cell, model, inputs, targets, batch_size)


def _opacus_step(
    mode: str,
    model: Any,
    inputs: Any,
    targets: Any,
    criterion: Any,
    batch_size: int = BATCH_SIZE,
) -> Callable[[], None]:
    """Opacus' own loop: wrapped model forward, loss, backward, DP optimizer step."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    # make_private reads the expected lot size off a loader; with poisson_sampling=False it is
    # not resampled, and the fixed lot below is fed to the wrapped model directly.
    loader = DataLoader(TensorDataset(inputs.cpu(), targets.cpu()), batch_size=batch_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            criterion=criterion,
            data_loader=loader,
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            poisson_sampling=False,
            grad_sample_mode=mode,
        )
    if mode == "ghost":  # (module, optimizer, criterion wrapper, loader): two-pass backward
        wrapped, private, criterion = made[0], made[1], made[2]
    else:
        wrapped, private = made[0], made[1]

    def opacus() -> None:
        private.zero_grad(set_to_none=True)
        criterion(wrapped(inputs), targets).backward()
        private.step()

    return opacus


# ----------------------------------------------------------------------------- the hooks


def build_timing(cell: Cell, device: Any) -> tuple[Any, Callable[[], None]]:
    """``(model, step)`` of ``cell`` on ``device`` at :data:`BATCH_SIZE` (a timing ``build``)."""
    model = make_model(cell).to(device)
    inputs, targets = make_lot(cell.model, device)
    return model, step_function(cell, model, inputs, targets)


def build_memory(cell: Cell, batch_size: int, device: str) -> tuple[Any, Callable[[], None]]:
    """``(model, step)`` of ``cell`` on ``device`` at ``batch_size`` (a memory ``build``)."""
    model = make_model(cell).to(device)
    inputs, targets = make_lot(cell.model, device, batch_size)
    return model, step_function(cell, model, inputs, targets, batch_size)


def timing_worker(
    argv: Sequence[str], *, build: TimingBuild | None = None, module: str = "bench.training"
) -> int:
    """:func:`dpcore.runs.cells.timing_worker` with :func:`build_timing` unless ``build``."""
    return runs_cells.timing_worker(argv, build=build or build_timing, module=module)


def memory_worker(
    argv: Sequence[str],
    *,
    build: MemoryBuild | None = None,
    module: str = "bench.training_memory",
) -> int:
    """:func:`dpcore.runs.cells.memory_worker` with :func:`build_memory` unless ``build``."""
    return runs_cells.memory_worker(argv, build=build or build_memory, module=module)


def run_cell(
    cell: Cell,
    *,
    module: str,
    timeout: float | None = None,
    cap_mb: float | None = None,
    poll_seconds: float = POLL_SECONDS,
    **options: Any,
) -> WorkerResult:
    """:func:`dpcore.runs.cells.run_cell` in :data:`ROOT` (``python -m bench...`` imports)."""
    return runs_cells.run_cell(
        cell,
        module=module,
        cwd=ROOT,
        timeout=timeout,
        cap_mb=cap_mb,
        poll_seconds=poll_seconds,
        **options,
    )


def run_timing(
    cell: Cell,
    *,
    device: str,
    threads: int,
    warmup: int,
    steps: int,
    budget: float | None,
    timeout: float,
    module: str = "bench.training",
) -> dict[str, Any]:
    """:func:`dpcore.runs.cells.run_timing` of a worker of ``module``, in :data:`ROOT`."""
    return runs_cells.run_timing(
        cell,
        device=device,
        threads=threads,
        warmup=warmup,
        steps=steps,
        budget=budget,
        timeout=timeout,
        module=module,
        cwd=ROOT,
    )


def run_capped(
    cell: Cell,
    batch_size: int,
    *,
    cap_mb: float,
    timeout: float,
    threads: int = 1,
    module: str = "bench.training_memory",
    device: str = "cpu",
    poll_seconds: float = POLL_SECONDS,
) -> dict[str, Any]:
    """:func:`dpcore.runs.cells.run_capped` of a worker of ``module``, in :data:`ROOT`."""
    return runs_cells.run_capped(
        cell,
        batch_size,
        cap_mb=cap_mb,
        timeout=timeout,
        module=module,
        cwd=ROOT,
        threads=threads,
        device=device,
        poll_seconds=poll_seconds,
    )
