"""Every engine against a one-example-at-a-time autograd loop on the model zoo, at lot sizes equal
to each of the model's own dimensions (where a shape could pass for a lot), 0, 1 and one other.

The contract (float64): an engine that accepts a model gives per-example norms and clipped sums
equal to the loop to 1e-10 at every lot size; an engine that refuses it raises a typed error
naming the parameter. ``auto`` chooses on trial lots and then trains through Poisson lots.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import AutoEngine, make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.torch.reference import assert_matches_loop, loop_clipped_sum, loop_gradients, loop_norms
from tests.torch.zoo import ZOO, ZooModel, lot_sizes

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
TOLERANCE = 1e-10


def _model(name: str) -> ZooModel:
    torch.manual_seed(0)
    return ZOO[name]()


def _prepared(model: ZooModel, engine: str, **options: object) -> PerExampleEngine:
    built = make_engine(model, engine=engine, max_grad_norm=1.0, **options)  # type: ignore[arg-type]
    built.prepare(*model.make_batch(8, seed=1), CROSS_ENTROPY)
    return built


def _assert_matches_loop(engine: PerExampleEngine, model: ZooModel, size: int) -> None:
    inputs, targets = model.make_batch(size, seed=size)
    if size == 0:
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
        assert lot.norms.shape == (0,)
        assert all(float(s.abs().max()) == 0.0 for s in lot.summed)
        return
    gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
    norms = loop_norms(gradients)
    engine.max_grad_norm = float(norms.median())  # clips about half of the examples
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    torch.testing.assert_close(lot.norms, norms, atol=TOLERANCE, rtol=0)
    expected = loop_clipped_sum(gradients, engine.max_grad_norm)
    for (name, _), found, wanted in zip(engine.named_parameters, lot.summed, expected, strict=True):
        torch.testing.assert_close(found, wanted, atol=TOLERANCE, rtol=0, msg=name)


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("engine", ["fast", "vmap", "loop"])
def test_exact_engines_match_the_loop_at_every_lot_size(name: str, engine: str) -> None:
    model = _model(name)
    prepared = _prepared(model, engine)
    for size in lot_sizes(model):
        _assert_matches_loop(prepared, model, size)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_jl_projections_and_weighted_sums_match_the_loop(name: str) -> None:
    """JL's per-example projections <g_i, v> and its weighted backward are exact at every size."""
    model = _model(name)
    engine = _prepared(model, "jl", jl_dimension=3)
    assert isinstance(engine, JLEngine)
    generator = torch.Generator().manual_seed(5)
    tangents = {
        n: torch.randn((2, *p.shape), generator=generator, dtype=p.dtype)
        for n, p in engine.named_parameters
    }
    for size in [s for s in lot_sizes(model) if s > 0]:
        inputs, targets = model.make_batch(size, seed=size)
        gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
        projected = engine._project(inputs, targets, CROSS_ENTROPY, tangents)
        expected = torch.stack(
            [
                torch.stack(
                    [
                        sum(
                            (g * tangents[n][j]).sum()
                            for (n, _), g in zip(engine.named_parameters, row, strict=True)
                        )
                        for row in gradients
                    ]
                )
                for j in range(2)
            ]
        )
        torch.testing.assert_close(projected, expected, atol=TOLERANCE, rtol=0)  # type: ignore[arg-type]
        factors = torch.linspace(0.1, 1.0, size, dtype=torch.float64)
        summed = engine._weighted_backward(inputs, targets, CROSS_ENTROPY, factors)[0]
        for k, found in enumerate(summed):
            wanted = sum(float(c) * row[k] for c, row in zip(factors, gradients, strict=True))
            torch.testing.assert_close(found, wanted, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_auto_chooses_once_and_trains_through_poisson_lots(name: str) -> None:
    """``auto`` keeps the fast path on every zoo model (no fallback notice); 30 Poisson steps."""
    model = _model(name)
    inputs, targets = model.make_batch(24, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = DPTrainer.dp_sgd(
            model,
            lr=0.05,
            inputs=inputs,
            targets=targets,
            loss_fn=CROSS_ENTROPY,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=PoissonSampler(24, sampling_probability=0.25, seed=1),
            seed=2,
        )
    notices = [w for w in caught if issubclass(w.category, EngineFallbackWarning)]
    assert isinstance(trainer.engine, AutoEngine)
    assert trainer.engine.name == "fast"
    assert not notices
    results = trainer.train(steps=30, delta=1e-5, progress=False)
    sizes = {r.lot_size for r in results}
    assert len(results) == 30 and len(sizes) > 3  # varied Poisson lots, empty ones allowed
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_the_reported_case_positions_at_lot_equal_to_sequence_length() -> None:
    """The bug as found: learned positions, lot size == T; norms were 1.2 % off, sums 10 %."""
    model = _model("positional_gpt")
    length = model.length  # type: ignore[attr-defined]
    engine = _prepared(model, "auto")
    assert engine.name == "fast"
    _assert_matches_loop(engine, model, length)


class _Mixing(nn.Module):
    """``x - mean over the lot``: one example's output depends on the others."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(inputs)
        return hidden - hidden.mean(0, keepdim=True)


class _Flipped(nn.Module):
    """Reverses the lot around a Linear and back: outputs are per example, rows are not."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4, dtype=torch.float64)
        self.second = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(inputs)).flip(0)).flip(0)


