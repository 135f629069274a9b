"""Checkpoint loads are atomic and validated: a foreign or damaged state is a StateError, and
nothing (parameters, optimizer, noise, sampler, ledger, RNG) changed when it is refused."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpcore.errors import StateError
from dpcore.torch.checkpoint import INTEGRITY, content_digest, seal
from dpcore.torch.loaders import LotLoader
from dpcore.torch.private import PrivateOptimizer, make_private
from dpcore.torch.samplers import (
    BallsInBinsSampler,
    PoissonMismatchWarning,
    PoissonSampler,
    ShuffledBatchSampler,
)
from dpcore.torch.training import DPTrainer

N = 64
LOSS = nn.CrossEntropyLoss(reduction="none")


def _data(n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    return inputs, (inputs[:, 0] > 0).long()


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2)).double()


def _sampler(kind: str, n: int, steps: int) -> Any:
    if kind == "poisson":
        return PoissonSampler(n, sampling_probability=1 / steps, seed=3)
    if kind == "balls_in_bins":
        return BallsInBinsSampler(n, steps_per_epoch=steps, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoissonMismatchWarning)
        return ShuffledBatchSampler(n, batch_size=n // steps, seed=3)


def _trainer(
    *, width: int = 8, kind: str = "balls_in_bins", n: int = N, steps: int = 4, engine: str = "fast"
) -> DPTrainer:
    inputs, targets = _data(n)
    options: dict[str, Any] = {"jl_dimension": 2} if engine == "jl" else {}
    trainer = DPTrainer.dp_adam(
        _model(width),
        lr=0.01,
        inputs=inputs,
        targets=targets,
        loss_fn=LOSS,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=_sampler(kind, n, steps),
        engine=engine,
        seed=11,
        **options,
    )
    trainer.train(steps=2, delta=1e-5, progress=False)  # optimizer, sampler and ledger have state
    return trainer


def _private(*, width: int = 8, kind: str = "poisson", n: int = N, steps: int = 4) -> Any:
    inputs, targets = _data(n)
    model = _model(width)
    loader = LotLoader(TensorDataset(inputs, targets), sampler=_sampler(kind, n, steps))
    _, optimizer, _ = make_private(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        loader,
        loss_fn=LOSS,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        engine="fast",
        seed=6,
    )
    stepped = 0
    for micro in loader:
        if optimizer.step(micro) is not None:
            stepped += 1
            if stepped == 2:
                break
    return model, optimizer


def _fingerprint(owner: DPTrainer | PrivateOptimizer, model: nn.Module) -> list[Any]:
    """Everything a load could change, copied."""
    dp = owner.optimizer if isinstance(owner, DPTrainer) else owner.dp
    sampler = owner.sampler if isinstance(owner, DPTrainer) else owner.loader.sampler
    parts = [
        [p.detach().clone() for p in model.parameters()],
        copy.deepcopy(dp.optimizer.state_dict()),
        dp.noise.state_dict(),
        sampler.state_dict(),
        owner.ledger.state_dict(),
        torch.get_rng_state(),
    ]
    if isinstance(owner, PrivateOptimizer):
        parts.append(owner.loader.state_dict())
    directions = getattr(owner.engine, "directions", None)
    if directions is not None:
        parts.append(directions.state_dict())
    return parts


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _resealed(state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """``state`` edited, with a fresh digest (so that the check after the digest is tested)."""
    edited = copy.deepcopy(state)
    edit(edited)
    del edited[INTEGRITY]
    return seal(edited)


def _edited(state: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """``state`` edited behind the digest's back."""
    edited = copy.deepcopy(state)
    edit(edited)
    return edited


def _flip_bit(tensor: torch.Tensor) -> None:
    tensor.view(-1)[:1].view(torch.uint8)[0] ^= 1


def _sigma_100(state: dict[str, Any]) -> None:
    event = state["runs"][0]["event"]["event"]
    assert event["noise_multiplier"] == 1.0
    event["noise_multiplier"] = 100.0


def _malformed_ledger(state: dict[str, Any]) -> None:
    state["runs"][0]["count"] = -3


