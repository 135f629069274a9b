"""Handlers read the operation a layer issues, whatever its class: subclasses of handled layers
(timm-style channels-first LayerNorm, GroupNorm with one group, 'same'-padded convolutions) and
transformers' ``Conv1D`` get the exact math, checked against the float64 loop; a subclass that
computes its weight from the parameter is followed operation by operation (exact too), and one
that uses its weight through an operation without a rule is refused by name, and ``auto`` trains
it with vmap."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from dpcore.torch.per_example.fast import FastEngine, fast_path_supports
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
DOUBLE = torch.float64


class PlainLayerNorm(nn.LayerNorm):
    """A subclass that changes nothing (as many libraries declare their own)."""


class LayerNorm2d(nn.LayerNorm):
    """timm's channels-first LayerNorm: permutes to channels-last around ``F.layer_norm``."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        inputs = inputs.permute(0, 2, 3, 1)
        inputs = functional.layer_norm(
            inputs, self.normalized_shape, self.weight, self.bias, self.eps
        )
        return inputs.permute(0, 3, 1, 2)


class GroupNorm1(nn.GroupNorm):
    """timm's GroupNorm with one group."""

    def __init__(self, channels: int) -> None:
        super().__init__(1, channels, dtype=DOUBLE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.group_norm(inputs, self.num_groups, self.weight, self.bias, self.eps)


class Conv2dSame(nn.Conv2d):
    """timm's Conv2dSame: pads each input for 'same' output (TensorFlow's rule), then convolves
    without padding."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s, d in zip(
            reversed(inputs.shape[2:]),
            reversed(self.kernel_size),
            reversed(self.stride),
            reversed(self.dilation),
            strict=True,
        ):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            pads += [total // 2, total - total // 2]
        inputs = functional.pad(inputs, pads)
        return functional.conv2d(
            inputs, self.weight, self.bias, self.stride, 0, self.dilation, self.groups
        )


class ScaledLinear(nn.Linear):
    """Post-processes the output of ``F.linear`` (the target is the operation's result)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.tanh(super().forward(inputs))


class StdConv2d(nn.Conv2d):
    """timm's weight-standardised convolution: the weight is computed from the parameter."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        weight = functional.batch_norm(
            self.weight.reshape(1, self.out_channels, -1), None, None, training=True, eps=1e-6
        ).reshape_as(self.weight)
        return functional.conv2d(inputs, weight, self.bias, self.stride, self.padding)


class SubclassNet(nn.Module):
    """Conv2dSame -> GroupNorm1 -> LayerNorm2d -> PlainLayerNorm -> ScaledLinear -> head."""

    def __init__(self, conv: type[nn.Conv2d] = Conv2dSame) -> None:
        super().__init__()
        self.conv = conv(2, 4, 2, stride=2, padding=1, dtype=DOUBLE)  # Conv2dSame: its own
        self.group = GroupNorm1(4)
        self.channels = LayerNorm2d(4, dtype=DOUBLE)
        self.rows = PlainLayerNorm(3, dtype=DOUBLE)
        self.scaled = ScaledLinear(3, 5, dtype=DOUBLE)
        self.head = nn.Linear(5 * 4 * 3, 3, dtype=DOUBLE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        hidden = self.channels(self.group(self.conv(images)))  # (batch, 4, 3, 3)
        return self.head(self.scaled(self.rows(hidden)).flatten(1))


def _lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 2, 5, 5, generator=generator, dtype=DOUBLE)
    return images, torch.randint(0, 3, (size,), generator=generator)


def _gpt2_projection() -> nn.Module:
    from transformers.pytorch_utils import Conv1D

    return nn.Sequential(Conv1D(6, 4), nn.Tanh(), Conv1D(3, 6)).double()


def _assert_auto_is_fast_and_exact(model: nn.Module, lots: list[tuple[torch.Tensor, ...]]) -> None:
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*lots[0], CROSS_ENTROPY)
    assert engine.name == "fast"
    for inputs, targets in lots[1:]:
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


def test_subclasses_of_handled_layers_are_exact_on_the_fast_path() -> None:
    torch.manual_seed(0)
    model = SubclassNet()
    assert fast_path_supports(model)
    _assert_auto_is_fast_and_exact(model, [_lot(8, 0), _lot(7, 1), _lot(1, 2)])


def test_transformers_conv1d_is_an_addmm_with_a_transposed_weight() -> None:
    torch.manual_seed(0)
    model = _gpt2_projection()
    assert fast_path_supports(model)

    def lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        sequences = torch.randn(size, 5, 4, generator=generator, dtype=DOUBLE)
        return sequences, torch.randint(0, 3, (size, 5), generator=generator)

    def tokens_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return CROSS_ENTROPY(outputs.transpose(1, 2), targets).mean(1)

    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*lot(8, 0), tokens_loss)
    assert engine.name == "fast"
    for size in (1, 6):
        inputs, targets = lot(size, size)
        gradients = loop_gradients(model, inputs, targets, tokens_loss)
        norms = loop_norms(gradients)
        engine.max_grad_norm = float(norms.median())
        clipped = engine.clipped_sum(inputs, targets, tokens_loss)
        torch.testing.assert_close(clipped.norms, norms, atol=1e-10, rtol=0)
        wanted = loop_clipped_sum(gradients, engine.max_grad_norm)
        for found, expected in zip(clipped.summed, wanted, strict=True):
            torch.testing.assert_close(found, expected, atol=1e-10, rtol=0)


def test_a_weight_computed_from_its_parameter_is_exact_on_the_fast_path() -> None:
    """timm's standardised convolution: the layer is followed operation by operation, and the
    computed weight's per-example gradients pulled back to the parameter."""
    torch.manual_seed(0)
    model = SubclassNet(conv=StdConv2d)
    _assert_auto_is_fast_and_exact(model, [_lot(8, 0), _lot(4, 1), _lot(1, 2), _lot(3, 3)])


class MatmulConv2d(nn.Conv2d):
    """Uses its weight through ``torch.matmul`` on the unfolded input (no per-example rule)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        padding, stride = self.padding, self.stride
        patches = functional.unfold(inputs, self.kernel_size, padding=padding, stride=stride)
        flat = self.weight.reshape(self.out_channels, -1)
        side = (inputs.shape[-1] + 2 * padding[0] - self.kernel_size[0]) // stride[0] + 1
        return torch.matmul(flat, patches).unflatten(-1, (side, side))


def test_a_weight_used_through_an_operation_without_a_rule_is_refused_by_name() -> None:
    torch.manual_seed(0)
    model = SubclassNet(conv=MatmulConv2d)
    with pytest.raises(IncompatibleModelError, match=r"'conv\.weight'.*matmul") as refused:
        FastEngine(model, max_grad_norm=1.0).prepare(*_lot(6, 0), CROSS_ENTROPY)
    assert refused.value.parameters == ["conv.weight"]  # type: ignore[attr-defined]
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.prepare(*_lot(6, 0), CROSS_ENTROPY)
    assert engine.name == "vmap"
    assert any(issubclass(w.category, EngineFallbackWarning) for w in caught)
