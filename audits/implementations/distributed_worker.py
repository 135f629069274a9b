"""One rank of dpcore's data-parallel trainer on an audit task (spawned by
:mod:`audits.implementations.dpcore_distributed`): gloo on CPU, the task's model and loss
(built from its spec), :class:`dpcore.torch.distributed.DistributedDPTrainer`. Rank 0 writes
the parameters after every step and every step's union lot (gathered from the ranks).

``bug="noise averaged over ranks"`` plants the classic data-parallel mistake with real per-rank
draws: every rank draws its own N(0, sigma^2 C^2) and the ranks *average* their noises (so that
the replicas stay equal) while they sum their clipped gradients: noise sigma C / sqrt(W).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dpcore.auditing.implementation import AuditTask
from dpcore.auditing.models import ModelSpec
from dpcore.auditing.torch_model import parameters_of, torch_loss, torch_model, torch_targets
from dpcore.torch.distributed import AllReduceDPOptimizer, DistributedDPTrainer
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.per_example.base import ClippedBatch

NOISE_AVERAGED = "noise averaged over ranks"


class NoiseAveragedOverRanks(AllReduceDPOptimizer):
    """The planted bug: per-rank noise, averaged across ranks; clipped sums summed."""

    def privatise(self, clipped: ClippedBatch) -> list[torch.Tensor]:
        sums = torch.cat([s.detach().reshape(-1) for s in clipped.summed])
        noise = torch.cat(
            [
                self.noise.standard_normal(p.shape, dtype=p.dtype, device=p.device).reshape(-1)
                for p in self.engine.parameters
            ]
        )
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)
        dist.all_reduce(noise, op=dist.ReduceOp.SUM, group=self.group)
        flat = (sums + self.noise_std * noise / dist.get_world_size()) / self.expected_batch_size
        out, offset = [], 0
        for p in self.engine.parameters:
            out.append(flat[offset : offset + p.numel()].reshape(p.shape))
            offset += p.numel()
        return out


def run(rank: int, world: int, init_file: str, folder: str, bug: str) -> None:
    """Train the task in ``folder/task.npz``; rank 0 writes ``folder/trace.npz``."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    saved = np.load(Path(folder) / "task.npz")
    task = AuditTask(
        features=saved["features"],
        targets=saved["targets"],
        initial_weight=saved["initial_weight"],
        sampling_probability=float(saved["sampling_probability"]),
        noise_multiplier=float(saved["noise_multiplier"]),
        max_grad_norm=float(saved["max_grad_norm"]),
        learning_rate=float(saved["learning_rate"]),
        steps=int(saved["steps"]),
        delta=float(saved["delta"]),
        seed=int(saved["seed"]),
        report_epsilon=bool(saved["report_epsilon"]),
        model=ModelSpec(
            tuple(int(v) for v in saved["layers"]),
            bias=bool(saved["bias"]),
            activation=str(saved["activation"]),
            loss=str(saved["loss"]),
        ),
    )
    model = torch_model(task)
    trainer = DistributedDPTrainer(
        model,
        inputs=torch.from_numpy(task.features),
        targets=torch_targets(task),
        loss_fn=torch_loss(task),
        optimizer=torch.optim.SGD(model.parameters(), lr=task.learning_rate),
        noise_multiplier=task.noise_multiplier,
        max_grad_norm=task.max_grad_norm,
        sampling_probability=task.sampling_probability,
        engine="fast",
        seed=task.seed,
        timeout_s=120.0,
    )
    if bug == NOISE_AVERAGED:
        trainer.optimizer = NoiseAveragedOverRanks(
            trainer.optimizer.optimizer,
            rank=rank,
            group=trainer.group,
            device=trainer.device,
            engine=trainer.engine,
            noise_multiplier=task.noise_multiplier,
            expected_batch_size=trainer.expected_lot_size,
            noise=SeededGaussianNoise(task.seed * 1000 + rank),  # a real draw on every rank
        )
    weights, lots = [], []
    for _ in range(task.steps):
        state = trainer.sampler.state_dict()
        local = trainer.shard[trainer.sampler.sample()]
        trainer.sampler.load_state_dict(state)  # step() draws this same lot
        trainer.step()
        every: list[torch.Tensor | None] = [None] * world
        dist.all_gather_object(every, local, group=trainer.group)
        weights.append(np.concatenate([p.reshape(-1) for p in parameters_of(model)]))
        lots.append(torch.cat([t for t in every if t is not None]).numpy())
    if rank == 0:
        epsilon = trainer.epsilon(delta=task.delta) if task.report_epsilon else np.nan
        sizes = np.array([len(lot) for lot in lots])
        np.savez(
            Path(folder) / "trace.npz",
            weights=np.stack(weights),
            lots=np.concatenate(lots) if sizes.sum() else np.zeros(0, dtype=np.int64),
            sizes=sizes,
            epsilon=epsilon,
            divisor=trainer.expected_lot_size,
        )
    dist.barrier(group=trainer.group)
    dist.destroy_process_group()
    os._exit(0)