# ------------------------------------------------------------------------------- DPTrainer
TRAINER_FOREIGN: dict[str, tuple[Callable[[], DPTrainer], str]] = {
    "other_model_width": (lambda: _trainer(width=16), "model"),
    "other_sampler_kind": (lambda: _trainer(kind="poisson"), "kind"),
    "other_dataset_size": (lambda: _trainer(n=48), "dataset_size"),
    "other_steps_per_epoch": (lambda: _trainer(steps=8), "steps_per_epoch"),
    "jl_into_exact": (lambda: _trainer(engine="jl"), "JL"),
}


@pytest.mark.parametrize("case", sorted(TRAINER_FOREIGN))
def test_item8_trainer_refuses_a_foreign_checkpoint_and_changes_nothing(case: str) -> None:
    build, message = TRAINER_FOREIGN[case]
    foreign = build().state_dict()
    trainer = _trainer()
    before = _fingerprint(trainer, trainer.model)
    with pytest.raises(StateError, match=message):
        trainer.load_state_dict(foreign)
    assert _same(before, _fingerprint(trainer, trainer.model))


TRAINER_DAMAGED: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "malformed_ledger": (
        lambda s: _resealed(s, lambda t: _malformed_ledger(t["ledger"])),
        "Malformed ledger",
    ),
    "flipped_bit": (
        lambda s: _edited(s, lambda t: _flip_bit(t["model"]["0.weight"])),
        "integrity check failed",
    ),
    "edited_sigma": (
        lambda s: _edited(s, lambda t: _sigma_100(t["ledger"])),
        "integrity check failed",
    ),
    "missing_key": (lambda s: _resealed(s, lambda t: t.pop("sampler")), "lacks 'sampler'"),
    "missing_digest": (lambda s: _edited(s, lambda t: t.pop(INTEGRITY)), "integrity"),
    "ledger_of_another_length": (
        lambda s: _resealed(s, lambda t: t["ledger"]["runs"][0].update(count=7)),
        "lots",
    ),
    "optimizer_of_another_class": (
        lambda s: _resealed(s, lambda t: t["optimizer"].update(optimizer_class="SGD")),
        "SGD",
    ),
    "noise_of_another_kind": (
        lambda s: _resealed(s, lambda t: t["optimizer"].update(noise={"name": "secure"})),
        "secure",
    ),
    "bins_out_of_range": (
        lambda s: _resealed(s, lambda t: t["sampler"]["bins"].fill_(9)),
        "bins",
    ),
}


@pytest.mark.parametrize("case", sorted(TRAINER_DAMAGED))
def test_item8_trainer_refuses_a_damaged_checkpoint_and_changes_nothing(
    case: str, tmp_path: Path
) -> None:
    damage, message = TRAINER_DAMAGED[case]
    source = _trainer()
    source.train(steps=1, delta=1e-5, progress=False)  # a state the trainer below is not in
    path = tmp_path / "damaged.pt"
    torch.save(damage(source.state_dict()), path)
    trainer = _trainer()
    before = _fingerprint(trainer, trainer.model)
    with pytest.raises(StateError, match=message):
        trainer.load_checkpoint(path)
    assert _same(before, _fingerprint(trainer, trainer.model))
    source.load_state_dict(source.state_dict())  # the undamaged state loads


def test_item8_trainer_state_dict_is_a_sealed_snapshot_that_rolls_back(tmp_path: Path) -> None:
    """Training on after state_dict() changes neither the state nor its digest; loading it back
    resumes bit for bit, from memory and from a file."""
    trainer = _trainer()
    state = trainer.state_dict()
    trainer.save_checkpoint(tmp_path / "run.pt")
    after = [trainer.step() for _ in range(3)]
    expected = _fingerprint(trainer, trainer.model)
    assert state[INTEGRITY]["digest"] == content_digest(state)
    trainer.load_state_dict(state)
    assert trainer.steps_done == 2
    assert [trainer.step() for _ in range(3)] == after
    assert _same(expected, _fingerprint(trainer, trainer.model))
    trainer.load_checkpoint(tmp_path / "run.pt")
    assert [trainer.step() for _ in range(3)] == after
    assert _same(expected, _fingerprint(trainer, trainer.model))


