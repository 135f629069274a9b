"""make_private: your own loop over a LotLoader equals DPTrainer, with targets and resumes."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dpcore.calibration import calibrate_noise
from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.loaders import LotLoader, LotLoadError, MicroBatch
from dpcore.torch.private import make_private
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.torch.test_misuse import assert_same
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


# ---------------------------------------------------------------- the optimizer steps what ran
class Records(Dataset[tuple[torch.Tensor, int]]):
    """Records made from their index; with a ``marker`` path, record ``bad`` fails to load once.

    The marker file is created atomically (``O_EXCL``) by the first read, so the record fails
    exactly once across worker processes too (a flaky file read).
    """

    def __init__(self, size: int, marker: str | None = None, bad: int = -1) -> None:
        self.size, self.marker, self.bad = size, marker, bad

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.marker is not None and index == self.bad:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                raise OSError(f"flaky read of record {index}")
        x = torch.tensor([math.sin(index), math.cos(3 * index), index / self.size])
        return x.double(), index % 2


def _mlp_private(  # type: ignore[no-untyped-def]
    dataset: Dataset[Any],
    *,
    q: float = 0.25,
    physical: int | None = 2,
    workers: int = 0,
    engine: str = "fast",
):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    loader = LotLoader(
        dataset,
        sampler=PoissonSampler(len(dataset), sampling_probability=q, seed=5),  # type: ignore[arg-type]
        max_physical_batch_size=physical,
        num_workers=workers,
    )
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        loader,
        loss_fn=CROSS_ENTROPY,
        max_grad_norm=1.0,
        noise_multiplier=0.8,
        engine=engine,
        seed=6,
        **({"jl_dimension": 2} if engine == "jl" else {}),  # type: ignore[arg-type]
    )


def _state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """What a refused step must leave as it was."""
    return {
        "parameters": [p.detach().clone() for p in model.parameters()],
        "optimizer": copy.deepcopy(optimizer.optimizer.state_dict()),
        "loader": optimizer.loader.state_dict(),
        "ledger": optimizer.ledger.state_dict(),
        "noise": copy.deepcopy(optimizer.dp.noise.state_dict()),
    }


def test_item2_the_same_lot_stepped_twice_is_refused_before_anything_changes() -> None:
    model, optimizer, loader = _mlp_private(Records(24), physical=None)
    micros = iter(loader)
    first = next(micros)
    assert optimizer.step(first) is not None
    before = _state(model, optimizer)
    with pytest.raises(InvalidParameterError, match="lot 0 was already stepped"):
        optimizer.step(first)  # its last micro-batch again: a second step on the same lot
    assert_same(before, _state(model, optimizer))
    assert optimizer.step(next(micros)) is not None
    assert optimizer.ledger.steps == 2 and optimizer.ledger.next_lot == 2


def _next_lot(micros: Any) -> list[MicroBatch]:
    lot = [next(micros)]
    while not lot[-1].last:
        lot.append(next(micros))
    return lot


def test_item2_a_duplicate_or_out_of_order_micro_batch_is_refused_and_micro_0_restarts() -> None:
    model, optimizer, loader = _mlp_private(Records(24), physical=1)
    micros = iter(loader)
    lot = _next_lot(micros)
    while len(lot) < 4:  # a lot of at least four micro-batches
        for micro in lot:
            optimizer.step(micro)
        lot = _next_lot(micros)
    assert [m.index for m in lot] == list(range(len(lot)))
    optimizer.step(lot[0])
    optimizer.step(lot[1])
    before = _state(model, optimizer)
    for wrong in (lot[1], lot[3]):  # a duplicate, one out of order
        with pytest.raises(InvalidParameterError, match=f"micro-batch 2 of lot {lot[0].lot} next"):
            optimizer.step(wrong)
        assert_same(before, _state(model, optimizer))
    assert optimizer.step(lot[0]) is None  # micro-batch 0 again: the lot starts again
    with pytest.raises(InvalidParameterError, match="micro-batch 1 of lot"):
        optimizer.step(lot[2])
    results = [optimizer.step(micro) for micro in lot[1:]]
    assert results[-1] is not None and optimizer.ledger.steps == lot[0].lot + 1
    reference, once, loader = _mlp_private(Records(24), physical=1)  # each lot stepped once
    micros = iter(loader)
    while once.ledger.steps < optimizer.ledger.steps:
        once.step(next(micros))
    assert once.ledger == optimizer.ledger
    for found, wanted in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(found, wanted)


def test_item3_a_micro_batch_of_another_loader_or_changed_sampling_is_refused() -> None:
    model, optimizer, loader = _mlp_private(Records(24), q=0.01)
    other = LotLoader(Records(24), sampling_probability=1.0, seed=0)
    micro = next(iter(loader))
    before = _state(model, optimizer)
    foreign = next(iter(other))  # all 24 records: it would be recorded at q = 0.01
    with pytest.raises(InvalidParameterError, match="from another LotLoader"):
        optimizer.step(foreign)
    handmade = MicroBatch(foreign.data, foreign.size, 0, foreign.size, foreign.last)
    assert handmade == foreign  # the loader's token is not part of equality
    with pytest.raises(InvalidParameterError, match="from no LotLoader"):
        optimizer.step(handmade)
    assert_same(before, _state(model, optimizer))
    loader.sampler.sampling_probability = 1.0
    with pytest.raises(InvalidParameterError, match=r"sampling_probability to stay 0\.01"):
        optimizer.step(micro)
    loader.sampler.sampling_probability = 0.01
    sampler = loader.sampler
    loader.sampler = PoissonSampler(24, sampling_probability=0.01, seed=5)
    with pytest.raises(InvalidParameterError, match=r"loader\.sampler to stay"):
        optimizer.step(micro)
    loader.sampler = sampler
    assert_same(before, _state(model, optimizer))
    optimizer.step(micro)
    assert optimizer.ledger.steps == (1 if micro.last else 0)


def test_item4_parameters_added_or_frozen_after_make_private_are_refused_before_clipping() -> None:
    model, optimizer, loader = _mlp_private(Records(24), physical=1)
    micros = iter(loader)
    first = next(micros)
    while first.last:  # a lot of several micro-batches
        optimizer.step(first)
        first = next(micros)
    model.append(nn.Linear(2, 2).double())  # a layer appended and given to the optimizer
    optimizer.optimizer.add_param_group({"params": list(model[3].parameters())})
    before = _state(model, optimizer)
    with pytest.raises(InvalidParameterError, match=r"added since: \['3.weight', '3.bias'\]"):
        optimizer.step(first)  # before the lot's first micro-batch is clipped
    assert_same(before, _state(model, optimizer))
    optimizer.optimizer.param_groups.pop()
    del model[3]
    assert optimizer.step(first) is None
    rest = [next(micros)]
    while not rest[-1].last:
        rest.append(next(micros))
    for micro in rest[:-1]:
        optimizer.step(micro)
    model[0].bias.requires_grad_(False)  # frozen right before the lot's noisy step
    before = _state(model, optimizer)
    with pytest.raises(InvalidParameterError, match=r"frozen since: \['0.bias'\]"):
        optimizer.step(rest[-1])
    assert_same(before, _state(model, optimizer))
    model[0].bias.requires_grad_(True)
    assert optimizer.step(rest[-1]) is not None


def test_item4_a_frozen_layer_unfrozen_and_added_after_make_private_is_refused() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    model[0].requires_grad_(False)  # fine-tuning: the first layer frozen
    loader = LotLoader(Records(24), sampling_probability=0.25, seed=5, max_physical_batch_size=2)
    _, optimizer, loader = make_private(
        model,
        torch.optim.SGD(model[2].parameters(), lr=0.1),
        loader,
        loss_fn=CROSS_ENTROPY,
        max_grad_norm=1.0,
        noise_multiplier=0.8,
        seed=6,
    )
    micros = iter(loader)
    optimizer.step(next(micros))
    model[0].requires_grad_(True)  # unfrozen, and its gradient from the user's own backward()
    optimizer.optimizer.add_param_group({"params": list(model[0].parameters())})
    for parameter in model[0].parameters():
        parameter.grad = torch.ones_like(parameter)
    micro = next(micros)
    before = _state(model, optimizer)
    with pytest.raises(InvalidParameterError, match=r"added since: \['0.weight', '0.bias'\]"):
        optimizer.step(micro)
    assert_same(before, _state(model, optimizer))


def test_item5_a_step_the_ledger_would_refuse_does_not_run() -> None:
    model, optimizer, loader = _mlp_private(Records(24), physical=None)
    micro = next(iter(loader))
    optimizer.dp.noise_multiplier = 0.0  # noise and a parameter update, then a refused record
    before = _state(model, optimizer)
    with pytest.raises(InvalidParameterError, match="Expected noise_multiplier > 0"):
        optimizer.step(micro)
    assert_same(before, _state(model, optimizer))  # no noise drawn, no parameter moved
    optimizer.dp.noise_multiplier = 0.8
    assert optimizer.step(micro) is not None and optimizer.ledger.steps == 1


def test_item6_a_loop_that_skips_empty_lots_is_told_to_step_them() -> None:
    _, optimizer, loader = _mlp_private(Records(24), q=0.05)
    stepped = []
    with pytest.raises(InvalidParameterError, match=r"an empty one \(micro.data is None"):
        for micro in loader:
            if micro.data is None:  # the user's loop skips empty lots
                continue
            if optimizer.step(micro) is not None:
                stepped.append(micro.lot)
    assert stepped == list(range(len(stepped)))  # the lots before the first empty one
    assert optimizer.ledger.steps == len(stepped)
    _, optimizer, loader = _mlp_private(Records(24), q=0.05)
    for micro in loader:  # stepping every micro-batch, empty lots included, runs the epoch
        optimizer.step(micro)
    assert optimizer.ledger.steps == len(loader) == 20


def _run_retrying(optimizer: Any, loader: LotLoader, lots: int) -> tuple[int, bool]:
    """Step ``lots`` lots, iterating the loader again after a failed load; (failures, partial)."""
    failures, partial, last = 0, False, None
    while optimizer.ledger.steps < lots:
        try:
            for micro in loader:
                optimizer.step(micro)
                last = micro
                if optimizer.ledger.steps == lots:
                    break
        except LotLoadError as error:
            assert isinstance(error.__cause__, OSError) and "flaky read" in str(error)
            failures += 1
            partial = last is not None and last.lot == error.lot and not last.last
    return failures, partial


@pytest.mark.parametrize(("workers", "engine"), [(0, "fast"), (2, "fast"), (0, "jl")])
def test_item7_a_lot_whose_record_fails_to_load_is_retried_and_counted_once(
    workers: int, engine: str, tmp_path: Path
) -> None:
    model, optimizer, loader = _mlp_private(Records(24), engine=engine)
    assert _run_retrying(optimizer, loader, 8) == (0, False)
    flaky_model, flaky, flaky_loader = _mlp_private(
        Records(24, marker=str(tmp_path / "failed"), bad=16), engine=engine, workers=workers
    )
    failures, partial = _run_retrying(flaky, flaky_loader, 8)
    assert failures == 1 and partial  # it failed mid-lot: a partial sum was discarded
    assert flaky.ledger.steps == 8 and flaky.ledger == optimizer.ledger
    for found, wanted in zip(flaky_model.parameters(), model.parameters(), strict=True):
        assert torch.equal(found, wanted)


def _micro_batches(loader: LotLoader):  # type: ignore[no-untyped-def]
    """The loader's micro-batches, epoch after epoch."""
    while True:
        yield from loader


