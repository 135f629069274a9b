"""The torch.func engine equals a one-example-at-a-time loop (float64, atol 1e-8)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from dpcore.torch.errors import IncompatibleModelError, NonFiniteGradientError
from dpcore.torch.per_example.vmap import VmapEngine
from tests.torch.reference import (
    assert_matches_loop,
    loop_clipped_sum,
    loop_gradients,
    loop_norms,
)


class _LstmClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 6)
        self.lstm = nn.LSTM(6, 5, batch_first=True, bidirectional=True)
        self.head = nn.Linear(10, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(self.embedding(tokens))
        return self.head(output.mean(dim=1))


def _mlp() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.randn(7, 6), torch.randint(0, 3, (7,))


def _cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(36, 3)
    )
    return model, torch.randn(5, 1, 7, 7), torch.randint(0, 3, (5,))


def _lstm() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    return _LstmClassifier(), torch.randint(0, 20, (4, 9)), torch.randint(0, 2, (4,))


def _transformer() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    block = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    model = nn.Sequential(block, nn.Flatten(), nn.Linear(40, 3))
    return model, torch.randn(4, 5, 8), torch.randint(0, 3, (4,))


@pytest.mark.parametrize(
    ("build", "dtype", "atol"),
    [
        (_mlp, torch.float64, 1e-8),
        (_cnn, torch.float64, 1e-8),
        (_transformer, torch.float64, 1e-8),
        # nn.LSTM runs under vmap only through oneDNN, which is float32-only (module docstring).
        (_lstm, torch.float32, 1e-5),
    ],
)
def test_vmap_engine_matches_loop(
    build: Callable[[], tuple[nn.Module, torch.Tensor, torch.Tensor]],
    dtype: torch.dtype,
    atol: float,
) -> None:
    torch.manual_seed(0)
    model, inputs, targets = build()
    model = model.to(dtype)
    inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    reference = loop_gradients(model, inputs, targets, loss_fn)
    norms = loop_norms(reference)
    clip = float(norms.median())  # clips about half of the examples
    lot = VmapEngine(model, max_grad_norm=clip).clipped_sum(inputs, targets, loss_fn)
    torch.testing.assert_close(lot.norms.double(), norms, atol=atol, rtol=0)
    for ours, theirs in zip(lot.summed, loop_clipped_sum(reference, clip), strict=True):
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    assert bool((lot.norms * lot.clip_factors <= clip * (1 + 1e-6)).all())
    assert 0 < int((lot.clip_factors < 1).sum()) < len(targets)


def test_nan_example_raises_or_is_dropped() -> None:
    torch.manual_seed(1)
    model = nn.Linear(3, 2).double()
    inputs = torch.randn(5, 3, dtype=torch.float64)
    inputs[2, 0] = float("nan")
    targets = torch.tensor([0, 1, 0, 1, 0])
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    with pytest.raises(NonFiniteGradientError, match=r"examples \[2\]"):
        VmapEngine(model, max_grad_norm=1.0).clipped_sum(inputs, targets, loss_fn)
    lot = VmapEngine(model, max_grad_norm=1.0, nonfinite="zero").clipped_sum(
        inputs, targets, loss_fn
    )
    keep = [0, 1, 3, 4]
    expected = loop_clipped_sum(loop_gradients(model, inputs[keep], targets[keep], loss_fn), 1.0)
    for ours, theirs in zip(lot.summed, expected, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


def test_chunked_vmap_equals_unchunked() -> None:
    torch.manual_seed(2)
    model, inputs, targets = _mlp()
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    whole = VmapEngine(model, max_grad_norm=0.1).clipped_sum(inputs, targets, loss_fn)
    chunked = VmapEngine(model, max_grad_norm=0.1, chunk_size=2).clipped_sum(
        inputs, targets, loss_fn
    )
    for a, b in zip(whole.summed, chunked.summed, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["GRU", "RNN", "LSTM"])
def test_recurrent_layers_run_decomposed_and_match_the_loop(kind: str) -> None:
    """torch's recurrent kernels have no batching rule (GRU, RNN; LSTM in float64); the vmap
    engine runs their recurrence from elementary ops and equals the loop on the layer itself."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Embedding(10, 4),
        getattr(nn, kind)(4, 5, num_layers=2, bidirectional=True, batch_first=True),
        _LastStep(),
        nn.Linear(10, 3),
    ).double()
    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randint(0, 10, (7, 6), generator=generator), torch.arange(7) % 3
    engine = VmapEngine(model, max_grad_norm=1.0)
    engine.prepare(inputs, targets, nn.CrossEntropyLoss(reduction="none"))
    assert_matches_loop(
        engine, model, inputs, targets, nn.CrossEntropyLoss(reduction="none"), 1e-12
    )
    assert not any("forward" in module.__dict__ for module in model.modules())  # restored


class _LastStep(nn.Module):
    def forward(self, outputs: tuple[torch.Tensor, object]) -> torch.Tensor:
        return outputs[0][:, -1]


class _EvalCache(nn.Module):
    """Writes each lot's last hidden state into a cache buffer in place, in eval mode only (a
    Hugging Face Mamba's or RWKV's generation cache): vmap cannot run that write, training can.
    With ``dropout``, its training mode draws random numbers."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.first = nn.Linear(4, 5)
        self.head = nn.Linear(5, 3)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("cache", torch.zeros(1, 5))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(inputs))
        if not self.training:
            self.cache.copy_(hidden[-1:].detach())
        return self.head(self.dropout(hidden))  # type: ignore[no-any-return]


def test_a_model_vmap_runs_in_training_mode_only_is_tried_in_its_own_mode() -> None:
    torch.manual_seed(0)
    model = _EvalCache().double().train()
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 3, (7,), generator=generator)
    loss = nn.CrossEntropyLoss(reduction="none")
    engine = VmapEngine(model, max_grad_norm=1.0)
    engine.prepare(inputs, targets, loss)
    assert_matches_loop(engine, model, inputs, targets, loss, 1e-12)
    assert not model.cache.any()  # the trial in training mode wrote nothing
    random = _EvalCache(dropout=0.5).double().train()
    with pytest.raises(IncompatibleModelError, match="differ from a one-example-at-a-time"):
        VmapEngine(random, max_grad_norm=1.0).prepare(inputs, targets, loss)
    with pytest.raises(IncompatibleModelError, match="cannot run this model"):
        VmapEngine(_EvalCache().double().eval(), max_grad_norm=1.0).prepare(inputs, targets, loss)