def test_item8_a_dataset_of_another_size_is_refused_at_load_for_every_sampler() -> None:
    """Before: IndexError at a later step (shuffled, balls in bins) or silently the old N."""
    for kind in ("poisson", "balls_in_bins", "shuffled_fixed_size"):
        state = _trainer(kind=kind, n=48).state_dict()
        trainer = _trainer(kind=kind)
        with pytest.raises(StateError, match="dataset_size"):
            trainer.load_state_dict(state)


# ------------------------------------------------------------------------ PrivateOptimizer
PRIVATE_FOREIGN: dict[str, tuple[Callable[[], Any], str]] = {
    "other_model_width": (lambda: _private(width=16), "shape"),
    "other_sampler_kind": (lambda: _private(kind="shuffled_fixed_size"), "kind"),
    "other_dataset_size": (lambda: _private(n=48), "dataset_size"),
    "other_steps_per_epoch": (lambda: _private(steps=8), "sampling_probability"),
}


@pytest.mark.parametrize("case", sorted(PRIVATE_FOREIGN))
def test_item8_private_optimizer_refuses_a_foreign_state_and_changes_nothing(case: str) -> None:
    build, message = PRIVATE_FOREIGN[case]
    foreign = build()[1].state_dict()
    model, optimizer = _private()
    before = _fingerprint(optimizer, model)
    with pytest.raises(StateError, match=message):
        optimizer.load_state_dict(foreign)
    assert _same(before, _fingerprint(optimizer, model))


def _flip_optimizer_bit(state: dict[str, Any]) -> None:
    _flip_bit(state["optimizer"]["optimizer"]["state"][0]["exp_avg"])


PRIVATE_DAMAGED: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "malformed_ledger": (
        lambda s: _resealed(s, lambda t: _malformed_ledger(t["ledger"])),
        "Malformed ledger",
    ),
    "flipped_bit": (lambda s: _edited(s, _flip_optimizer_bit), "integrity check failed"),
    "edited_sigma": (
        lambda s: _edited(s, lambda t: _sigma_100(t["ledger"])),
        "integrity check failed",
    ),
    "missing_key": (lambda s: _resealed(s, lambda t: t.pop("loader")), "lacks 'loader'"),
    "missing_digest": (lambda s: _edited(s, lambda t: t.pop(INTEGRITY)), "integrity"),
    "ledger_of_another_length": (
        lambda s: _resealed(s, lambda t: t["ledger"]["runs"][0].update(count=7)),
        "lots",
    ),
}


@pytest.mark.parametrize("case", sorted(PRIVATE_DAMAGED))
def test_item8_private_optimizer_refuses_a_damaged_state_and_changes_nothing(
    case: str, tmp_path: Path
) -> None:
    damage, message = PRIVATE_DAMAGED[case]
    path = tmp_path / "damaged.pt"
    torch.save(damage(_private()[1].state_dict()), path)
    model, optimizer = _private()
    for micro in optimizer.loader:  # one more lot: the state on file is not the current one
        if optimizer.step(micro) is not None:
            break
    before = _fingerprint(optimizer, model)
    with pytest.raises(StateError, match=message):
        optimizer.load_state_dict(torch.load(path, weights_only=True))
    assert _same(before, _fingerprint(optimizer, model))


def test_item8_private_optimizer_state_is_a_sealed_snapshot_that_resumes() -> None:
    model, optimizer = _private()
    state = optimizer.state_dict()
    parameters = [p.detach().clone() for p in model.parameters()]

    def two_lots() -> list[Any]:
        results = []
        for micro in optimizer.loader:
            result = optimizer.step(micro)
            if result is not None:
                results.append(result)
                if len(results) == 2:
                    break
        return results

    first = two_lots()
    expected = _fingerprint(optimizer, model)
    assert state[INTEGRITY]["digest"] == content_digest(state)
    with torch.no_grad():
        for parameter, saved in zip(model.parameters(), parameters, strict=True):
            parameter.copy_(saved)
    optimizer.load_state_dict(state)
    assert two_lots() == first
    resumed = _fingerprint(optimizer, model)
    del expected[5], resumed[5]  # torch's global RNG: the DataLoader draws its base seed there
    assert _same(expected, resumed)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [leaf for key in value for leaf in _leaves(value[key], (*path, key))]
    if isinstance(value, list) and value:
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, (*path, i))]
    return [path]


