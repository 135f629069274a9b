"""Weights computed from parameters before use, on the fast path: weight standardisation (as in
normalizer-free nets), ``torch.nn.utils.parametrizations.weight_norm``, a LoRA-style merged
weight ``W + B @ A``, in handled layers' subclasses and in plain modules calling ``F.linear`` or
``F.conv2d``. The per-example gradient of the computed weight is pulled back to the parameters;
equal to the float64 loop at lot sizes 1 and each of the model's dimensions, chosen by ``auto``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.nn.utils.parametrizations import weight_norm

from dpcore.torch.engines import make_engine
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.fast import FastEngine
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
DOUBLE = torch.float64
CHANNELS, IMAGE, HIDDEN, RANK, CLASSES = 2, 5, 4, 2, 3
#: 1, the model's own sizes (rank and input channels, classes and the convolutions' output side,
#: hidden width, image side, the convolutions' output positions) and 7.
LOT_SIZES = (1, RANK, CLASSES, HIDDEN, IMAGE, 7, 9)


def _standardised(weight: torch.Tensor) -> torch.Tensor:
    """``(W - mean) / std`` over each output unit's fan-in (normalizer-free nets' convolutions)."""
    dims = tuple(range(1, weight.dim()))
    mean = weight.mean(dim=dims, keepdim=True)
    std = weight.std(dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / (std + 1e-5)


class StandardisedConv2d(nn.Conv2d):
    """A convolution whose weight is standardised on every call, with a learned gain."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gain = nn.Parameter(torch.ones(self.out_channels, 1, 1, 1, dtype=DOUBLE))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        weight = self.gain * _standardised(self.weight)
        return functional.conv2d(
            inputs, weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class LoRALinear(nn.Linear):
    """A Linear whose weight is merged with a rank-2 update ``W + B @ A`` before use."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__(d_in, d_out, dtype=DOUBLE)
        self.lora_a = nn.Parameter(0.3 * torch.randn(RANK, d_in, dtype=DOUBLE))
        self.lora_b = nn.Parameter(0.3 * torch.randn(d_out, RANK, dtype=DOUBLE))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, self.weight + self.lora_b @ self.lora_a, self.bias)


class FunctionalMerged(nn.Module):
    """A plain module (no handler) holding ``W``, ``A`` and ``B`` and calling ``F.linear``."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(0.5 * torch.randn(d_out, d_in, dtype=DOUBLE))
        self.lora_a = nn.Parameter(0.3 * torch.randn(RANK, d_in, dtype=DOUBLE))
        self.lora_b = nn.Parameter(0.3 * torch.randn(d_out, RANK, dtype=DOUBLE))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, self.weight + self.lora_b @ self.lora_a)


class FunctionalStandardisedConv(nn.Module):
    """A plain module calling ``F.conv2d`` with a standardised weight and a plain bias."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(channels, channels // 2, 3, 3, dtype=DOUBLE))
        self.bias = nn.Parameter(torch.zeros(channels, dtype=DOUBLE))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        weight = _standardised(self.weight)
        return functional.conv2d(inputs, weight, self.bias, padding="same", groups=2)


class Net(nn.Module):
    """Standardised convolutions (a subclass, strided; a plain module, grouped), a
    weight-normalised convolution, then LoRA-merged, weight-normalised and plain Linears."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = StandardisedConv2d(CHANNELS, HIDDEN, 3, stride=2, padding=1, dtype=DOUBLE)
        self.grouped = FunctionalStandardisedConv(HIDDEN)
        self.normed_conv = weight_norm(nn.Conv2d(HIDDEN, HIDDEN, 1, dtype=DOUBLE))
        self.lora = LoRALinear(HIDDEN, IMAGE)
        self.merged = FunctionalMerged(IMAGE, IMAGE)
        self.normed = weight_norm(nn.Linear(IMAGE, IMAGE, dtype=DOUBLE))
        self.head = nn.Linear(IMAGE, CLASSES, dtype=DOUBLE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.conv(images))
        hidden = torch.tanh(self.normed_conv(torch.tanh(self.grouped(hidden))))
        hidden = torch.tanh(self.lora(hidden.mean((2, 3))))
        hidden = torch.tanh(self.normed(torch.tanh(self.merged(hidden))))
        return self.head(hidden)


def _lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, CHANNELS, IMAGE, IMAGE, generator=generator, dtype=DOUBLE)
    return images, torch.randint(0, CLASSES, (size,), generator=generator)


def _assert_matches_loop(engine: PerExampleEngine, model: nn.Module) -> None:
    for size in LOT_SIZES:
        inputs, targets = _lot(size, 10 + size)
        gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
        norms = loop_norms(gradients)
        engine.max_grad_norm = float(norms.median())
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
        torch.testing.assert_close(lot.norms, norms, atol=1e-10, rtol=0)
        wanted = loop_clipped_sum(gradients, engine.max_grad_norm)
        for (name, _), found, expected in zip(
            engine.named_parameters, lot.summed, wanted, strict=True
        ):
            torch.testing.assert_close(found, expected, atol=1e-10, rtol=0, msg=name)


def test_computed_weights_are_exact_and_auto_keeps_the_fast_path() -> None:
    torch.manual_seed(0)
    model = Net()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(8, 0), CROSS_ENTROPY)
    assert engine.name == "fast"
    _assert_matches_loop(engine, model)


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
def test_computed_weights_are_exact_with_either_norm_strategy(strategy: str) -> None:
    torch.manual_seed(0)
    model = Net()
    engine = FastEngine(model, max_grad_norm=1.0, norm_strategy=strategy)  # type: ignore[arg-type]
    engine.prepare(*_lot(8, 0), CROSS_ENTROPY)
    _assert_matches_loop(engine, model)


def test_only_the_layers_that_compute_their_weight_are_followed_operation_by_operation() -> None:
    torch.manual_seed(0)
    engine = FastEngine(Net(), max_grad_norm=1.0)
    engine.prepare(*_lot(6, 0), CROSS_ENTROPY)
    traced = sorted(layer.path for layer in engine._layers if layer.traced)
    assert traced == ["conv", "lora", "normed", "normed_conv"]
    engine = FastEngine(
        nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), max_grad_norm=1.0
    )
    engine.prepare(torch.randn(5, 3), torch.tensor([0, 1, 0, 1, 1]), CROSS_ENTROPY)
    assert not any(layer.traced for layer in engine._layers)
