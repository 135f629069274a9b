"""The initialisation check of Bu et al. 2019's MNIST setting, on generated images."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import initialisation
from reproductions.bu2019_gdp.data import TaskData
from reproductions.bu2019_gdp.models import mnist_cnn
from reproductions.harness import Output


def _tiny() -> TaskData:
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(96, 1, 28, 28, generator=generator)
    y = torch.randint(0, 10, (96,), generator=generator)
    return TaskData(x[:64], y[:64], x[64:], y[64:], {})


def test_keras_init_is_glorot_uniform_with_zero_biases() -> None:
    model = mnist_cnn()
    initialisation.keras_init(model, seed=1)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(module.weight)
            bound = (6.0 / (fan_in + fan_out)) ** 0.5  # Glorot & Bengio 2010, Eq. 16
            assert module.bias is not None and bool(module.bias.eq(0).all())
            assert module.weight.abs().max() <= bound
            # uniform on [-bound, bound]: variance bound^2 / 3 (loosely, large layers only)
            if module.weight.numel() > 4000:
                assert abs(module.weight.var().item() / (bound**2 / 3) - 1) < 0.1
    again = mnist_cnn()
    initialisation.keras_init(again, seed=1)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )


def test_compute_trains_both_initialisations(tmp_path: Path) -> None:
    output = Output.under(tmp_path)
    config = dataclasses.replace(initialisation.PROFILES["quick"], seeds=(0, 1))
    initialisation.compute(config=config, loader=_tiny, output=output)
    saved = output.load_results(initialisation.STEM)
    assert saved["paper_accuracy"] == 0.95  # Bu et al. 2020, Table 1 (sigma 1.3, 15 epochs)
    assert {(row["init"], row["seed"]) for row in saved["rows"]} == {
        (init, seed) for init in initialisation.INITS for seed in (0, 1)
    }
    for init in initialisation.INITS:
        item = saved["summary"][init]
        assert set(item["final_accuracy"]) == {"0", "1"} and item["unfinished"] == {}
        assert 0.0 <= item["mean"] <= 1.0


def test_runs_fanned_out_on_threads_give_the_in_process_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both initialisations and seeds trained at once on a thread pool, into the run store,
    give the rows trained here one after another; run again on the same store, nothing trains."""
    config = dataclasses.replace(initialisation.PROFILES["quick"], seeds=(0, 1))
    here, threads = Output.under(tmp_path / "here"), Output.under(tmp_path / "threads")
    initialisation.compute(config=config, loader=_tiny, output=here)
    assert not here.runs.exists()  # in process, the quick profile keeps no run store
    with ThreadPoolExecutor(2) as pool:
        initialisation.compute(config=config, loader=_tiny, output=threads, executor=pool)
    ours, theirs = (out.load_results(initialisation.STEM) for out in (here, threads))
    untimed = [
        [{k: v for k, v in r.items() if k != "wall_s"} for r in x["rows"]] for x in (ours, theirs)
    ]
    assert untimed[0] == untimed[1] and len(untimed[0]) == 4
    assert ours["summary"] == theirs["summary"]
    assert theirs["runs_spread"] == "fanned out on ThreadPoolExecutor"
    assert len(list(threads.store(initialisation.STEM).iterdir())) == 4

    def refuse(self: object) -> None:
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(DPTrainer, "step", refuse)
    with ThreadPoolExecutor(2) as pool:
        initialisation.compute(config=config, loader=_tiny, output=threads, executor=pool)
    assert threads.load_results(initialisation.STEM)["rows"] == theirs["rows"]
