"""Layers called on the lot's tokens flattened to ``(batch * T, d)`` (OPT's feed-forward block).

The fast path follows a regrouping of batch-first data into a first dimension of ``rows *
batch`` (each example owning ``rows`` consecutive rows) through per-position layers and back, and
reads such a layer's activations and backprops as ``(batch, rows, d)``. Rows interleaved by
example (a sequence-first flatten) or a flattened input to a layer without a per-position rule
(a convolution) are refused with a typed error, and ``auto`` trains on vmap.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.per_example.fast import FastEngine
from tests.torch.reference import assert_matches_loop

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
TOLERANCE = 1e-10
T, D = 5, 6


class _FlattenedBlock(nn.Module):
    """Batch-first tokens, a pre-norm feed-forward block on ``(batch * T, d)``, and back."""

    def __init__(self, unfollowed: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(3, D)
        self.norm = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, 2 * D)
        self.fc2 = nn.Linear(2 * D, D)
        self.head = nn.Linear(D, 4)
        self.unfollowed = unfollowed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        if self.unfollowed:  # a cumulative sum over positions: its layout is not followed
            hidden = torch.cumsum(hidden, dim=1)
        shape = hidden.shape
        flat = hidden.reshape(-1, hidden.size(-1))
        flat = flat + self.fc2(torch.relu(self.fc1(self.norm(flat))))
        return self.head(flat.view(shape).mean(1))


class _InterleavedRows(nn.Module):
    """The same block on a sequence-first flatten: each example's rows are T apart."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, D)
        self.fc = nn.Linear(D, D)
        self.head = nn.Linear(D, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens).transpose(0, 1)  # (T, batch, d)
        flat = self.fc(hidden.reshape(-1, D)).view(hidden.shape)
        return self.head(flat.transpose(0, 1).mean(1))


class _FlattenedFrames(nn.Module):
    """Video-like ``(batch, frames, C, H, W)`` frames flattened into a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.head = nn.Linear(3, 4)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        batch = frames.shape[0]
        features = self.conv(frames.flatten(0, 1)).mean((2, 3))  # (batch * frames, 3)
        return self.head(features.view(batch, -1, 3).mean(1))


def _lot(size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(size, T, 3, generator=generator, dtype=torch.float64)
    return tokens, torch.randint(0, 4, (size,), generator=generator)


def _check_exact(engine: object, model: nn.Module, size: int) -> None:
    assert_matches_loop(engine, model, *_lot(size, seed=size), CROSS_ENTROPY, TOLERANCE)


@pytest.mark.parametrize("unfollowed", [False, True])
def test_flattened_tokens_train_exactly_on_the_fast_path(unfollowed: bool) -> None:
    torch.manual_seed(0)
    model = _FlattenedBlock(unfollowed).double()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(6), CROSS_ENTROPY)
    assert engine.name == "fast"
    for size in (1, 2, 7):
        _check_exact(engine, model, size)


def test_rows_interleaved_by_example_are_refused_and_auto_takes_vmap() -> None:
    torch.manual_seed(0)
    model = _InterleavedRows().double()
    fast = FastEngine(model, max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match="fc"):
        fast.prepare(*_lot(6), CROSS_ENTROPY)
    with pytest.warns(UserWarning):
        engine = make_engine(model, engine="auto", max_grad_norm=1.0)
        engine.prepare(*_lot(6), CROSS_ENTROPY)
    assert engine.name == "vmap"
    _check_exact(engine, model, 4)


def test_a_flattened_input_to_a_layer_without_a_per_position_rule_is_refused() -> None:
    torch.manual_seed(0)
    model = _FlattenedFrames().double()
    generator = torch.Generator().manual_seed(1)
    frames = torch.randn(4, 3, 2, 5, 5, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 4, (4,), generator=generator)
    with pytest.raises(IncompatibleModelError, match="conv"):
        FastEngine(model, max_grad_norm=1.0).prepare(frames, targets, CROSS_ENTROPY)


def test_opt_trains_exactly_on_the_fast_path() -> None:
    """transformers' OPT flattens its tokens before each layer's feed-forward block."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=16, word_embed_proj_dim=16, dropout=0.0, attention_dropout=0.0,
        layerdrop=0.0,
    )  # fmt: skip
    model = OPTForCausalLM(config).double()

    def loss(outputs: object, targets: torch.Tensor) -> torch.Tensor:
        logits = outputs.logits[:, :-1]  # type: ignore[attr-defined]
        rows = CROSS_ENTROPY(logits.reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1))
        return rows.view(targets.shape[0], -1).mean(1)

    def lot(size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        generator = torch.Generator().manual_seed(size)
        ids = torch.randint(0, 50, (size, 6), generator=generator)
        mask = torch.ones(size, 6, dtype=torch.long)
        mask[0, :2] = 0  # left padding of different length per example
        if size > 2:
            mask[2, :1] = 0
        return {"input_ids": ids, "attention_mask": mask}, ids

    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*lot(5), loss)
    assert engine.name == "fast"
    for size in (1, 4):
        assert_matches_loop(engine, model, *lot(size), loss, TOLERANCE)
