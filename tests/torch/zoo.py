"""A zoo of small float64 models for checking that per-example gradient engines are exact.

Each model is batch-first, returns logits ``(batch, classes)`` and has ``make_batch`` giving a
matching ``(inputs, targets)`` lot for ``nn.CrossEntropyLoss(reduction="none")``. The models
exercise parameters reached other than through one batched layer call: position tables added by
broadcasting, learned CLS and prompt tokens concatenated to every example, a batch-independent
table fed through a Linear, tied embedding/head weights, one Linear under two module paths, and
``nn.MultiheadAttention``. ``own_dims`` lists each model's own non-batch sizes (sequence lengths,
widths, vocabularies, patch counts, parameter dimensions), and ``lot_sizes`` the lot sizes worth
testing: 0, 1, every size that coincides with one of those dimensions, and one that does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "ZOO",
    "AttentionMHA",
    "CLSTokenEncoder",
    "GroupNormResBlock",
    "PositionTableThroughLinear",
    "PositionalGPT",
    "PromptTuned",
    "SharedAcrossModules",
    "TiedEmbeddingLM",
    "TinyViT",
    "ZooModel",
    "lot_sizes",
]

_MAX_DIM = 64


def _labels(generator: torch.Generator, batch_size: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (batch_size,), generator=generator)


class ZooModel(nn.Module):
    """Base of the zoo: ``classes``, ``make_batch`` and ``own_dims``."""

    classes: int

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _named_dims(self) -> tuple[int, ...]:
        """The model's own sizes (lengths, widths, ...); parameter shapes are added by own_dims."""
        raise NotImplementedError

    def own_dims(self) -> tuple[int, ...]:
        """Sorted distinct non-batch dimensions in ``[1, 64]`` that a lot size could coincide with.

        The sizes the model names (``_named_dims``) and every dimension of every parameter.
        """
        dims = set(self._named_dims())
        for parameter in self.parameters():
            dims.update(parameter.shape)
        return tuple(sorted(d for d in dims if 1 <= d <= _MAX_DIM))

    def _dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


def lot_sizes(model: ZooModel) -> list[int]:
    """``{0, 1}``, the model's ``own_dims`` and the smallest size ``>= 2`` that is none of them."""
    own = set(model.own_dims())
    other = 2
    while other in own:
        other += 1
    return sorted({0, 1, other} | own)


