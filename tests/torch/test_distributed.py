"""Data-parallel DP training on torch.distributed (gloo, CPU, 2 and 4 processes).

Parameters after T steps equal a single-process run over the same global lots; the noise is
drawn exactly once per step; kill-and-resume across processes; every bad input raises on every
rank, without hanging.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from scipy import stats
from torch import nn

from dpcore.errors import StateError
from dpcore.torch.distributed import DistributedDPTrainer
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.per_example.jl import JLEngine
from tests.torch import distributed_worker as worker


def _spawn(tmp_path: Path, name: str, world: int) -> list[dict[str, Any]]:
    init = tmp_path / f"init-{name}-{world}"
    mp.start_processes(
        worker.run,
        args=(world, str(init), str(tmp_path), name),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return [torch.load(tmp_path / f"{name}-{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.mark.parametrize(("world", "jl"), [(2, False), (4, False), (2, True)])
def test_ranks_equal_one_process_over_the_union_lots(tmp_path: Path, world: int, jl: bool) -> None:
    results = _spawn(tmp_path, "train_jl" if jl else "train", world)
    for result in results:
        assert "error" not in result, result.get("trace")
    # every rank ends with the same parameters and the same ledger
    for result in results[1:]:
        for a, b in zip(results[0]["params"], result["params"], strict=True):
            assert torch.equal(a, b)
        assert result["ledger"] == results[0]["ledger"]
    # one process, the same global lots (the union of the ranks'), rank 0's noise seed
    net = worker.model()
    engine: FastEngine | JLEngine = (
        JLEngine(
            net,
            max_grad_norm=worker.C,
            jl_dimension=3,
            directions=SeededGaussianNoise(worker.SEED + 1),
        )
        if jl
        else FastEngine(net, max_grad_norm=worker.C)
    )
    optimizer = DPOptimizer(
        torch.optim.SGD(net.parameters(), lr=worker.LR),
        engine=engine,
        noise_multiplier=worker.SIGMA,
        expected_batch_size=worker.Q * worker.SIZE,
        noise=SeededGaussianNoise(worker.SEED),
    )
    inputs, targets = worker.data()
    loss = nn.CrossEntropyLoss(reduction="none")
    for step in range(12):
        lot = torch.cat([result["lots"][step] for result in results])
        if isinstance(engine, JLEngine):
            with engine.drawn_lot():  # directions drawn every step, as every rank does
                optimizer.step(engine.clipped_sum(inputs[lot], targets[lot], loss))
        else:
            optimizer.step(engine.clipped_sum(inputs[lot], targets[lot], loss))
    for a, b in zip(net.parameters(), results[0]["params"], strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12)
    statement = results[0]["statement"]
    assert statement["jl"] is jl and statement["steps"] == 12
    run = statement["run"]
    assert run["jl_dimension"] == (3 if jl else None) and run["world_size"] == world
    assert run["noise_multiplier"] == worker.SIGMA
    ledger = results[0]["ledger"]
    assert ledger["dataset_size"] == worker.SIZE and sum(r["count"] for r in ledger["runs"]) == 12


def test_noise_is_drawn_once_per_step(tmp_path: Path) -> None:
    world = 4
    results = _spawn(tmp_path, "noise", world)
    updates = results[0]["updates"]
    assert "error" not in results[0]
    scale = worker.SIGMA * worker.C
    chi2 = float((updates / scale).square().sum())
    dof = updates.numel()
    # one draw per step: chi^2 with dof degrees of freedom
    assert 1e-3 < stats.chi2.sf(chi2, dof) < 1 - 1e-3
    # one draw per worker would make the variance 4 sigma^2 C^2: rejected
    assert stats.chi2.cdf(chi2 / world, dof) < 1e-6


def test_kill_and_resume_gives_the_uninterrupted_run(tmp_path: Path) -> None:
    straight = _spawn(tmp_path, "straight", 2)
    # 6 steps, a checkpoint, 2 more steps, then every process SIGKILLs itself
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        _spawn(tmp_path, "first_half", 2)
    resumed = _spawn(tmp_path, "second_half", 2)
    for rank in range(2):
        assert "error" not in resumed[rank], resumed[rank].get("trace")
        for a, b in zip(straight[rank]["params"], resumed[rank]["params"], strict=True):
            assert torch.equal(a, b)
        assert straight[rank]["ledger"] == resumed[rank]["ledger"]
    # a different world size is refused, on every rank
    for result in _spawn(tmp_path, "world_mismatch", 4):
        assert result["error"] == "StateError" and "same world size" in result["message"]
    # a ledger edited from sigma 1.3 to 100 fails the integrity check on every rank, and the
    # trainers that refused it are unchanged
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    state["ledger"]["runs"][0]["event"]["event"]["noise_multiplier"] = 100.0
    torch.save(state, tmp_path / "tampered.pt")
    for result in _spawn(tmp_path, "tampered", 2):
        assert result.get("error") == "StateError", result
        assert "integrity check failed" in result["message"] and result["unchanged"]


@pytest.mark.parametrize(
    ("name", "error", "text"),
    [
        ("sigma_mismatch", "InvalidParameterError", "noise_multiplier"),
        ("engine_mismatch", "InvalidParameterError", "jl_dimension"),
        ("model_mismatch", "InvalidParameterError", "model parameters"),
        ("batchnorm", "IncompatibleModelError", "BatchNorm"),
        ("syncbatchnorm", "IncompatibleModelError", "SyncBatchNorm"),
        ("ddp", "InvalidParameterError", "DistributedDataParallel"),
    ],
)
def test_bad_input_raises_on_every_rank(tmp_path: Path, name: str, error: str, text: str) -> None:
    for result in _spawn(tmp_path, name, 2):
        assert result.get("error") == error, result
        assert text in result["message"]


def test_invalid_input_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    results = _spawn(tmp_path, "invalid_on_one_rank", 2)
    assert results[1]["error"] == "InvalidParameterError"
    assert "sampling_probability" in results[1]["message"]
    assert results[0]["error"] == "InvalidParameterError" and "rank(s) [1]" in results[0]["message"]


def test_parameters_added_on_one_rank_raise_on_every_rank_before_anything_changes(
    tmp_path: Path,
) -> None:
    results = _spawn(tmp_path, "param_added_on_one_rank", 2)
    assert results[1]["error"] == "InvalidParameterError" and "added since" in results[1]["message"]
    assert results[0]["error"] == "InvalidParameterError" and "rank(s) [1]" in results[0]["message"]
    assert all(result["unchanged"] for result in results)


def test_bad_noise_on_rank_0_raises_on_every_rank_before_anything_changes(tmp_path: Path) -> None:
    results = _spawn(tmp_path, "bad_noise_on_rank_0", 2)
    assert results[0]["error"] == "InvalidParameterError" and "shape" in results[0]["message"]
    assert results[1]["error"] == "InvalidParameterError" and "rank 0" in results[1]["message"]
    assert all(result["unchanged"] for result in results)


def test_a_rank_that_stops_makes_the_others_raise_not_hang(tmp_path: Path) -> None:
    results = _spawn(tmp_path, "peer_leaves", 2)
    assert results[0]["error"] == "DistributedTimeoutError"


def test_no_process_group_is_a_clear_error() -> None:
    net = worker.model()
    with pytest.raises(StateError, match="init_process_group"):
        worker.trainer(net)
    with pytest.raises(StateError):
        DistributedDPTrainer(
            net,
            inputs=torch.zeros(2, 3),
            targets=torch.zeros(2),
            loss_fn=lambda o, t: o,
            optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampling_probability=0.5,
        )
