"""A model whose parameters are bfloat16 (not autocast): the fast path's first-lot check.

On its first lot the fast engine compares its unclipped sum with autograd's gradient of the
summed loss. With bfloat16 parameters autograd's own gradient is rounded to bfloat16 (a relative
step of 2**-8), so the comparison must allow bfloat16's rounding; at float32's allowance (1e-3)
every such model was refused as if a gradient were missed.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dpcore.torch.engines import make_engine
from tests.torch.reference import loop_clipped_sum, loop_gradients

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")


class _Tokens(nn.Module):
    """Embedding, LayerNorm, mean over positions, Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(11, 16)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.embedding(tokens)).mean(1))  # type: ignore[no-any-return]


def test_bfloat16_parameters_are_accepted_and_clipped_to_their_rounding() -> None:
    for seed in range(3):
        torch.manual_seed(seed)
        model = _Tokens().to(torch.bfloat16)
        exact = copy.deepcopy(model).double()
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 11, (8, 9), generator=generator)
        labels = torch.randint(0, 3, (8,), generator=generator)
        engine = make_engine(model, engine="auto", max_grad_norm=1.0)
        engine.prepare(tokens, labels, CROSS_ENTROPY)
        lot = engine.clipped_sum(tokens, labels, CROSS_ENTROPY)
        assert engine.name == "fast"
        expected = loop_clipped_sum(loop_gradients(exact, tokens, labels, CROSS_ENTROPY), 1.0)
        for found, wanted in zip(lot.summed, expected, strict=True):
            assert found.dtype == torch.bfloat16
            error = float((found.double() - wanted).norm() / wanted.norm())
            assert error < 2e-2