def _lr_trajectory(optimizer: torch.optim.Optimizer, make, lots: int, step) -> list[float]:  # type: ignore[no-untyped-def]
    scheduler = make(optimizer)
    rates = [optimizer.param_groups[0]["lr"]]
    for _ in range(lots):
        step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    return rates


@pytest.mark.parametrize(
    "make",
    [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.3, total_steps=6),
    ],
    ids=["StepLR", "OneCycleLR"],
)
def test_torch_schedulers_drive_the_private_optimizer_as_a_plain_one(make) -> None:  # type: ignore[no-untyped-def]
    _, optimizer, loader = _private(None)
    assert isinstance(optimizer, torch.optim.Optimizer)
    lots = _micro_batches(loader)

    def private_step() -> None:
        while optimizer.step(next(lots)) is None:
            pass

    found = _lr_trajectory(optimizer, make, 6, private_step)
    plain_model = ZOO["positional_gpt"]()
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.1)
    wanted = _lr_trajectory(plain, make, 6, lambda: plain.step())
    assert found == wanted
    assert len(set(found)) > 2  # the rate did change
    # the changes reach the wrapped optimizer, which steps with them
    assert optimizer.optimizer.param_groups[0]["lr"] == found[-1]
    assert optimizer.param_groups is optimizer.optimizer.param_groups
    assert optimizer.defaults is optimizer.optimizer.defaults
    assert optimizer.ledger.steps == 6