class _GradientMixing(nn.Module):
    """Equal outputs, but each example's gradient carries the lot's mean (a detach trick)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(inputs)
        mean = hidden.mean(0, keepdim=True)
        return hidden + (mean - mean.detach())


def _lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(6, 4, generator=generator, dtype=torch.float64), torch.tensor(
        [0, 1, 2, 0, 1, 2]
    )


@pytest.mark.parametrize("engine", ["auto", "fast", "vmap", "loop", "jl"])
def test_interacting_examples_are_refused_by_every_engine(engine: str) -> None:
    options = {"jl_dimension": 2} if engine == "jl" else {}
    built = make_engine(_Mixing(), engine=engine, max_grad_norm=1.0, **options)  # type: ignore[arg-type]
    with pytest.raises(IncompatibleModelError, match="interact"):
        built.clipped_sum(*_lot(), CROSS_ENTROPY)


def test_rows_that_are_not_examples_are_refused_by_the_fast_path_and_exact_on_vmap() -> None:
    with pytest.raises(IncompatibleModelError, match=r"'first\.weight'|'second\.weight'"):
        make_engine(_Flipped(), engine="fast", max_grad_norm=1.0).prepare(*_lot(), CROSS_ENTROPY)
    torch.manual_seed(0)
    model = _Flipped()
    with pytest.warns(EngineFallbackWarning, match="weight"):
        engine = _prepared_plain(model)
    assert engine.name == "vmap"
    inputs, targets = _lot()
    gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    torch.testing.assert_close(lot.norms, loop_norms(gradients), atol=TOLERANCE, rtol=0)


def _prepared_plain(model: nn.Module) -> PerExampleEngine:
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(), CROSS_ENTROPY)
    return engine


@pytest.mark.parametrize("engine", ["fast", "jl"])
def test_examples_mixing_only_in_the_gradient_are_refused(engine: str) -> None:
    options = {"jl_dimension": 2} if engine == "jl" else {}
    built = make_engine(_GradientMixing(), engine=engine, max_grad_norm=1.0, **options)  # type: ignore[arg-type]
    with pytest.raises(IncompatibleModelError, match="linear"):
        built.prepare(*_lot(), CROSS_ENTROPY)


class _TimeFirst(nn.Module):
    """A Linear applied to ``(T, batch, d)``: rows are positions, not examples.

    With ``followed``, the data reach it by a transpose, whose layout the fast path follows (the
    examples along dimension 1); otherwise by a reshape, whose layout it does not.
    """

    def __init__(self, *, followed: bool) -> None:
        super().__init__()
        self.followed = followed
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        time_first = inputs.transpose(0, 1)
        if not self.followed:
            time_first = time_first.reshape(inputs.shape[1], inputs.shape[0], -1)
        return self.linear(time_first).mean(0)


def _time_first_lot() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(5, 5, 4, generator=generator, dtype=torch.float64)  # lot 5 == T 5
    return inputs, torch.tensor([0, 1, 2, 0, 1])


def test_a_non_batch_first_layer_goes_to_vmap_even_at_a_lot_equal_to_its_length() -> None:
    torch.manual_seed(0)
    model = _TimeFirst(followed=False)
    inputs, targets = _time_first_lot()
    with pytest.raises(IncompatibleModelError, match=r"'linear\.weight'|batch-first"):
        make_engine(model, engine="fast", max_grad_norm=1.0).clipped_sum(
            inputs, targets, CROSS_ENTROPY
        )
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="linear"):
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "vmap"
    gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
    torch.testing.assert_close(lot.norms, loop_norms(gradients), atol=TOLERANCE, rtol=0)


def test_a_layer_on_transposed_data_is_exact_on_the_fast_path_at_a_lot_equal_to_its_length() -> (
    None
):
    torch.manual_seed(0)
    model = _TimeFirst(followed=True)
    inputs, targets = _time_first_lot()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_time_first_lot(), CROSS_ENTROPY)
    assert engine.name == "fast"
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, TOLERANCE)


class _TimeFirstPositions(nn.Module):
    """Learned positions added to ``(T, batch, d)`` data (the examples along dimension 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = nn.Parameter(torch.randn(5, 1, 4, dtype=torch.float64))
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs.transpose(0, 1) + self.positions).mean(0)


def test_positions_met_along_a_followed_non_first_dimension_are_refused_by_name() -> None:
    torch.manual_seed(0)
    model = _TimeFirstPositions()
    inputs, targets = _time_first_lot()  # lot 5 == T 5: a shape could pass for batch-first
    with pytest.raises(IncompatibleModelError, match=r"\['positions'\].*along dimension 1"):
        make_engine(model, engine="fast", max_grad_norm=1.0).clipped_sum(
            inputs, targets, CROSS_ENTROPY
        )
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="positions"):
        engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "vmap"
