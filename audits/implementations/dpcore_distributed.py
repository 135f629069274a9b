"""dpcore's data-parallel trainer (:mod:`dpcore.torch.distributed`) behind the audit contract:
every task runs in W real processes (gloo, spawned), so the audits see the multi-process path —
including, for the planted bug, real per-rank noise draws."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

import numpy as np
import torch.multiprocessing as mp

from audits.implementations import distributed_worker
from dpcore.auditing.implementation import AuditTask, Claim, Observer


@dataclasses.dataclass
class DpcoreDistributed:
    """dpcore on W ranks; ``bug`` is "" or :data:`distributed_worker.NOISE_AVERAGED`."""

    world_size: int = 2
    bug: str = ""

    @property
    def name(self) -> str:
        mode = f"{self.world_size} ranks, gloo"
        return f"dpcore torch distributed ({mode}{', ' + self.bug if self.bug else ''})"

    def train(self, task: AuditTask, observer: Observer) -> Claim:
        with tempfile.TemporaryDirectory(prefix="dpcore-distributed-audit-") as folder:
            np.savez(
                Path(folder) / "task.npz",
                features=task.features,
                targets=task.targets,
                initial_weight=task.initial_weight,
                sampling_probability=task.sampling_probability,
                noise_multiplier=task.noise_multiplier,
                max_grad_norm=task.max_grad_norm,
                learning_rate=task.learning_rate,
                steps=task.steps,
                delta=task.delta,
                seed=task.seed,
                report_epsilon=task.report_epsilon,
                layers=np.array(task.spec.layers),
                bias=task.spec.bias,
                activation=task.spec.activation,
                loss=task.spec.loss,
            )
            mp.start_processes(
                distributed_worker.run,
                args=(self.world_size, str(Path(folder) / "init"), folder, self.bug),
                nprocs=self.world_size,
                join=True,
                start_method="spawn",
            )
            trace = np.load(Path(folder) / "trace.npz")
            weights, sizes, lots = trace["weights"], trace["sizes"], trace["lots"]
            epsilon, divisor = float(trace["epsilon"]), float(trace["divisor"])
        for weight, lot in zip(weights, np.split(lots, np.cumsum(sizes)[:-1]), strict=True):
            observer.step(weight, lot)
        return Claim(
            implementation=self.name,
            sampler="poisson",
            accounting_assumes="poisson",
            sampling_probability=task.sampling_probability,
            noise_multiplier=task.noise_multiplier,
            max_grad_norm=task.max_grad_norm,
            steps=task.steps,
            delta=task.delta,
            divisor=divisor,  # the trainer's expected lot size
            epsilon=None if math.isnan(epsilon) else epsilon,
            accountant="dpcore pld (certified upper)",
        )
