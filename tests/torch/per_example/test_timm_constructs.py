"""timm's constructs on the fast path, written in torch (the default suite has no timm).

Each module reproduces a construct of a timm family that ``bench/models_zoo.py`` builds with
timm itself (checked there, in the models benchmark's own environment):

- ``GroupNormAct`` (timm's ResNetV2/BiT, EfficientNet-GN): a GroupNorm subclass whose call
  applies an in-place activation to the result of ``F.group_norm`` within its own call;
- ``ScaledStdConv2d`` (NF-ResNet, NFNet): a Conv2d subclass whose weight is standardised by
  ``F.batch_norm`` over each output unit's fan-in, scaled by a learned gain, and whose output the
  next block's ``ReLU(inplace=True)`` overwrites;
- ``StdConv2d`` (BiT): the same standardisation without a gain;
- ``LayerNorm2d`` and layer scale (ConvNeXt): ``F.layer_norm`` over channels of a permuted
  ``(N, C, H, W)`` tensor, a depthwise convolution, a per-channel ``gamma`` multiplying a branch.

Every model must train on the fast engine (``auto`` picks it) and match the one-example-at-a-time
float64 loop at lot sizes 1 and each of the model's dimensions.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.fast import FastEngine
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
DOUBLE = torch.float64
CHANNELS, WIDTH, IMAGE, GROUPS, CLASSES = 3, 8, 6, 4, 3
#: 1, the models' sizes (classes and input channels, groups, width, image side) and 7.
LOT_SIZES = (1, CLASSES, GROUPS, IMAGE, 7, WIDTH)
TOLERANCE = 1e-10


class GroupNormAct(nn.GroupNorm):
    """timm's ``GroupNormAct``: group norm, then an in-place activation, in one module call."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__(groups, channels, dtype=DOUBLE)
        self.act = nn.ReLU(inplace=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        normed = functional.group_norm(inputs, self.num_groups, self.weight, self.bias, self.eps)
        return self.act(normed)  # type: ignore[no-any-return]


class ScaledStdConv2d(nn.Conv2d):
    """timm's ``ScaledStdConv2d``: ``F.batch_norm`` standardises the weight over each output
    unit's fan-in (weight ``gain * fan_in ** -0.5``, no running statistics), then ``F.conv2d``."""

    def __init__(self, d_in: int, d_out: int, *, gain: bool = True) -> None:
        super().__init__(d_in, d_out, 3, padding=1, dtype=DOUBLE)
        self.gain = nn.Parameter(torch.ones(d_out, 1, 1, 1, dtype=DOUBLE)) if gain else None
        self.scale = self.weight[0].numel() ** -0.5

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        scale = self.scale if self.gain is None else (self.gain * self.scale).view(-1)
        weight = functional.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,
            None,
            weight=scale if isinstance(scale, torch.Tensor) else None,
            training=True,
            momentum=0.0,
            eps=1e-6,
        ).reshape_as(self.weight)
        return functional.conv2d(inputs, weight, self.bias, self.stride, self.padding)


class LayerNorm2d(nn.LayerNorm):
    """timm's ``LayerNorm2d``: a LayerNorm over the channels of ``(N, C, H, W)``."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        moved = inputs.permute(0, 2, 3, 1)
        normed = functional.layer_norm(moved, self.normalized_shape, self.weight, self.bias)
        return normed.permute(0, 3, 1, 2)


class NormFreeBlock(nn.Module):
    """NF-ResNet's pre-activation block: ``x + alpha * conv2(relu_(conv1(relu(x) * beta)))``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ScaledStdConv2d(WIDTH, WIDTH)
        self.act = nn.ReLU(inplace=True)  # writes conv1's output in place
        self.conv2 = ScaledStdConv2d(WIDTH, WIDTH)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.conv1(torch.relu(inputs) * 0.9)
        return inputs + 0.2 * self.conv2(self.act(out))


class NormFreeNet(nn.Module):
    """A stem, one NF block, mean pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ScaledStdConv2d(CHANNELS, WIDTH)
        self.block = NormFreeBlock()
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(images)).mean((2, 3)))  # type: ignore[no-any-return]


class BiTNet(nn.Module):
    """ResNetV2 (BiT): ``StdConv2d`` and ``GroupNormAct`` in a pre-activation block."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = ScaledStdConv2d(CHANNELS, WIDTH, gain=False)
        self.norm1 = GroupNormAct(WIDTH, GROUPS)
        self.conv1 = ScaledStdConv2d(WIDTH, WIDTH, gain=False)
        self.norm2 = GroupNormAct(WIDTH, GROUPS)
        self.conv2 = ScaledStdConv2d(WIDTH, WIDTH, gain=False)
        self.norm = GroupNormAct(WIDTH, GROUPS)
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images)
        x = x + self.conv2(self.norm2(self.conv1(self.norm1(x))))
        return self.head(self.norm(x).mean((2, 3)))  # type: ignore[no-any-return]


