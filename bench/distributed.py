"""``python -m bench distributed``: data-parallel DP-SGD step time on 1, 2 and 4 processes.

Each world size W runs :class:`dpcore.torch.distributed.DistributedDPTrainer` in W spawned
processes (gloo on CPU; one torch thread each) on an MLP (784-256-10) over synthetic data with the
same global expected lot (q N = 256): warm-up steps, then timed steps. Rank 0 reports the mean
step time and the time of one all-reduce of the parameters' size (the collective each step
makes), timed alone after training; its share is all-reduce / step. On this machine's 2 cores,
W > 1 can only add overhead (the ranks share the cores): the rows report that, not a speed-up.

With ``--executor`` each world size runs on a worker, one at a time
(:func:`dpcore.runs.one_at_a_time`); every row names the machine that timed it (``hardware``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from dpcore.atomic import atomic_write_text
from dpcore.runs import ExecutorChoice, SupportsSubmit, machine, one_at_a_time, run_many

WORLD_SIZES = (1, 2, 4)
DATASET, LOT, WARMUP, STEPS = 8192, 256, 3, 20


def _worker(rank: int, world: int, init_file: str, out: str, steps: int) -> None:
    from dpcore.torch.distributed import DistributedDPTrainer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    inputs = torch.randn(DATASET, 784)
    targets = torch.randint(0, 10, (DATASET,))
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    trainer = DistributedDPTrainer(
        model,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampling_probability=LOT / DATASET,
        engine="fast",
        seed=0,
    )
    for _ in range(WARMUP):
        trainer.step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    dist.barrier()
    step_s = (time.perf_counter() - start) / steps
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    start = time.perf_counter()
    for _ in range(steps):
        dist.all_reduce(flat, group=trainer.group)
    allreduce_s = (time.perf_counter() - start) / steps
    if rank == 0:
        Path(out).write_text(json.dumps({"step_s": step_s, "allreduce_s": allreduce_s}))
    trainer.close()
    dist.destroy_process_group()


@dataclasses.dataclass(frozen=True)
class WorldRun:
    """One world size's timing, a picklable spec for :func:`dpcore.runs.run_many`
    (:func:`measure_world`)."""

    world: int
    steps: int


def measure_world(run: WorldRun) -> dict[str, Any]:
    """Time ``run.world`` spawned ranks here: rank 0's mean step and all-reduce seconds, and the
    machine that timed them (``hardware``)."""
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        mp.start_processes(
            _worker,
            args=(run.world, os.path.join(folder, "init"), out, run.steps),
            nprocs=run.world,
            join=True,
            start_method="spawn",
        )
        timing = json.loads(Path(out).read_text())
    return {
        "world_size": run.world,
        "backend": "gloo",
        "device": "cpu",
        **timing,
        "allreduce_share": timing["allreduce_s"] / timing["step_s"],
        "hardware": machine(),
    }


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
) -> list[dict[str, Any]]:
    """Time every world size; write ``distributed.json`` (+ ``.meta.json``); return the rows.

    Each world size (:class:`WorldRun`) is a run of :func:`dpcore.runs.run_many`: here
    (``executor`` None or ``"local"``) or on ``executor``, handed one at a time
    (:func:`dpcore.runs.one_at_a_time`), so no two timings share a machine; each row names the
    machine that timed it (``hardware``), and ``step_time_vs_one_process`` compares machines
    too when the rows' differ.

    Raises:
        InvalidParameterError: ``executor`` is not a valid choice (before anything runs).
    """
    from dpcore.provenance import provenance

    steps = 5 if quick else STEPS
    with one_at_a_time(executor) as chosen:
        rows = run_many(measure_world, [WorldRun(world, steps) for world in WORLD_SIZES],
                        executor=chosen, retries=0)  # fmt: skip
    single = rows[0]["step_s"]
    for row in rows:
        row["step_time_vs_one_process"] = row["step_s"] / single
    hardware = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU"
    # the commit before the rows file changes: a tracked results file would read as "-dirty"
    meta = provenance(root=results_dir.parents[1], benchmark="distributed", quick=quick)
    text = json.dumps(
        {
            "rows": rows,
            "hardware": hardware,
            "model": "MLP 784-256-10",
            "expected_lot": LOT,
            "steps": steps,
        },
        indent=1,
    )
    atomic_write_text(results_dir / "distributed.json", text + "\n")
    atomic_write_text(results_dir / "distributed.meta.json", json.dumps(meta, indent=1) + "\n")
    return rows