def test_a_zero_learning_rate_from_a_scheduler_stops_the_updates() -> None:
    model, optimizer, loader = _private(None)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.0)
    lots = _micro_batches(loader)
    before = [p.detach().clone() for p in model.parameters()]
    while optimizer.step(next(lots)) is None:
        pass
    scheduler.step()
    moved = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, moved, strict=True))
    while optimizer.step(next(lots)) is None:
        pass
    for a, b in zip(moved, model.parameters(), strict=True):
        assert torch.equal(a, b)  # lr 0: the noisy gradient moved nothing


def test_optimizer_protocol_state_dict_zero_grad_and_no_double_wrap() -> None:
    model, optimizer, loader = _private(None)
    _run(optimizer, loader, 2)
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())
    state = optimizer.state_dict()
    assert set(state) >= {"optimizer", "loader", "ledger"}  # the checkpoint, not torch's
    _, again, loader2 = _private(None)
    again.load_state_dict(state)
    assert again.param_groups is again.optimizer.param_groups  # still shared after a load
    assert again.state is again.optimizer.state
    assert again.ledger == optimizer.ledger
    with pytest.raises(InvalidParameterError, match="already private"):
        make_private(
            model,
            optimizer,
            loader2,
            loss_fn=CROSS_ENTROPY,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
        )