class ConvNeXtNet(nn.Module):
    """ConvNeXt's block: depthwise 3 x 3 convolution, LayerNorm (channels last), a 4x MLP, layer
    scale ``gamma``, residual; a ``LayerNorm2d`` after the stem."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(CHANNELS, WIDTH, 2, stride=2, dtype=DOUBLE)
        self.stem_norm = LayerNorm2d(WIDTH, dtype=DOUBLE)
        self.depthwise = nn.Conv2d(WIDTH, WIDTH, 3, padding=1, groups=WIDTH, dtype=DOUBLE)
        self.norm = nn.LayerNorm(WIDTH, dtype=DOUBLE)
        self.fc1 = nn.Linear(WIDTH, 4 * WIDTH, dtype=DOUBLE)
        self.fc2 = nn.Linear(4 * WIDTH, WIDTH, dtype=DOUBLE)
        self.gamma = nn.Parameter(0.5 * torch.ones(WIDTH, dtype=DOUBLE))
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem_norm(self.stem(images))
        branch = self.depthwise(x).permute(0, 2, 3, 1)
        branch = self.fc2(functional.gelu(self.fc1(self.norm(branch))))
        x = x + (branch * self.gamma).permute(0, 3, 1, 2)
        return self.head(x.mean((2, 3)))  # type: ignore[no-any-return]


MODELS = {"nf_resnet": NormFreeNet, "bit": BiTNet, "convnext": ConvNeXtNet}


def _lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, CHANNELS, IMAGE, IMAGE, generator=generator, dtype=DOUBLE)
    return images, torch.randint(0, CLASSES, (size,), generator=generator)


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def _assert_matches_loop(engine: PerExampleEngine, model: nn.Module) -> None:
    for size in LOT_SIZES:
        inputs, targets = _lot(size, size)
        gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
        norms = loop_norms(gradients)
        engine.max_grad_norm = float(norms.median())  # clips about half of the examples
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
        torch.testing.assert_close(lot.norms, norms, atol=TOLERANCE, rtol=0)
        expected = loop_clipped_sum(gradients, engine.max_grad_norm)
        for (name, _), found, wanted in zip(
            engine.named_parameters, lot.summed, expected, strict=True
        ):
            torch.testing.assert_close(found, wanted, atol=TOLERANCE, rtol=0, msg=name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_auto_keeps_the_fast_path_and_matches_the_loop(name: str) -> None:
    model = _model(name)
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(8, 1), CROSS_ENTROPY)  # no fallback warning: errors in this suite
    assert engine.name == "fast"
    _assert_matches_loop(engine, model)


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
@pytest.mark.parametrize("name", ["nf_resnet", "bit"])
def test_in_place_writes_are_exact_with_either_norm_strategy(name: str, strategy: str) -> None:
    model = _model(name)
    _assert_matches_loop(FastEngine(model, max_grad_norm=1.0, norm_strategy=strategy), model)  # type: ignore[arg-type]


def test_the_in_place_activation_still_changes_the_models_output() -> None:
    """The copies the fast path hands downstream keep the model's function: its outputs on the
    fast path equal its plain outputs."""
    for name in ("nf_resnet", "bit"):
        model = _model(name)
        engine = FastEngine(model, max_grad_norm=1.0)
        inputs, targets = _lot(5, 3)
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
        with torch.no_grad():
            torch.testing.assert_close(lot.outputs, model(inputs), atol=1e-12, rtol=0)


def test_copies_are_kept_only_where_a_recorded_result_is_written_in_place() -> None:
    """NF-ResNet: the convolution whose output the in-place ReLU overwrites (``block.conv1``)
    goes on with a copy, the others do not; BiT: each ``GroupNormAct``'s own call does."""
    model = _model("nf_resnet")
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*_lot(4, 1), CROSS_ENTROPY)
    conv1 = frozenset({"block.conv1.weight", "block.conv1.gain", "block.conv1.bias"})
    assert engine._copied_meetings == {conv1}
    model = _model("bit")
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*_lot(4, 1), CROSS_ENTROPY)
    copying = {layer.path for layer in engine._layers if layer.copy_result}
    assert copying == {"norm1", "norm2", "norm"}
