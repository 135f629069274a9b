"""One rank of the multi-process tests of :mod:`dpcore.torch.distributed` (gloo, CPU).

``run(rank, world, init_file, out_dir, scenario)`` joins the group, plays the scenario and writes
what the test needs to ``out_dir/<scenario>-<rank>.pt`` (an exception's type and text included,
so the test sees that *every* rank raised).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dpcore.errors import StateError
from dpcore.torch.distributed import DistributedDPTrainer
from dpcore.torch.noise import SeededGaussianNoise

SIZE, FEATURES, SIGMA, C, Q, LR, SEED = 40, 3, 1.3, 0.7, 0.25, 0.1, 5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(SIZE, FEATURES, generator=generator, dtype=torch.float64)
    return inputs, (inputs[:, 0] > 0).long()


def model(*, bias: bool = True, init: int = 0, batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(init)
    layers: list[nn.Module] = [nn.Linear(FEATURES, 4, bias=bias)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(4))
    layers += [nn.Tanh(), nn.Linear(4, 2, bias=bias)]
    return nn.Sequential(*layers).double()


def trainer(net: nn.Module, **changes: Any) -> DistributedDPTrainer:
    inputs, targets = changes.pop("data", data())
    arguments: dict[str, Any] = dict(
        inputs=inputs,
        targets=targets,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        optimizer=torch.optim.SGD(net.parameters(), lr=LR),
        noise_multiplier=SIGMA,
        max_grad_norm=C,
        sampling_probability=Q,
        seed=SEED,
        timeout_s=20.0,
    )
    arguments.update(changes)
    return DistributedDPTrainer(net, **arguments)


class _ScalarNoise(SeededGaussianNoise):
    """A broken noise source: one scalar draw for a whole tensor (after the first step)."""

    calls = 0

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        self.calls += 1
        if self.calls <= 4:  # the first step's draws (4 parameter tensors) are fine
            return super().standard_normal(shape, dtype=dtype, device=device)
        return torch.tensor(0.0, dtype=dtype, device=device)


def scenario(name: str, rank: int, world: int, out: Path) -> dict[str, Any]:
    if name in ("train", "train_jl", "straight", "first_half"):
        net = model()
        run = trainer(net, **({"engine": "jl", "jl_dimension": 3} if name == "train_jl" else {}))
        lots = []
        steps = 6 if name == "first_half" else 12
        for _ in range(steps):
            before = run.sampler.state_dict()
            run.sampler.load_state_dict(before)
            local = run.shard[run.sampler.sample()]
            run.sampler.load_state_dict(before)  # replay: step() draws the same lot
            lots.append(local)
            run.step()
        if name == "first_half":
            run.save_checkpoint(out / "checkpoint.pt")
            for _ in range(2):  # steps after the checkpoint, lost to the kill
                run.step()
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind
        return {
            "params": [p.detach().clone() for p in net.parameters()],
            "lots": lots,
            "ledger": run.ledger.state_dict(),
            "statement": run.privacy_statement(
                delta=1e-5, accountants=("jl",) if name == "train_jl" else ("pld",)
            ),
        }
    if name == "second_half":
        net = model(init=99)  # overwritten by the checkpoint
        run = trainer(net, seed=123)  # so are the samplers and the noise
        run.load_checkpoint(out / "checkpoint.pt")
        for _ in range(6):
            run.step()
        return {
            "params": [p.detach().clone() for p in net.parameters()],
            "ledger": run.ledger.state_dict(),
        }
    if name == "tampered":  # a damaged checkpoint is refused on every rank, changing nothing
        net = model(init=99)
        run = trainer(net, seed=123)
        run.step()
        before = [p.detach().clone() for p in net.parameters()]
        ledger, sampler = run.ledger.state_dict(), run.sampler.state_dict()
        try:
            run.load_checkpoint(out / "tampered.pt")
        except StateError as error:
            unchanged = (
                all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
                and run.ledger.state_dict() == ledger
                and run.sampler.state_dict()["lots_drawn"] == sampler["lots_drawn"]
                and torch.equal(run.sampler.state_dict()["generator"], sampler["generator"])
            )
            return {"error": "StateError", "message": str(error), "unchanged": unchanged}
        return {}
    if name == "noise":
        # zero inputs, no bias: every clipped gradient is 0, so the update is the noise alone
        torch.manual_seed(0)  # the replicas must start equal (the trainer checks it)
        net = nn.Linear(FEATURES, 1, bias=False).double()
        inputs = torch.zeros(SIZE, FEATURES, dtype=torch.float64)
        targets = torch.zeros(SIZE, dtype=torch.float64)
        run = trainer(
            net,
            data=(inputs, targets),
            loss_fn=lambda o, t: (o.squeeze(-1) - t) ** 2,
            optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
        )
        updates = []
        for _ in range(200):
            before = net.weight.detach().clone()
            run.step()
            updates.append((before - net.weight.detach()).reshape(-1) * run.expected_lot_size)
        return {"updates": torch.stack(updates)}
    if name == "engine_mismatch":
        trainer(model(), engine="jl" if rank else "fast", jl_dimension=2 if rank else None)
    if name == "invalid_on_one_rank":
        trainer(model(), sampling_probability=2.0 if rank == 1 else Q)
    if name == "sigma_mismatch":
        trainer(model(), noise_multiplier=SIGMA * (1 + rank))
    if name == "model_mismatch":
        trainer(model(init=rank))
    if name == "batchnorm":
        trainer(model(batchnorm=True))
    if name == "syncbatchnorm":
        trainer(nn.SyncBatchNorm.convert_sync_batchnorm(model(batchnorm=True)))
    if name == "ddp":
        trainer(nn.parallel.DistributedDataParallel(model()))
    if name == "world_mismatch":
        trainer(model()).load_checkpoint(out / "checkpoint.pt")
    if name in ("param_added_on_one_rank", "bad_noise_on_rank_0"):
        # a misuse on one rank only: every rank raises before any of them changes anything
        net = model()
        noise = _ScalarNoise() if name == "bad_noise_on_rank_0" and rank == 0 else None
        run = trainer(net, **({"noise": noise} if noise is not None else {}))
        run.step()
        extra = nn.Parameter(torch.zeros(2, dtype=torch.float64))
        if name == "param_added_on_one_rank" and rank == 1:
            run.optimizer.optimizer.add_param_group({"params": [extra]})
        before = [p.detach().clone() for p in net.parameters()]
        steps = run.ledger.steps
        try:
            run.step()
        except Exception as error:
            unchanged = (
                all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
                and run.ledger.steps == steps
            )
            return {"error": type(error).__name__, "message": str(error), "unchanged": unchanged}
        return {}
    if name == "peer_leaves":
        run = trainer(model(), timeout_s=5.0)
        if rank == 1:
            return {}
        run.step()
    return {}


def run(rank: int, world: int, init_file: str, out_dir: str, name: str) -> None:
    out = Path(out_dir)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        result = scenario(name, rank, world, out)
    except Exception as error:  # reported to the test, which checks every rank raised
        result = {
            "error": type(error).__name__,
            "message": str(error),
            "trace": traceback.format_exc(),
        }
    torch.save(result, out / f"{name}-{rank}.pt")
    if name != "peer_leaves" or rank == 0:
        with contextlib.suppress(Exception):  # a peer that already left
            dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no clean-up that could wait on a peer