def _planned(policy: str):  # type: ignore[no-untyped-def]
    """Calibrated to epsilon = 2 over 2 epochs (4 lots each)."""
    return _private(
        None,
        noise_multiplier=None,
        target_epsilon=2.0,
        target_delta=1e-5,
        epochs=2,
        budget=policy,
    )


def test_budget_resumed_at_an_epochs_last_lot_refuses_or_warns_a_third_epoch() -> None:
    from dpcore.torch.budget import BudgetExceededError, BudgetExceededWarning

    model, optimizer, loader = _planned("stop")
    _run(optimizer, loader, 2 * len(loader))  # the plan: no warning (warnings are errors here)
    assert optimizer.epsilon(delta=1e-5) <= 2.0
    state = optimizer.state_dict()  # at the second epoch's last lot
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    model, resumed, loader = _planned("stop")
    model.load_state_dict(weights)
    resumed.load_state_dict(state)
    before = copy.deepcopy(resumed.ledger)
    with pytest.raises(BudgetExceededError, match=r"Step 9 would take epsilon to .*past the plan"):
        resumed.step(next(iter(loader)))
    assert resumed.ledger == before  # nothing recorded, nothing moved
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name])

    _, warned, loader = _planned("warn")
    warned.load_state_dict(state)
    with pytest.warns(BudgetExceededWarning, match="target_epsilon = 2"):
        _run(warned, loader, 1)
    _run(warned, loader, 1)  # warned once: the next lot is quiet
    assert warned.ledger.steps == 10
    assert warned.epsilon(delta=1e-5) > 2.0


