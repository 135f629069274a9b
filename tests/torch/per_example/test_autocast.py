"""Mixed precision: the fast engine under ``torch.autocast`` (bf16 on CPU) against float32.

The forward and backward run in bf16 (8-bit mantissa, rounding ~4e-3 per op); handlers widen the
saved activations and backprops to the parameters' float32, so norms and clipped sums accumulate
in float32. The trial lots run in full precision whatever the surrounding autocast. Measured on
these models: norms within 0.7 % and clipped sums within 0.9 % (relative, over all parameters)
of float32; the bounds below leave 3x room.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from tests.torch.zoo import ZOO

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
MODELS = [
    "positional_gpt",
    "tiny_vit",
    "group_norm_res_block",
    "tied_embedding_lm",
    "attention_mha",
]


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_stays_close_to_float32_and_clips_in_float32(name: str) -> None:
    torch.manual_seed(0)
    model = ZOO[name](dtype=torch.float32)  # type: ignore[call-arg]
    inputs, targets = model.make_batch(12, seed=1)
    mixed = make_engine(model, engine="fast", max_grad_norm=0.5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # first lot: prepared in full precision
        low = mixed.clipped_sum(inputs, targets, CROSS_ENTROPY)
    full = make_engine(model, engine="fast", max_grad_norm=0.5).clipped_sum(
        inputs, targets, CROSS_ENTROPY
    )
    assert all(s.dtype == torch.float32 for s in low.summed)
    assert low.norms.dtype == torch.float32
    assert float(((low.norms - full.norms).abs() / full.norms).max()) < 2e-2
    difference = sum((a - b).square().sum() for a, b in zip(low.summed, full.summed, strict=True))
    scale = sum(b.square().sum() for b in full.summed)
    assert float((difference / scale).sqrt()) < 3e-2  # type: ignore[operator]
    assert bool((low.norms * low.clip_factors <= 0.5 * (1 + 1e-6)).all())
