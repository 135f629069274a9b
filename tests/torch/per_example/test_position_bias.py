"""Position tables that meet the examples the way encoder-decoder transformers use them.

- BART's learned positions: an ``nn.Embedding`` subclass called with the token ids, which it
  reads for their shape only, and looking up ``arange(T)``: the call takes example data but its
  lookup does not, so the table is batch-independent and meets the examples in the addition.
- T5's relative position bias under a padding mask, on transformers' SDPA path:
  ``torch.where(mask, bias, min)`` with a boolean mask from the examples.
- The same bias passed as ``attn_mask`` to ``F.scaled_dot_product_attention`` (T5's decoder):
  the fast path computes that call from its definition, so the bias meets the scores in an
  addition.

The fast path refused each of these by name (auto then fell back to vmap, which cannot run
BART or T5); each is now exact against the one-example-at-a-time loop at every lot size.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from tests.torch.reference import assert_matches_loop

TOLERANCE = 1e-10
VOCABULARY, LENGTH, WIDTH, HEADS = 13, 6, 8, 2
CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


class _Positions(nn.Embedding):
    """BART-like: called with the token ids, looks up their positions."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.arange(tokens.shape[1], device=tokens.device))


class _LearnedPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, WIDTH, dtype=torch.float64)
        self.positions = _Positions(LENGTH, WIDTH, dtype=torch.float64)
        self.head = nn.Linear(WIDTH, 3, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.tokens(tokens) + self.positions(tokens))
        return self.head((hidden * mask[..., None]).sum(1))  # type: ignore[no-any-return]


class _RelativeBias(nn.Module):
    """Single-layer attention with a learned ``(heads, T, T)`` bias, T5's SDPA path.

    ``masked``: the bias goes through ``torch.where(padding, bias, min)`` (the encoder);
    otherwise it is the ``attn_mask`` of ``scaled_dot_product_attention`` (the decoder).
    """

    def __init__(self, *, masked: bool) -> None:
        super().__init__()
        self.masked = masked
        self.tokens = nn.Embedding(VOCABULARY, WIDTH, dtype=torch.float64)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, dtype=torch.float64)
        self.bias = nn.Embedding(2 * LENGTH - 1, HEADS, dtype=torch.float64)
        self.head = nn.Linear(WIDTH, 3, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        size, length = tokens.shape
        hidden = self.tokens(tokens)
        query, key, value = (
            part.view(size, length, HEADS, -1).transpose(1, 2)
            for part in self.qkv(hidden).chunk(3, -1)
        )
        positions = torch.arange(length)
        relative = positions[None, :] - positions[:, None] + LENGTH - 1
        bias = self.bias(relative).permute(2, 0, 1)[None]  # (1, heads, T, T)
        if self.masked:
            keep = mask[:, None, None, :].bool()
            bias = torch.where(keep, bias, torch.finfo(bias.dtype).min)
        attended = functional.scaled_dot_product_attention(query, key, value, attn_mask=bias)
        pooled = (attended.transpose(1, 2).reshape(size, length, WIDTH) * mask[..., None]).sum(1)
        return self.head(pooled)  # type: ignore[no-any-return]


def _lot(size: int, seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCABULARY, (size, LENGTH), generator=generator)
    mask = torch.ones(size, LENGTH, dtype=torch.float64)
    for i in range(size):
        mask[i, LENGTH - i % 3 :] = 0.0  # a different amount of padding per example
    return (tokens, mask), torch.randint(0, 3, (size,), generator=generator)


MODELS = {
    "learned positions": _LearnedPositions,
    "relative bias under a padding mask": lambda: _RelativeBias(masked=True),
    "relative bias as the attention mask": lambda: _RelativeBias(masked=False),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("size", [1, LENGTH, 2 * LENGTH + 1])
def test_position_tables_are_clipped_exactly_on_the_fast_path(name: str, size: int) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(8, 1), CROSS_ENTROPY)
    assert engine.name == "fast"
    inputs, targets = _lot(size, 2)
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, TOLERANCE)