class _SelfAttention(nn.Module):
    """Single-head softmax self-attention from ``query, key, value, proj`` Linear layers."""

    def __init__(self, width: int, *, causal: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.causal = causal
        self.query = nn.Linear(width, width, dtype=dtype)
        self.key = nn.Linear(width, width, dtype=dtype)
        self.value = nn.Linear(width, width, dtype=dtype)
        self.proj = nn.Linear(width, width, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        q, k, v = self.query(inputs), self.key(inputs), self.value(inputs)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if self.causal:
            length = inputs.shape[1]
            future = torch.ones(length, length, dtype=torch.bool, device=inputs.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return self.proj(torch.softmax(scores, dim=-1) @ v)


class _Block(nn.Module):
    """Pre-norm block: ``x + Attention(LayerNorm(x))``, then ``+ MLP(LayerNorm(.))``."""

    def __init__(self, width: int, *, causal: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, dtype=dtype)
        self.attention = _SelfAttention(width, causal=causal, dtype=dtype)
        self.norm2 = nn.LayerNorm(width, dtype=dtype)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width, dtype=dtype),
            nn.GELU(),
            nn.Linear(2 * width, width, dtype=dtype),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs + self.attention(self.norm1(inputs))
        return hidden + self.mlp(self.norm2(hidden))


class PositionalGPT(ZooModel):
    """Token plus position ``Embedding`` (a ``(T, d)`` table broadcast over the lot), one causal
    pre-norm block, final LayerNorm, mean over time, Linear head. Inputs are tokens
    ``(batch, length)``.
    """

    def __init__(
        self,
        vocabulary: int = 7,
        length: int = 5,
        width: int = 6,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.vocabulary, self.length, self.width, self.classes = vocabulary, length, width, classes
        self.tokens = nn.Embedding(vocabulary, width, dtype=dtype)
        self.positions = nn.Embedding(length, width, dtype=dtype)
        self.block = _Block(width, causal=True, dtype=dtype)
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.norm(self.block(x)).mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.vocabulary, (batch_size, self.length), generator=generator)
        return tokens, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.vocabulary, self.length, self.width, 2 * self.width, self.classes)


class PositionTableThroughLinear(ZooModel):
    """A trainable ``(length, width)`` table through ``mix`` (a batch-independent Linear call on
    the table alone), added to the input ``(batch, length, width)``; Linear, tanh, mean over time,
    Linear head.
    """

    def __init__(
        self,
        length: int = 5,
        width: int = 6,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.length, self.width, self.classes = length, width, classes
        self.table = nn.Parameter(torch.randn(length, width, dtype=dtype) * 0.1)
        self.mix = nn.Linear(width, width, dtype=dtype)
        self.hidden = nn.Linear(width, width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.hidden(inputs + self.mix(self.table)))
        return self.head(hidden.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.length, self.width)
        inputs = torch.randn(*shape, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.length, self.width, self.classes)


class CLSTokenEncoder(ZooModel):
    """Linear embedding of ``(batch, length, in_features)``, a learned CLS token concatenated in
    front, a bare learned position parameter added, one (non-causal) pre-norm block, and the CLS
    output through LayerNorm and a Linear head.
    """

    def __init__(
        self,
        length: int = 4,
        width: int = 6,
        classes: int = 3,
        *,
        in_features: int = 5,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.length, self.width, self.classes = length, width, classes
        self.in_features = in_features
        self.embed = nn.Linear(in_features, width, dtype=dtype)
        self.cls = nn.Parameter(torch.randn(1, 1, width, dtype=dtype) * 0.1)
        self.position = nn.Parameter(torch.randn(1, length + 1, width, dtype=dtype) * 0.1)
        self.block = _Block(width, causal=False, dtype=dtype)
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.block(x)[:, 0]))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.length, self.in_features)
        inputs = torch.randn(*shape, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (
            self.length,
            self.length + 1,
            self.width,
            2 * self.width,
            self.in_features,
            self.classes,
        )


class PromptTuned(ZooModel):
    """A learned ``(prompt_length, width)`` prompt concatenated in front of the token embeddings
    of ``(batch, length)`` tokens; Linear, tanh, mean over positions, Linear head.
    """

    def __init__(
        self,
        vocabulary: int = 7,
        length: int = 5,
        prompt_length: int = 2,
        width: int = 6,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.vocabulary, self.length, self.prompt_length = vocabulary, length, prompt_length
        self.width, self.classes = width, classes
        self.tokens = nn.Embedding(vocabulary, width, dtype=dtype)
        self.prompt = nn.Parameter(torch.randn(prompt_length, width, dtype=dtype) * 0.1)
        self.hidden = nn.Linear(width, width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        embedded = self.tokens(tokens)
        prompt = self.prompt.unsqueeze(0).expand(embedded.shape[0], -1, -1)
        hidden = torch.tanh(self.hidden(torch.cat([prompt, embedded], dim=1)))
        return self.head(hidden.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.vocabulary, (batch_size, self.length), generator=generator)
        return tokens, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (
            self.vocabulary,
            self.length,
            self.prompt_length,
            self.prompt_length + self.length,
            self.width,
            self.classes,
        )


class TinyViT(ZooModel):
    """Conv2d patch embedding of ``(batch, channels, image, image)``, a CLS token concatenated in
    front, a learned position parameter added, one pre-norm block, and the CLS output through
    LayerNorm and a Linear head.
    """

    def __init__(
        self,
        channels: int = 1,
        image: int = 6,
        patch: int = 2,
        width: int = 8,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.channels, self.image, self.patch, self.width = channels, image, patch, width
        self.classes = classes
        self.grid = image // patch
        self.patches = self.grid * self.grid
        self.embed = nn.Conv2d(channels, width, kernel_size=patch, stride=patch, dtype=dtype)
        self.cls = nn.Parameter(torch.randn(1, 1, width, dtype=dtype) * 0.1)
        self.position = nn.Parameter(torch.randn(1, self.patches + 1, width, dtype=dtype) * 0.1)
        self.block = _Block(width, causal=False, dtype=dtype)
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        return self.head(self.norm(self.block(x)[:, 0]))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.channels, self.image, self.image)
        inputs = torch.randn(*shape, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (
            self.channels,
            self.image,
            self.patch,
            self.grid,
            self.patches,
            self.patches + 1,
            self.width,
            2 * self.width,
            self.classes,
        )


class TiedEmbeddingLM(ZooModel):
    """Token ``Embedding``, Linear, tanh, mean over time, and a bias-free head whose weight *is*
    the embedding weight (tied); predicts one of ``vocabulary`` classes.
    """

    def __init__(
        self,
        vocabulary: int = 6,
        length: int = 4,
        width: int = 5,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.vocabulary, self.length, self.width = vocabulary, length, width
        self.classes = vocabulary
        self.tokens = nn.Embedding(vocabulary, width, dtype=dtype)
        self.hidden = nn.Linear(width, width, dtype=dtype)
        self.head = nn.Linear(width, vocabulary, bias=False, dtype=dtype)
        self.head.weight = self.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.hidden(self.tokens(tokens)))
        return self.head(hidden.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, self.vocabulary, (batch_size, self.length), generator=generator)
        return tokens, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.vocabulary, self.length, self.width)


class SharedAcrossModules(ZooModel):
    """One Linear reached through two module paths: ``shared`` and ``block[0]`` (the same
    instance), ``head(block(shared(x)))`` with ``block = Sequential(shared, Tanh())``.
    """

    def __init__(
        self, width: int = 5, classes: int = 3, *, dtype: torch.dtype = torch.float64
    ) -> None:
        super().__init__()
        self.width, self.classes = width, classes
        self.shared = nn.Linear(width, width, dtype=dtype)
        self.block = nn.Sequential(self.shared, nn.Tanh())
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.shared(inputs)))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(batch_size, self.width, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.width, self.classes)


class AttentionMHA(ZooModel):
    """``nn.MultiheadAttention`` self-attention on ``(batch, length, width)``, mean over time,
    Linear head.
    """

    def __init__(
        self,
        length: int = 4,
        width: int = 6,
        heads: int = 2,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.length, self.width, self.heads, self.classes = length, width, heads, classes
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(inputs, inputs, inputs, need_weights=False)
        return self.head(attended.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.length, self.width)
        inputs = torch.randn(*shape, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.length, self.width, self.heads, self.width // self.heads, self.classes)


class GroupNormResBlock(ZooModel):
    """``relu(x + GroupNorm(conv(relu(GroupNorm(conv(x))))))`` on ``(batch, channels, image,
    image)`` (3x3 convolutions, padding 1, two groups), adaptive average pool, Linear head.
    """

    def __init__(
        self,
        channels: int = 4,
        image: int = 5,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.channels, self.image, self.classes = channels, image, classes
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, dtype=dtype)
        self.norm1 = nn.GroupNorm(2, channels, dtype=dtype)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, dtype=dtype)
        self.norm2 = nn.GroupNorm(2, channels, dtype=dtype)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.norm1(self.conv1(inputs)))
        hidden = torch.relu(inputs + self.norm2(self.conv2(hidden)))
        return self.head(self.pool(hidden).flatten(1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.channels, self.image, self.image)
        inputs = torch.randn(*shape, generator=generator, dtype=self._dtype())
        return inputs, _labels(generator, batch_size, self.classes)

    def _named_dims(self) -> tuple[int, ...]:
        return (self.channels, self.image, 2, self.channels // 2, self.classes)


ZOO: dict[str, Callable[[], ZooModel]] = {
    "positional_gpt": PositionalGPT,
    "position_table_through_linear": PositionTableThroughLinear,
    "cls_token_encoder": CLSTokenEncoder,
    "prompt_tuned": PromptTuned,
    "tiny_vit": TinyViT,
    "tied_embedding_lm": TiedEmbeddingLM,
    "shared_across_modules": SharedAcrossModules,
    "attention_mha": AttentionMHA,
    "group_norm_res_block": GroupNormResBlock,
}
