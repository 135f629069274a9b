"""A model whose parameters are bfloat16 (not autocast): the fast path's first-lot check.

On its first lot the fast engine compares its unclipped sum with autograd's gradient of the
summed loss. With bfloat16 parameters autograd's own gradient is computed in bfloat16, and the
lot's rows cancel in its sums: against float64 it lost 13 % of a LayerNorm bias's gradient at 64
token sequences and 64 % at 1,024, while the fast path's sum stays within bfloat16's rounding.
So in bfloat16 the first lot is checked by the per-example norms of three examples against
batch-of-one passes only; a parameter reached in a way the fast path has no rule for is still
refused on the first lot (and ``auto`` chooses again).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from tests.torch.models import TrainingOnlyPath
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


def test_large_bfloat16_lots_stay_on_the_fast_path_and_within_rounding() -> None:
    for seed in range(3):
        torch.manual_seed(seed)
        model = _Tokens().to(torch.bfloat16)
        exact = copy.deepcopy(model).double()
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 11, (1024, 9), generator=generator)
        labels = torch.randint(0, 3, (1024,), generator=generator)
        engine = make_engine(model, engine="auto", max_grad_norm=1.0)
        engine.prepare(tokens[:16], labels[:16], CROSS_ENTROPY)
        with warnings.catch_warnings():
            warnings.simplefilter("error", EngineFallbackWarning)  # no false refusal
            lot = engine.clipped_sum(tokens, labels, CROSS_ENTROPY)
        assert engine.name == "fast"
        expected = loop_clipped_sum(loop_gradients(exact, tokens, labels, CROSS_ENTROPY), 1.0)
        for found, wanted in zip(lot.summed, expected, strict=True):
            assert float((found.double() - wanted).norm() / wanted.norm()) < 2e-2


def test_a_path_the_fast_path_cannot_follow_is_still_refused_in_bfloat16() -> None:
    torch.manual_seed(0)
    model = TrainingOnlyPath(classes=3).to(torch.bfloat16).train()
    inputs = torch.randn(300, 4).to(torch.bfloat16)
    labels = torch.randint(0, 3, (300,))
    engine = make_engine(model, engine="fast", max_grad_norm=1.0)
    engine.prepare(inputs[:16], labels[:16], CROSS_ENTROPY)
    with pytest.raises(IncompatibleModelError, match="'extra'"):
        engine.clipped_sum(inputs, labels, CROSS_ENTROPY)