def test_budget_allows_exactly_the_planned_steps_without_recomputing() -> None:
    from dpcore.torch.budget import PrivacyBudget

    _, optimizer, loader = _planned("stop")
    budget = optimizer.budget
    assert isinstance(budget, PrivacyBudget)
    _run(optimizer, loader, 1)
    allowance = budget._allowance
    assert allowance is not None and allowance[2] == 2 * len(loader)
    with pytest.raises(InvalidParameterError, match="Expected budget in"):
        _planned("halt")


class _TinyBert(nn.Module):
    """Hugging Face-shaped: ``model(input_ids=..., attention_mask=...)``, masked mean pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(self.embed.weight.dtype)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.head(pooled)


def _dict_records(key: str = "labels") -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(4)
    records = []
    for _ in range(N):
        length = int(torch.randint(2, 6, (), generator=generator))
        ids = torch.randint(1, 11, (6,), generator=generator)
        mask = (torch.arange(6) < length).long()
        records.append({"input_ids": ids * mask, "attention_mask": mask, key: ids[0] % 2})
    return records


def _dict_private(key: str = "labels", **options: object):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = _TinyBert()
    loader = LotLoader(
        _dict_records(key),
        sampler=PoissonSampler(N, sampling_probability=Q, seed=5),
        max_physical_batch_size=4,
    )
    return make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        loss_fn=CROSS_ENTROPY,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        engine="vmap",
        seed=1,
        **options,  # type: ignore[arg-type]
    )


def test_dict_batches_call_model_with_every_entry_and_take_labels_by_key() -> None:
    _, optimizer, loader = _dict_private()
    results = _run(optimizer, loader, 3)  # forward() needs the mask: dropping it would fail
    assert optimizer.ledger.steps == 3
    assert all(math.isfinite(r.loss) for r in results if r.lot_size)
    _, other, loader = _dict_private("target", target_key="target")
    assert len(_run(other, loader, 2)) == 2
    with pytest.raises(InvalidParameterError, match=r"the batch has \['attention_mask'"):
        _dict_private("target")  # no 'labels': the keys are named
    with pytest.raises(InvalidParameterError, match="target_key"):
        _dict_private(target_key="labels", split=lambda b: (b, b))


def test_opacus_loop_habits_get_one_line_typed_errors_and_familiar_names() -> None:
    from dpcore.torch.errors import LoopUsageError

    model, optimizer, loader = _private(None)
    micro = next(iter(loader))
    with pytest.raises(LoopUsageError, match=r"optimizer\.step\(micro\)") as caught:
        _, _ = micro  # Opacus: for x, y in loader
    assert "\n" not in str(caught.value)
    before = copy.deepcopy(optimizer.ledger)
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(LoopUsageError, match=r"optimizer\.step\(micro\) for each micro-batch"):
        optimizer.step()  # Opacus: loss.backward(); optimizer.step()
    assert optimizer.ledger == before
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
    assert optimizer.max_grad_norm == 0.5
    assert optimizer.expected_batch_size == pytest.approx(Q * N)
    assert loader.sample_rate == Q


class _HuggingFaceShaped(_TinyBert):
    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        return {"logits": super().forward(input_ids, attention_mask)}


def test_accuracy_reads_the_logits_of_hugging_face_outputs() -> None:
    torch.manual_seed(0)
    model = _HuggingFaceShaped()
    loader = LotLoader(_dict_records(), sampler=PoissonSampler(N, sampling_probability=Q, seed=5))
    _, optimizer, loader = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        loss_fn=lambda outputs, labels: CROSS_ENTROPY(outputs["logits"], labels),
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        engine="vmap",
        seed=1,
    )
    results = [r for r in _run(optimizer, loader, 3) if r.lot_size]
    assert results and all(0.0 <= r.accuracy <= 1.0 for r in results)


def test_a_deep_copy_of_the_private_optimizer_keeps_everything() -> None:
    _, optimizer, loader = _private(None)
    _run(optimizer, loader, 1)
    twin = copy.deepcopy(optimizer)
    assert twin.ledger == optimizer.ledger and twin.ledger is not optimizer.ledger
    assert twin.max_grad_norm == optimizer.max_grad_norm
    assert twin.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
