"""``engine="auto"`` ends in an exact engine or in one typed error giving each engine's reason."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import (
    EngineFallbackWarning,
    IncompatibleModelError,
    NoExactEngineError,
)
from dpcore.torch.per_example.layer_handlers import LinearHandler
from tests.torch.models import TrainingOnlyPath
from tests.torch.reference import assert_matches_loop, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


class _BranchingOnData(nn.Module):
    """A parameter reached through ``x @ W`` (no fast-path rule) behind a branch on the data
    (which vmap cannot run)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixing = nn.Parameter(torch.randn(4, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if bool(torch.isfinite(inputs).all()):  # a branch on the data, the same for any lot
            inputs = inputs @ self.mixing
        return self.head(inputs)


class _NoDerivative(torch.autograd.Function):
    """An operation whose derivative was never written (a custom kernel's forward only)."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return inputs @ weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        raise NotImplementedError("the kernel's backward is not implemented")


class _Undifferentiable(_BranchingOnData):
    """The data branch (no vmap) and a parameter behind an operation without a derivative."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if bool(torch.isfinite(inputs).all()):
            inputs = _NoDerivative.apply(inputs, self.mixing)
        return self.head(inputs)


def test_a_model_neither_fast_nor_vmap_takes_trains_on_the_loop_engine_exactly() -> None:
    torch.manual_seed(0)
    model = _BranchingOnData().double()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    inputs, targets = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    with pytest.warns(EngineFallbackWarning, match="loop engine") as warned:
        engine.prepare(inputs, targets, CROSS_ENTROPY)
    message = str(warned[0].message)
    assert "'mixing'" in message and "torch.func.vmap" in message  # both reasons given
    assert engine.name == "loop"
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, 1e-12)


def test_a_model_no_engine_takes_gets_one_typed_error_with_each_reason() -> None:
    torch.manual_seed(0)
    engine = make_engine(_Undifferentiable(), engine="auto", max_grad_norm=1.0)
    with pytest.raises(NoExactEngineError) as refused:
        engine.prepare(torch.randn(6, 4), torch.randint(0, 2, (6,)), CROSS_ENTROPY)
    error = refused.value
    assert isinstance(error, IncompatibleModelError)
    assert set(error.reasons) == {"fast", "vmap", "loop"}
    assert "'mixing'" in error.reasons["fast"]
    assert "torch.func.vmap" in error.reasons["vmap"]
    assert "backward is not implemented" in error.reasons["loop"]
    assert error.parameters == ["mixing"]
    message = str(error)
    assert all(f"- {name}: {reason}" in message for name, reason in error.reasons.items())
    copy = pickle.loads(pickle.dumps(error))  # travels from a worker process intact
    assert (type(copy), copy.reasons, copy.parameters, str(copy)) == (
        NoExactEngineError,
        error.reasons,
        error.parameters,
        message,
    )
    assert not engine.prepared


def test_a_layer_configuration_the_fast_path_refuses_falls_back_to_vmap() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(7, 3, scale_grad_by_freq=True), nn.Flatten(), nn.Linear(6, 2)
    )
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="scale_grad_by_freq"):
        engine.prepare(torch.randint(0, 7, (5, 2)), torch.randint(0, 2, (5,)), CROSS_ENTROPY)
    assert engine.name == "vmap"


class _FailingHandler(LinearHandler):
    """The linear handler with a bug: its per-example terms raise a raw error."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def terms(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


class _Scaled(nn.Linear):
    """A linear layer subclass given a (broken) handler of its own in these tests."""


@pytest.mark.parametrize(
    "error", [RuntimeError("shape mismatch inside a handler"), IndexError("tuple index")]
)
def test_a_raw_error_inside_the_fast_path_becomes_a_refusal_and_auto_falls_back(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    from dpcore.torch.per_example import fast

    monkeypatch.setitem(fast.HANDLERS, _Scaled, _FailingHandler(error))
    torch.manual_seed(0)
    model = nn.Sequential(_Scaled(4, 3), nn.ReLU(), nn.Linear(3, 2)).double()
    inputs, targets = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 2, (6,))
    before = [p.detach().clone() for p in model.parameters()]
    fast_engine = make_engine(model, engine="fast", max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match=type(error).__name__) as refused:
        fast_engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert refused.value.__cause__ is error
    assert not fast_engine.prepared
    auto = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="own computation failed"):
        auto.prepare(inputs, targets, CROSS_ENTROPY)
    assert auto.name == "vmap"
    batch = auto.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert len(batch.norms) == 6
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_model_s_own_error_is_raised_unchanged() -> None:
    """An input the model itself cannot take is the caller's error, not a refusal."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    engine = make_engine(model, engine="fast", max_grad_norm=1.0)
    engine.prepare(torch.randn(6, 4), torch.randint(0, 2, (6,)), CROSS_ENTROPY)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as raised:
        engine.clipped_sum(torch.randn(6, 5), torch.randint(0, 2, (6,)), CROSS_ENTROPY)
    assert not isinstance(raised.value, IncompatibleModelError)


def test_a_path_taken_in_training_mode_only_chooses_again_on_the_first_lot() -> None:
    torch.manual_seed(0)
    model = TrainingOnlyPath().double().train()
    inputs, targets = _training_lot()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "fast"  # eval-mode trials never reach 'extra'
    with pytest.warns(EngineFallbackWarning, match="'extra'"):
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "vmap"
    gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)  # training mode, no draws
    torch.testing.assert_close(lot.norms, loop_norms(gradients), rtol=0, atol=1e-12)
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, 1e-12)


def _training_lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(9, 4, generator=generator, dtype=torch.float64)
    return inputs, torch.randint(0, 2, (9,), generator=generator)


def test_after_the_first_lot_the_choice_stands() -> None:
    """A refusal on a later lot is raised, typed: the run's engine does not change mid-run."""
    torch.manual_seed(0)
    model = TrainingOnlyPath().double().eval()
    inputs, targets = _training_lot()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.clipped_sum(inputs, targets, CROSS_ENTROPY)  # eval mode: fast, no 'extra'
    assert engine.name == "fast"
    model.train()
    with pytest.raises(IncompatibleModelError, match="'extra'"):
        engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "fast"
