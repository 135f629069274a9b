"""``nn.MultiheadAttention`` and ``nn.TransformerEncoder`` on the fast path: the attention call is
computed from its projections (``F.linear``) and the parameter-free attention, so every weight
gets a Linear layer's exact per-example gradient; equal to the float64 loop at lot sizes 1, each
of the model's dimensions and one other, chosen by ``engine="auto"``. A call the fast path cannot
follow (torch's fused kernel taking the weights) is refused by name, never trained silently."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import IncompatibleModelError, NoExactEngineError
from dpcore.torch.per_example import dataflow
from dpcore.torch.per_example.attention import decomposable, multi_head_attention
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.fast import FastEngine, fast_path_supports
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
DOUBLE = torch.float64
LENGTH, WIDTH, HEADS, CLASSES, FEED_FORWARD = 4, 6, 2, 3, 8
#: 1, the models' own sizes (heads, classes and head width, a decoder's and the encoder's lengths,
#: model width, feed-forward width) and one other.
LOT_SIZES = (1, HEADS, CLASSES, LENGTH, 5, WIDTH, FEED_FORWARD)


def _padding(inputs: torch.Tensor) -> torch.Tensor:
    """A key padding mask hiding a data-dependent set of positions, never the first."""
    hidden = inputs[:, 1:, 0] > 0.3
    return torch.cat([torch.zeros(inputs.shape[0], 1, dtype=torch.bool), hidden], dim=1)


def _causal() -> torch.Tensor:
    return torch.triu(torch.ones(LENGTH, LENGTH, dtype=torch.bool), diagonal=1)


class Attention(nn.Module):
    """``nn.MultiheadAttention`` in one configuration, mean over time, Linear head."""

    def __init__(
        self,
        *,
        batch_first: bool = True,
        bias: bool = True,
        need_weights: bool = False,
        masks: bool = False,
        cross: bool = False,
        bias_kv: bool = False,
        zero_attention: bool = False,
        other_dims: bool = False,
        example_mask: bool = False,
    ) -> None:
        super().__init__()
        self.example_mask = example_mask
        self.batch_first, self.need_weights, self.masks, self.cross = (
            batch_first,
            need_weights,
            masks,
            cross,
        )
        dims = {"kdim": 4, "vdim": 5} if other_dims else {}
        self.attention = nn.MultiheadAttention(
            WIDTH,
            HEADS,
            bias=bias,
            batch_first=batch_first,
            add_bias_kv=bias_kv,
            add_zero_attn=zero_attention,
            dtype=DOUBLE,
            **dims,  # type: ignore[arg-type]
        )
        self.keys = nn.Linear(WIDTH, dims.get("kdim", WIDTH), dtype=DOUBLE)
        self.values = nn.Linear(WIDTH, dims.get("vdim", WIDTH), dtype=DOUBLE)
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        padding = _padding(inputs) if self.masks else None
        causal: torch.Tensor | None = _causal() if self.masks else None
        if self.example_mask:  # (N * heads, L, L), float, computed from each example
            first = inputs[:, :, :1]
            bias = -(first - first.transpose(1, 2)).abs()
            causal = bias.repeat_interleave(HEADS, dim=0)
        if self.cross:  # keys and values from other tensors (the packed weight is sliced)
            key, value = self.keys(inputs), self.values(inputs)
        else:
            key = value = inputs
        if not self.batch_first:
            inputs, key, value = (t.transpose(0, 1) for t in (inputs, key, value))
            if not self.cross:
                key = value = inputs
        attended, weights = self.attention(
            inputs,
            key,
            value,
            key_padding_mask=padding,
            attn_mask=causal,
            need_weights=self.need_weights,
        )
        if not self.batch_first:
            attended = attended.transpose(0, 1)
        pooled = attended.mean(1)
        if weights is not None:  # the returned weights reach the loss too
            pooled = pooled + weights[:, :, -1].sum(1, keepdim=True)
        return self.head(pooled)


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` (two layers; batch first, or torch's default sequence first),
    mean over time, Linear head."""

    def __init__(
        self,
        *,
        norm_first: bool,
        masks: bool = False,
        causal: bool = False,
        batch_first: bool = True,
    ) -> None:
        super().__init__()
        self.masks, self.causal, self.batch_first = masks, causal, batch_first
        layer = nn.TransformerEncoderLayer(
            WIDTH,
            HEADS,
            FEED_FORWARD,
            dropout=0.0,
            batch_first=batch_first,
            norm_first=norm_first,
            dtype=DOUBLE,
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        mask = _causal() if self.masks or self.causal else None
        padding = _padding(inputs) if self.masks else None
        if not self.batch_first:
            inputs = inputs.transpose(0, 1)
        encoded = self.encoder(
            inputs, mask=mask, src_key_padding_mask=padding, is_causal=self.causal
        )
        return self.head(encoded.mean(1 if self.batch_first else 0))


def _lot(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, LENGTH, WIDTH, generator=generator, dtype=DOUBLE)
    return inputs, torch.randint(0, CLASSES, (size,), generator=generator)


def _assert_matches_loop(engine: PerExampleEngine, model: nn.Module, size: int) -> None:
    inputs, targets = _lot(size, seed=10 + size)
    gradients = loop_gradients(model, inputs, targets, CROSS_ENTROPY)
    norms = loop_norms(gradients)
    engine.max_grad_norm = float(norms.median())  # clips about half of the examples
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    torch.testing.assert_close(lot.norms, norms, atol=1e-10, rtol=0)
    expected = loop_clipped_sum(gradients, engine.max_grad_norm)
    for (name, _), found, wanted in zip(engine.named_parameters, lot.summed, expected, strict=True):
        torch.testing.assert_close(found, wanted, atol=1e-10, rtol=0, msg=name)


def _assert_auto_is_fast_and_exact(model: nn.Module) -> None:
    assert fast_path_supports(model)
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    engine.prepare(*_lot(8, 0), CROSS_ENTROPY)
    assert engine.name == "fast"
    for size in LOT_SIZES:
        _assert_matches_loop(engine, model, size)


ATTENTION = {
    "plain": {},
    "sequence_first": {"batch_first": False},
    "no_bias": {"bias": False},
    "weights": {"need_weights": True},
    "masks": {"masks": True},
    "masks_weights": {"masks": True, "need_weights": True},
    "cross": {"cross": True},
    "cross_sequence_first": {"cross": True, "batch_first": False},
    "bias_kv_zero_attention": {"bias_kv": True, "zero_attention": True, "masks": True},
    "kdim_vdim": {"cross": True, "other_dims": True},
    "example_mask": {"example_mask": True},
    "example_mask_weights": {"example_mask": True, "need_weights": True, "batch_first": False},
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_multihead_attention_is_fast_and_exact(name: str) -> None:
    torch.manual_seed(0)
    _assert_auto_is_fast_and_exact(Attention(**ATTENTION[name]))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"norm_first": False},
        {"norm_first": True},
        {"norm_first": False, "masks": True},
        {"norm_first": True, "causal": True},
        {"norm_first": False, "batch_first": False},
        {"norm_first": True, "batch_first": False, "masks": True},
    ],
)
def test_transformer_encoder_is_fast_and_exact(options: dict[str, bool]) -> None:
    torch.manual_seed(0)
    _assert_auto_is_fast_and_exact(Encoder(**options))


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_the_engine_decomposes_every_attention_call_in_eval_and_train_mode(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In eval mode ``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` may call torch's
    fused inference kernel instead of ``F.multi_head_attention_forward``; with trainable weights
    and gradients on they do not: every attention call of the engine's passes is decomposed, and
    the result stays exact in either mode."""
    torch.manual_seed(0)
    assert torch.backends.mha.get_fastpath_enabled()
    model = Encoder(norm_first=False).train(mode == "train")
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*_lot(8, 0), CROSS_ENTROPY)
    calls: list[int] = []

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return multi_head_attention(*args, **kwargs)

    monkeypatch.setattr(dataflow, "multi_head_attention", counted)
    for size in (1, WIDTH):
        _assert_matches_loop(engine, model, size)
    assert model.training == (mode == "train")
    # two layers, each called in three passes: the two lots' and the first lot's norm check
    assert len(calls) == 2 * 3


class FusedAttention(nn.Module):
    """Calls torch's fused attention kernel with the module's weights (as the inference fast
    path does): one operation that takes the weights and the examples together."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True, dtype=DOUBLE)
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        attention = self.attention
        attended, _ = torch._native_multi_head_attention(
            inputs,
            inputs,
            inputs,
            WIDTH,
            HEADS,
            attention.in_proj_weight,
            attention.in_proj_bias,
            attention.out_proj.weight,
            attention.out_proj.bias,
            need_weights=False,
        )
        return self.head(attended.mean(1))


def test_a_fused_attention_kernel_is_refused_by_name() -> None:
    torch.manual_seed(0)
    with pytest.raises(IncompatibleModelError, match=r"attention\.in_proj_weight") as refused:
        FastEngine(FusedAttention(), max_grad_norm=1.0).prepare(*_lot(6, 0), CROSS_ENTROPY)
    assert "attention.in_proj_weight" in refused.value.parameters  # type: ignore[attr-defined]
    engine = make_engine(FusedAttention(), engine="auto", max_grad_norm=1.0)
    with pytest.raises(NoExactEngineError, match=r"fast: .*attention\.in_proj_weight"):
        engine.prepare(*_lot(6, 0), CROSS_ENTROPY)  # the kernel has no derivative for vmap


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_the_decomposition_is_torch_s_function(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs and returned weights equal ``F.multi_head_attention_forward``'s, float64."""
    torch.manual_seed(0)
    model = Attention(**ATTENTION[name])  # type: ignore[arg-type]
    inputs, _ = _lot(5, 3)
    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
    original = functional.multi_head_attention_forward

    def recording(*args: object, **kwargs: object) -> object:
        calls.append((args, kwargs))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(functional, "multi_head_attention_forward", recording)
    model(inputs)
    monkeypatch.undo()
    ((args, kwargs),) = calls
    assert decomposable(args, kwargs)
    expected = original(*args, **kwargs)  # type: ignore[arg-type]
    found = multi_head_attention(*args, **kwargs)
    torch.testing.assert_close(found[0], expected[0], atol=1e-12, rtol=0)
    if expected[1] is None:
        assert found[1] is None
    else:
        torch.testing.assert_close(found[1], expected[1], atol=1e-12, rtol=0)


class EncoderDecoder(nn.Module):
    """``nn.Transformer``: self-attention, causal self-attention and cross-attention to the
    encoder's memory (key and value one tensor, the query another)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            WIDTH, HEADS, 1, 1, FEED_FORWARD, dropout=dropout, batch_first=True, dtype=DOUBLE
        )
        self.head = nn.Linear(WIDTH, CLASSES, dtype=DOUBLE)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        targets = 0.5 * inputs[:, :3]
        mask = nn.Transformer.generate_square_subsequent_mask(3, dtype=DOUBLE)
        decoded = self.transformer(inputs, targets, tgt_mask=mask, tgt_is_causal=True)
        return self.head(decoded.mean(1))


def test_encoder_decoder_transformer_is_fast_and_exact() -> None:
    torch.manual_seed(0)
    _assert_auto_is_fast_and_exact(EncoderDecoder())


def test_training_with_attention_dropout_passes_the_first_lot_verification() -> None:
    """In train mode the attention's dropout draws one mask per pass; the first lot's clipped sum
    without clipping equals autograd's gradient of the same pass (checked by the engine)."""
    torch.manual_seed(0)
    model = EncoderDecoder(dropout=0.2).train()
    engine = FastEngine(model, max_grad_norm=1e6)
    inputs, targets = _lot(6, 1)
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert engine._verified
    assert bool((lot.clip_factors == 1).all()) and bool(torch.isfinite(lot.norms).all())
    assert model.training
