"""Opacus 1.6's ``ModuleValidator.fix`` on ``nn.TransformerEncoder``: the replacement it makes,
``DPMultiheadAttention``, computes another function when ``batch_first=True`` and there are
several heads (it lays the heads' outputs out as if the sequence came first), although it holds
the original weights; with one head, or sequence first, it computes the same function.

The models benchmark (:mod:`bench.models`) records the difference on its encoder row; this
test is the claim on its own.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from bench.models_peers import fix_difference

WIDTH = 32


def _encoder(heads: int, batch_first: bool) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        WIDTH, heads, dim_feedforward=37, dropout=0.0, batch_first=batch_first
    )
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).double().eval()


def _fixed(encoder: nn.Module) -> nn.Module:
    from opacus.layers import DPMultiheadAttention
    from opacus.validators import ModuleValidator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = ModuleValidator.fix(copy.deepcopy(encoder))
    # the replacement layers are built in float32 and the weights loaded into them: cast back
    fixed = fixed.double().eval()
    for original, replaced in zip(encoder.layers, fixed.layers, strict=True):
        attention = replaced.self_attn
        assert isinstance(attention, DPMultiheadAttention)
        assert attention.batch_first == original.self_attn.batch_first
        # the weights are the original's: q, k, v are the thirds of in_proj
        q, k, v = original.self_attn.in_proj_weight.chunk(3)
        for linear, part in zip(
            (attention.qlinear, attention.klinear, attention.vlinear), (q, k, v), strict=True
        ):
            torch.testing.assert_close(linear.weight, part, rtol=0, atol=0)
        torch.testing.assert_close(
            attention.out_proj.weight, original.self_attn.out_proj.weight, rtol=0, atol=0
        )
    return fixed


def _difference(heads: int, batch_first: bool) -> float:
    encoder = _encoder(heads, batch_first)
    fixed = _fixed(encoder)
    shape = (5, 9, WIDTH) if batch_first else (9, 5, WIDTH)
    inputs = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((encoder(inputs) - fixed(inputs)).abs().max())


@pytest.mark.parametrize("heads", [2, 4])
def test_the_fixed_batch_first_encoder_computes_another_function(heads: int) -> None:
    difference = _difference(heads, batch_first=True)
    print(f"batch_first=True, {heads} heads: max |output difference| = {difference:.3g}")
    assert difference > 1e-2  # not rounding: the outputs of the two models differ


@pytest.mark.parametrize(("heads", "batch_first"), [(1, True), (2, False), (4, False)])
def test_with_one_head_or_sequence_first_the_fix_keeps_the_function(
    heads: int, batch_first: bool
) -> None:
    assert _difference(heads, batch_first) <= 1e-12


class Classifier(nn.Module):
    """The encoder under a linear head on its mean over the sequence."""

    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.encoder = _encoder(4, batch_first)
        self.head = nn.Linear(WIDTH, 3).double()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        pooled = self.encoder(inputs).mean(1 if self.batch_first else 0)
        return self.head(pooled)  # type: ignore[no-any-return]


def test_fix_difference_reports_the_replacement_and_the_output_difference() -> None:
    inputs = torch.randn(5, 9, WIDTH, dtype=torch.float64)
    found = fix_difference(Classifier(batch_first=True).train(), inputs)
    assert "MultiheadAttention" in found["replaced"]
    assert found["replaced_by"] == ["DPMultiheadAttention"]
    assert found["max_abs_output_difference"] > 1e-2
    same = fix_difference(Classifier(batch_first=False).train(), inputs.transpose(0, 1))
    assert same["replaced_by"] == ["DPMultiheadAttention"]
    assert same["max_abs_output_difference"] <= 1e-12