def _replaced(state: Any, path: tuple[Any, ...], value: Any) -> Any:
    """``state`` with the entry at ``path`` replaced (containers on the path copied, the rest
    shared)."""
    if not path:
        return value
    copied = copy.copy(state)
    copied[path[0]] = _replaced(state[path[0]], path[1:], value)
    return copied


REPLACEMENTS = [
    None,
    -1,
    2**70,
    1e300,
    "x",
    [],
    {},
    torch.zeros(3),
    torch.zeros(2, dtype=torch.uint8),
]


@pytest.mark.parametrize("owner", ["trainer", "private"])
def test_item8_every_entry_replaced_by_junk_is_refused_typed_or_loaded(owner: str) -> None:
    """Each leaf of a correct (resealed) state replaced by junk of another type or shape: the load
    succeeds or raises StateError, never another error, and a refused load changes nothing."""
    if owner == "trainer":
        trainer = _trainer()
        target, model, state = trainer, trainer.model, _trainer().state_dict()
    else:
        model, target = _private()
        state = _private()[1].state_dict()
    refused = 0
    before = _fingerprint(target, model)
    for path in _leaves({k: v for k, v in state.items() if k != INTEGRITY}):
        for junk in REPLACEMENTS:
            edited = _replaced(state, path, junk)
            del edited[INTEGRITY]
            try:
                target.load_state_dict(seal(edited))
            except StateError:
                refused += 1
                assert _same(before, _fingerprint(target, model)), (path, junk)
            else:  # junk that fits (e.g. another learning rate): the new state is the reference
                before = _fingerprint(target, model)
    assert refused > 0


def test_item8_component_loads_refuse_junk_typed() -> None:
    """The parts' own loaders (noise, DP optimizer, loader and its sampler, ledger), given a
    state with one entry replaced by junk, or junk instead of a state: StateError or a load."""
    from dpcore.ledger import PrivacyLedger

    _, optimizer = _private()
    parts: dict[str, tuple[Callable[[Any], Any], dict[str, Any]]] = {
        "noise": (optimizer.dp.noise.load_state_dict, optimizer.dp.noise.state_dict()),
        "dp_optimizer": (optimizer.dp.load_state_dict, optimizer.dp.state_dict()),
        "loader": (optimizer.loader.load_state_dict, optimizer.loader.state_dict()),
        "ledger": (PrivacyLedger.from_state_dict, optimizer.ledger.state_dict()),
    }
    for name, (load, state) in parts.items():
        junk_states = [
            _replaced(state, path, junk) for path in _leaves(state) for junk in REPLACEMENTS
        ]
        for junk_state in [*junk_states, *REPLACEMENTS]:
            try:
                load(junk_state)
            except StateError:
                pass
            except Exception as error:  # pragma: no cover - the failure this test looks for
                raise AssertionError(f"{name}: {type(error).__name__}: {error}") from error


def test_item8_private_optimizer_refuses_to_load_in_the_middle_of_a_lot() -> None:
    """Loading between two micro-batches of a lot would mix the half lot's clipped sum into the
    loaded run: refused, with nothing changed."""
    inputs, targets = _data()
    model = _model(8)
    loader = LotLoader(
        TensorDataset(inputs, targets),
        sampler=_sampler("poisson", N, 4),
        max_physical_batch_size=2,
    )
    _, optimizer, _ = make_private(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        loader,
        loss_fn=LOSS,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        engine="fast",
        seed=6,
    )
    state = optimizer.state_dict()
    micro = next(m for m in loader if not m.last)
    assert optimizer.step(micro) is None  # half a lot
    before = _fingerprint(optimizer, model)
    with pytest.raises(StateError, match="half processed"):
        optimizer.load_state_dict(state)
    assert _same(before, _fingerprint(optimizer, model))
