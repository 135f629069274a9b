"""The loop engine: recurrent layers, routing and non-finite examples, exact at every lot size,
and ``engine="auto"`` ending on it for models the fast path and vmap refuse (packed sequences,
routing that indexes the lot)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, NonFiniteGradientError
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.torch.reference import assert_matches_loop

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


class _Recurrent(nn.Module):
    """Embedding, a two-layer bidirectional recurrent layer, a classifier on the last step."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.embedding = nn.Embedding(11, 4)
        self.recurrent = getattr(nn, kind)(4, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(10, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        states, _ = self.recurrent(self.embedding(tokens))
        return self.head(states[:, -1])  # type: ignore[no-any-return]


class _Routed(nn.Module):
    """Top-1 mixture of experts: each expert runs on the rows routed to it (indexing the lot)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 3)
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 3)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        weights = self.gate(inputs).softmax(-1)
        chosen = weights.argmax(-1)
        mixed = torch.zeros_like(inputs)
        for k, expert in enumerate(self.experts):
            rows = chosen == k
            if bool(rows.any()):
                mixed[rows] = expert(inputs[rows]) * weights[rows, k : k + 1]
        return self.head(mixed)  # type: ignore[no-any-return]


def _tokens(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 11, (size, 6), generator=generator), torch.randint(
        0, 3, (size,), generator=generator
    )


def _features(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, 4, generator=generator, dtype=torch.float64), torch.randint(
        0, 3, (size,), generator=generator
    )


@pytest.mark.parametrize("kind", ["GRU", "RNN", "LSTM"])
def test_recurrent_layers_are_exact_on_the_loop_engine_at_every_lot_size(kind: str) -> None:
    torch.manual_seed(0)
    model = _Recurrent(kind).double()
    engine = make_engine(model, engine="loop", max_grad_norm=1.0)
    engine.prepare(*_tokens(8, 0), CROSS_ENTROPY)
    for size in (1, 2, 5, 6, 11):  # 5 and 6: the hidden and sequence sizes
        assert_matches_loop(engine, model, *_tokens(size, size), CROSS_ENTROPY, 1e-12)


class _Packed(_Recurrent):
    """Packs each lot's sequences by their lengths (the last token id is the length): vmap cannot
    pack a lot of varying lengths, so ``auto`` ends on the loop engine."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        lengths = tokens[:, -1].clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(tokens), lengths, batch_first=True, enforce_sorted=False
        )
        _, state = self.recurrent(packed)
        last = state[0] if isinstance(state, tuple) else state
        return self.head(torch.cat([last[-2], last[-1]], dim=-1))  # type: ignore[no-any-return]


def test_packed_sequences_take_the_loop_engine_exactly() -> None:
    torch.manual_seed(0)
    model = _Packed("GRU").double()
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 11, (7, 6), generator=generator)
    tokens[:, -1] = torch.randint(1, 6, (7,), generator=generator)
    targets = torch.randint(0, 3, (7,), generator=generator)
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="loop engine"):
        engine.prepare(tokens, targets, CROSS_ENTROPY)
    assert engine.name == "loop"
    assert_matches_loop(engine, model, tokens, targets, CROSS_ENTROPY, 1e-12)


def test_routing_that_indexes_the_lot_is_exact_on_the_loop_engine() -> None:
    torch.manual_seed(0)
    model = _Routed().double()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="loop engine"):
        engine.prepare(*_features(8, 0), CROSS_ENTROPY)
    assert engine.name == "loop"
    for size in (1, 3, 4, 9):
        assert_matches_loop(engine, model, *_features(size, size), CROSS_ENTROPY, 1e-12)


def test_outputs_losses_and_an_empty_lot() -> None:
    torch.manual_seed(0)
    model = _Recurrent("GRU").double()
    engine = make_engine(model, engine="loop", max_grad_norm=0.1)
    inputs, targets = _tokens(5, 1)
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    with torch.no_grad():
        torch.testing.assert_close(lot.outputs, model(inputs), rtol=0, atol=1e-12)
        torch.testing.assert_close(lot.losses, CROSS_ENTROPY(model(inputs), targets))
    assert bool((lot.norms * lot.clip_factors <= 0.1 * (1 + 1e-12)).all())
    assert all(p.grad is None for p in model.parameters())  # nothing written to .grad
    empty = engine.clipped_sum(inputs[:0], targets[:0], CROSS_ENTROPY)
    assert all(not s.any() for s in empty.summed) and empty.outputs is None


def test_non_finite_examples_raise_or_are_dropped() -> None:
    torch.manual_seed(0)
    model = _Routed().double()
    inputs, targets = _features(4, 2)
    inputs[2, 0] = float("nan")
    engine = make_engine(model, engine="loop", max_grad_norm=1.0)
    engine.prepare(*_features(4, 3), CROSS_ENTROPY)
    with pytest.raises(NonFiniteGradientError):
        engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    dropping = make_engine(model, engine="loop", max_grad_norm=1.0, nonfinite="zero")
    dropping.prepare(*_features(4, 3), CROSS_ENTROPY)
    lot = dropping.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert lot.clip_factors[2] == 0 and all(bool(torch.isfinite(s).all()) for s in lot.summed)
    kept = [0, 1, 3]
    alone = dropping.clipped_sum(inputs[kept], targets[kept], CROSS_ENTROPY)
    for found, wanted in zip(lot.summed, alone.summed, strict=True):
        torch.testing.assert_close(found, wanted, rtol=0, atol=1e-12)


def test_a_routed_model_trains_and_its_statement_names_the_loop_engine() -> None:
    torch.manual_seed(0)
    model = _Routed().double()
    inputs, targets = _features(40, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineFallbackWarning)
        trainer = DPTrainer.dp_sgd(
            model,
            lr=0.5,
            inputs=inputs,
            targets=targets,
            loss_fn=CROSS_ENTROPY,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=PoissonSampler(40, sampling_probability=0.25, seed=0),
            engine="auto",
            seed=0,
        )
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train(steps=3, delta=1e-5, progress=False)
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert trainer.privacy_statement(delta=1e-5)["run"]["engine"] == "loop"
