"""Worker side of :mod:`bench.training`: one (model, method) cell, measured in its own process.

``python -m bench.training --worker '<cell JSON>' ...`` (started by the driver in
:mod:`bench.training`) builds the model, the lot and the step here, times the steps and prints
one ``BENCH-RESULT`` line of JSON. Reproductions reuse :func:`measure` and :func:`_worker` with
their own ``build`` hooks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

BATCH_SIZE = 256
NOISE_MULTIPLIER = 1.0
MAX_GRAD_NORM = 1.0
LEARNING_RATE = 0.05
OPACUS_MODES = ("hooks", "functorch", "ew", "ghost")
_RESULT = "BENCH-RESULT "


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (model, method) measurement."""

    model: str
    method: str
    variant: str | None = None
    jl_dimension: int | None = None

    @property
    def label(self) -> str:
        parts = [self.model, self.method]
        if self.variant is not None:
            parts.append(self.variant)
        if self.jl_dimension is not None:
            parts.append(f"r={self.jl_dimension}")
        return " ".join(parts)


def _lot(model: str, device: Any, batch_size: int = BATCH_SIZE) -> tuple[Any, Any]:
    """``(inputs, targets)``: a fixed random lot of ``batch_size`` for ``model``."""
    import torch

    from dpcore.torch.models import IMDB_SEQUENCE_LENGTH

    generator = torch.Generator().manual_seed(1)
    if model == "mnist_cnn":
        inputs = torch.rand(batch_size, 1, 28, 28, generator=generator)
        targets = torch.randint(0, 10, (batch_size,), generator=generator)
    else:
        inputs = torch.randint(0, 8000, (batch_size, IMDB_SEQUENCE_LENGTH), generator=generator)
        targets = torch.randint(0, 2, (batch_size,), generator=generator).float()
    return inputs.to(device), targets.to(device)


def _losses(model: str) -> tuple[Any, Any]:
    """``(per-example loss, mean loss)``: cross-entropy on MNIST, logistic on IMDb."""
    from torch import nn

    if model == "mnist_cnn":
        return nn.CrossEntropyLoss(reduction="none"), nn.CrossEntropyLoss()
    return nn.BCEWithLogitsLoss(reduction="none"), nn.BCEWithLogitsLoss()


def _model(cell: Cell) -> Any:
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


def _step_function(
    cell: Cell, model: Any, inputs: Any, targets: Any, batch_size: int = BATCH_SIZE
) -> Callable[[], None]:
    """A closure doing one full optimizer step of ``cell``'s method on the fixed lot.

    ``batch_size`` is the (expected) lot size the DP optimizers are told; it should match
    ``len(inputs)``.
    """
    import torch

    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.per_example.fast import FastEngine
    from dpcore.torch.per_example.jl import JLEngine
    from dpcore.torch.per_example.vmap import VmapEngine

    per_example, mean_loss = _losses(cell.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    if cell.method == "nonprivate":

        def nonprivate() -> None:
            optimizer.zero_grad(set_to_none=True)
            mean_loss(model(inputs), targets).backward()
            optimizer.step()

        return nonprivate
    if cell.method.startswith("dpsgd_"):
        engine: Any
        if cell.method == "dpsgd_exact":
            engine = FastEngine(model, max_grad_norm=MAX_GRAD_NORM)
        elif cell.method == "dpsgd_vmap":
            engine = VmapEngine(model, max_grad_norm=MAX_GRAD_NORM)
        else:
            assert cell.jl_dimension is not None
            engine = JLEngine(model, max_grad_norm=MAX_GRAD_NORM, jl_dimension=cell.jl_dimension)
        private = DPOptimizer(
            optimizer,
            engine=engine,
            noise_multiplier=NOISE_MULTIPLIER,
            expected_batch_size=batch_size,
        )

        def dpsgd() -> None:
            private.step(engine.clipped_sum(inputs, targets, per_example))

        return dpsgd
    mode = cell.method.removeprefix("opacus_")
    return _opacus_step(mode, model, inputs, targets, mean_loss, batch_size)


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


def peak_rss_mb() -> float:
    """This process's peak resident set in MiB: ``VmHWM`` from ``/proc/self/status``.

    Not ``ru_maxrss``: Linux carries that counter across ``execve`` from the pre-exec image, so
    a worker started by a large parent (e.g. ``python -m reproductions`` after training) would
    report the parent's size. ``ru_maxrss`` is the fallback where ``/proc`` is absent.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure(
    cell: Cell,
    *,
    device: str,
    threads: int,
    warmup: int,
    steps: int,
    budget: float | None = None,
    build: Callable[[Cell, Any], tuple[Any, Callable[[], None]]] | None = None,
) -> dict[str, Any]:
    """Time ``cell`` in this process: ``warmup`` untimed steps, then the median of ``steps``.

    With a ``budget`` (seconds), only ``clamp(budget // last warm-up step, 1, steps)`` steps are
    timed, so a slow method costs a bounded time in the quick profile. ``build(cell, device)``,
    when given, returns ``(model, step)`` instead of this module's model, random lot and step
    (other timing studies reuse the loop with their own data and optimizer).
    """
    import torch

    torch.set_num_threads(threads)
    flush = torch.set_flush_denormal(True)
    where = torch.device(device)
    cuda = where.type == "cuda"
    row: dict[str, Any] = {
        "step_seconds": None,
        "step_seconds_all": None,
        "baseline_rss_mb": None,
        "peak_rss_mb": None,
        "peak_gpu_mb": None,
        "timed_steps": None,
        "warmup_seconds": None,
        "parameters": None,
        "flush_denormal": bool(flush),
        "error": None,
    }
    try:
        if build is None:
            model = _model(cell).to(where)
            inputs, targets = _lot(cell.model, where)
            step = _step_function(cell, model, inputs, targets)
        else:
            model, step = build(cell, where)
        row["parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        row["baseline_rss_mb"] = peak_rss_mb()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warm = []
            for _ in range(warmup):
                start = time.perf_counter()
                step()
                if cuda:
                    torch.cuda.synchronize()
                warm.append(time.perf_counter() - start)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            count = steps
            if budget is not None and warm:
                count = max(1, min(steps, int(budget // max(warm[-1], 1e-9))))
            row["warmup_seconds"] = warm
            row["timed_steps"] = count
            times = []
            for _ in range(count):
                start = time.perf_counter()
                step()
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
        row["step_seconds"] = statistics.median(times)
        row["step_seconds_all"] = times
        if cuda:
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as error:  # recorded, not raised: one failing method must not stop the run
        row["error"] = f"{type(error).__name__}: {error}"[:2000]
        row["step_seconds"] = row["step_seconds_all"] = None
    row["peak_rss_mb"] = peak_rss_mb()
    return row


def _worker(
    argv: list[str],
    *,
    build: Callable[[Cell, Any], tuple[Any, Callable[[], None]]] | None = None,
    module: str = "bench.training",
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {module} --worker")
    parser.add_argument("--worker", required=True, help="the cell, as JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--budget", type=float, default=None)
    args = parser.parse_args(argv)
    cell = Cell(**json.loads(args.worker))
    row = measure(
        cell,
        device=args.device,
        threads=args.threads,
        warmup=args.warmup,
        steps=args.steps,
        budget=args.budget,
        build=build,
    )
    print(_RESULT + json.dumps(row), flush=True)
    return 0
