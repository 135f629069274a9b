"""Adding or removing one example changes the clipped sum by at most C (property test)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpcore.torch.engines import make_engine


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv1d(2, 3, 3), nn.GroupNorm(1, 3), nn.Tanh(), nn.Flatten(), nn.Linear(18, 3)
    ).double()


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 12),
    clip=st.floats(1e-3, 10.0),
    scale=st.floats(1e-2, 1e2),
    engine=st.sampled_from(["vmap", "fast"]),
)
def test_one_example_moves_the_clipped_sum_by_at_most_c(
    seed: int, batch: int, clip: float, scale: float, engine: str
) -> None:
    model = _model(seed)
    generator = torch.Generator().manual_seed(seed)
    inputs = scale * torch.randn(batch + 1, 2, 8, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 3, (batch + 1,), generator=generator)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    clipper = make_engine(model, engine=engine, max_grad_norm=clip)
    with_all = clipper.clipped_sum(inputs, targets, loss_fn).summed
    removed = int(torch.randint(0, batch + 1, (1,), generator=generator))
    keep = [i for i in range(batch + 1) if i != removed]
    without = clipper.clipped_sum(inputs[keep], targets[keep], loss_fn).summed
    difference = torch.sqrt(
        sum(((a - b) ** 2).sum() for a, b in zip(with_all, without, strict=True))
    )
    assert float(difference) <= clip * (1 + 1e-6)
