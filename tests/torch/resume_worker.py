"""A training process for the kill-and-resume test: ``python resume_worker.py DIR MODE``.

MODE ``straight`` trains 10 steps; ``crash`` checkpoints after every step and kills itself with
SIGKILL after step 4 (no clean-up runs); ``resume`` loads the last checkpoint and finishes.
Each writes its final parameters and ledger to DIR/<MODE>.pt.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer


def build() -> DPTrainer:
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(200, 5, generator=generator, dtype=torch.float64)
    targets = (inputs[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    return DPTrainer.dp_adam(
        model,
        lr=0.01,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=PoissonSampler(200, sampling_probability=0.1, seed=2),
        engine="fast",
        seed=3,
    )


def main(directory: Path, mode: str) -> None:
    trainer = build()
    checkpoint = directory / "checkpoint.pt"
    if mode == "resume":
        trainer.load_checkpoint(checkpoint)
    while trainer.steps_done < 10:
        trainer.step()
        if mode == "crash":
            trainer.save_checkpoint(checkpoint)
            if trainer.steps_done == 4:
                os.kill(os.getpid(), signal.SIGKILL)
    result = {"parameters": [p.detach() for p in trainer.model.parameters()]}
    result["ledger"] = trainer.ledger.state_dict()  # type: ignore[assignment]
    torch.save(result, directory / f"{mode}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
