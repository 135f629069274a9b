"""make_private: your own loop over a LotLoader equals DPTrainer, with targets and resumes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.loaders import LotLoader
from dpcore.torch.private import make_private
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.torch.zoo import ZOO

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
N, Q = 48, 0.25


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return ZOO["positional_gpt"]().make_batch(N, seed=9)


def _private(physical: int | None, engine: str = "auto", **options: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = ZOO["positional_gpt"]()
    inputs, targets = _data()
    loader = LotLoader(
        TensorDataset(inputs, targets),
        sampler=PoissonSampler(N, sampling_probability=Q, seed=5),
        max_physical_batch_size=physical,
    )
    settings = {"noise_multiplier": 0.8, **options}
    if engine == "jl":
        settings["jl_dimension"] = 2
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        loss_fn=CROSS_ENTROPY,
        max_grad_norm=0.5,
        engine=engine,
        seed=6,
        **settings,  # type: ignore[arg-type]
    )


def _run(optimizer, loader, lots: int) -> list:  # type: ignore[no-untyped-def]
    results = []
    while len(results) < lots:  # over epochs (round(1 / q) lots each)
        for micro in loader:
            result = optimizer.step(micro)
            if result is not None:
                results.append(result)
                if len(results) == lots:
                    break
    return results


@pytest.mark.parametrize("physical", [None, 2])
def test_own_loop_over_a_loader_equals_the_trainer_on_tensors(physical: int | None) -> None:
    model, optimizer, loader = _private(physical)
    results = _run(optimizer, loader, 6)  # the model is trained in place
    torch.manual_seed(0)
    reference = ZOO["positional_gpt"]()
    inputs, targets = _data()
    trainer = DPTrainer.dp_sgd(
        reference,
        lr=0.1,
        inputs=inputs,
        targets=targets,
        loss_fn=CROSS_ENTROPY,
        noise_multiplier=0.8,
        max_grad_norm=0.5,
        sampler=PoissonSampler(N, sampling_probability=Q, seed=5),
        seed=6,
    )
    expected = trainer.train(steps=6, delta=1e-5, progress=False)
    assert [r.lot_size for r in results] == [r.lot_size for r in expected]
    for found, wanted in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(found, wanted, atol=1e-10, rtol=0)
    assert optimizer.ledger == trainer.ledger
    statement = optimizer.privacy_statement(delta=1e-5)
    assert statement["run"]["max_physical_batch_size"] == physical
    assert statement["run"]["engine"] == "fast"


def test_virtual_lots_give_the_same_parameters_on_jl() -> None:
    parameters = []
    for physical in (None, 3):
        model, optimizer, loader = _private(physical, engine="jl")
        _run(optimizer, loader, 4)
        parameters.append([p.detach().clone() for p in model.parameters()])
    for found, wanted in zip(*parameters, strict=True):
        torch.testing.assert_close(found, wanted, atol=1e-10, rtol=0)


def test_target_epsilon_is_calibrated_with_the_certified_pld_and_met() -> None:
    _, optimizer, loader = _private(
        4, noise_multiplier=None, target_epsilon=5.0, target_delta=1e-5, epochs=2
    )
    sigma = calibrate_noise(
        target_epsilon=5.0,
        target_delta=1e-5,
        sampling_probability=Q,
        steps=2 * len(loader),
        accountant="pld",
    )
    assert optimizer.noise_multiplier == sigma
    for _ in range(2):
        for micro in loader:
            optimizer.step(micro)
    assert optimizer.ledger.steps == 2 * len(loader)
    assert optimizer.epsilon(delta=1e-5, accountant="pld") <= 5.0


def test_resume_mid_epoch_gives_the_uninterrupted_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, optimizer, loader = _private(2)
    _run(optimizer, loader, 6)
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    model, optimizer, loader = _private(2)
    _run(optimizer, loader, 3)
    with pytest.raises(StateError, match="half processed"):
        micro = next(m for m in loader if not m.last)
        optimizer.step(micro)
        optimizer.state_dict()
    path = tmp_path / "run.pt"
    model, optimizer, loader = _private(2)
    _run(optimizer, loader, 3)
    torch.save({"model": model.state_dict(), "private": optimizer.state_dict()}, path)
    model, optimizer, loader = _private(2)
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["private"])
    _run(optimizer, loader, 3)
    assert optimizer.ledger.steps == 6
    for found, wanted in zip(model.parameters(), uninterrupted, strict=True):
        torch.testing.assert_close(found, wanted, atol=1e-12, rtol=0)


def test_bad_inputs_are_refused() -> None:
    torch.manual_seed(0)
    model = ZOO["positional_gpt"]()
    inputs, targets = _data()
    data = TensorDataset(inputs, targets)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = LotLoader(data, sampler=PoissonSampler(N, sampling_probability=Q, seed=0))
    common = {"loss_fn": CROSS_ENTROPY, "max_grad_norm": 1.0}
    with pytest.raises(InvalidParameterError, match="batch_size/shuffle"):
        make_private(
            model, sgd, DataLoader(data, batch_size=8, shuffle=True), noise_multiplier=1.0, **common
        )  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        make_private(model, sgd, loader, **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        make_private(model, sgd, loader, noise_multiplier=1.0, target_epsilon=1.0, **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="epochs"):
        make_private(model, sgd, loader, target_epsilon=1.0, target_delta=1e-5, **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="loss_fn"):
        make_private(
            model,
            sgd,
            loader,
            noise_multiplier=1.0,
            loss_fn=nn.CrossEntropyLoss(),
            max_grad_norm=1.0,
        )
    with pytest.raises(InvalidParameterError, match="split"):
        make_private(
            model,
            sgd,
            LotLoader(TensorDataset(inputs), sampler=PoissonSampler(N, sampling_probability=Q)),
            noise_multiplier=1.0,
            **common,  # type: ignore[arg-type]
        )
    _, private, loader = make_private(model, sgd, loader, noise_multiplier=1.0, **common)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="MicroBatch"):
        private.step((inputs[:2], targets[:2]))  # type: ignore[arg-type]


def test_a_model_whose_examples_interact_is_refused_before_training() -> None:
    class Mixing(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2, dtype=torch.float64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.linear(x)
            return out - out.mean(0)

    model = Mixing()
    data = TensorDataset(torch.randn(20, 3, dtype=torch.float64), torch.randint(0, 2, (20,)))
    loader = LotLoader(data, sampler=PoissonSampler(20, sampling_probability=0.2, seed=0))
    with pytest.raises(IncompatibleModelError, match="interact"):
        make_private(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader,
            loss_fn=CROSS_ENTROPY,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
        )
