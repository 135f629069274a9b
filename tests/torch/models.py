"""Small models shared by the per-example engine tests (float64 by default, deterministic).

Each model takes a batch-first input and returns logits; ``make_batch`` in each class gives a
matching ``(inputs, targets)`` lot for ``nn.CrossEntropyLoss(reduction="none")``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from dpcore.torch.layers import DPLSTM

__all__ = [
    "MLP",
    "Conv1dNet",
    "EmbeddingLSTMClassifier",
    "SharedLinearNet",
    "SmallCNN",
    "TrainingOnlyPath",
    "TransformerBlockClassifier",
]


def _labels(generator: torch.Generator, batch_size: int, classes: int) -> torch.Tensor:
    return torch.randint(0, classes, (batch_size,), generator=generator)


class MLP(nn.Module):
    """``Linear -> tanh -> Linear -> tanh -> Linear`` on ``(batch, in_features)``."""

    def __init__(
        self,
        in_features: int = 6,
        hidden: int = 8,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.in_features, self.classes = in_features, classes
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden, dtype=dtype),
            nn.Tanh(),
            nn.Linear(hidden, hidden, dtype=dtype),
            nn.Tanh(),
            nn.Linear(hidden, classes, dtype=dtype),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        dtype = self.layers[0].weight.dtype
        inputs = torch.randn(batch_size, self.in_features, generator=generator, dtype=dtype)
        return inputs, _labels(generator, batch_size, self.classes)


class SmallCNN(nn.Module):
    """``Conv2d, GroupNorm, ReLU, Conv2d(stride 2, dilation 2), ReLU, AvgPool, Linear``."""

    def __init__(
        self,
        channels: int = 2,
        size: int = 8,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.channels, self.size, self.classes = channels, size, classes
        self.features = nn.Sequential(
            nn.Conv2d(channels, 4, 3, padding=1, dtype=dtype),
            nn.GroupNorm(2, 4, dtype=dtype),
            nn.ReLU(),
            nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, dtype=dtype),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, channels, size, size, dtype=dtype)).shape[1]
        self.head = nn.Linear(flat, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(inputs))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        dtype = self.head.weight.dtype
        shape = (batch_size, self.channels, self.size, self.size)
        inputs = torch.randn(*shape, generator=generator, dtype=dtype)
        return inputs, _labels(generator, batch_size, self.classes)


class Conv1dNet(nn.Module):
    """``Conv1d(same), ReLU, Conv1d(stride 2, reflect padding), mean over time, Linear``.

    Inputs are ``(batch, channels, length)``.
    """

    def __init__(
        self,
        channels: int = 3,
        length: int = 10,
        classes: int = 3,
        *,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.channels, self.length, self.classes = channels, length, classes
        self.conv1 = nn.Conv1d(channels, 4, 3, padding="same", dilation=2, dtype=dtype)
        self.conv2 = nn.Conv1d(4, 5, 3, stride=2, padding=1, padding_mode="reflect", dtype=dtype)
        self.head = nn.Linear(5, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = functional.relu(self.conv1(inputs))
        return self.head(self.conv2(hidden).mean(dim=2))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        dtype = self.head.weight.dtype
        shape = (batch_size, self.channels, self.length)
        inputs = torch.randn(*shape, generator=generator, dtype=dtype)
        return inputs, _labels(generator, batch_size, self.classes)


class EmbeddingLSTMClassifier(nn.Module):
    """``Embedding(padding_idx=0) -> DPLSTM (bidirectional) -> mean over time -> Linear``.

    ``lstm_class`` may be ``nn.LSTM`` for the non-private counterpart.
    """

    def __init__(
        self,
        vocabulary: int = 12,
        embedding: int = 5,
        hidden: int = 4,
        classes: int = 2,
        *,
        length: int = 7,
        bidirectional: bool = True,
        lstm_class: type[nn.Module] = DPLSTM,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.vocabulary, self.length, self.classes = vocabulary, length, classes
        self.embedding = nn.Embedding(vocabulary, embedding, padding_idx=0, dtype=dtype)
        self.lstm = lstm_class(
            embedding, hidden, batch_first=True, bidirectional=bidirectional, dtype=dtype
        )
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), classes, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(self.embedding(tokens))
        return self.head(output.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens with repeats and trailing padding (index 0)."""
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(
            1, min(self.vocabulary, 5), (batch_size, self.length), generator=generator
        )
        tokens[:, -2:] = 0
        return tokens, _labels(generator, batch_size, self.classes)


class TransformerBlockClassifier(nn.Module):
    """A pre-norm transformer block from Linear layers, then a mean-pooled Linear head.

    ``x + Attention(LayerNorm(x))``, then ``+ MLP(LayerNorm(.))``; single- or multi-head softmax
    attention computed functionally from ``q, k, v`` Linear projections.
    """

    def __init__(
        self,
        width: int = 8,
        heads: int = 2,
        classes: int = 3,
        *,
        length: int = 5,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.width, self.heads, self.length, self.classes = width, heads, length, classes
        self.norm1 = nn.LayerNorm(width, dtype=dtype)
        self.query = nn.Linear(width, width, dtype=dtype)
        self.key = nn.Linear(width, width, dtype=dtype)
        self.value = nn.Linear(width, width, dtype=dtype)
        self.out = nn.Linear(width, width, dtype=dtype)
        self.norm2 = nn.LayerNorm(width, dtype=dtype)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width, dtype=dtype),
            nn.GELU(),
            nn.Linear(2 * width, width, dtype=dtype),
        )
        self.head = nn.Linear(width, classes, dtype=dtype)

    def _split(self, tensor: torch.Tensor) -> torch.Tensor:
        batch, length, _ = tensor.shape
        return tensor.view(batch, length, self.heads, -1).transpose(1, 2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(inputs)
        q, k, v = (self._split(f(normed)) for f in (self.query, self.key, self.value))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(inputs.shape)
        hidden = inputs + self.out(attended)
        hidden = hidden + self.mlp(self.norm2(hidden))
        return self.head(hidden.mean(dim=1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch_size, self.length, self.width)
        inputs = torch.randn(*shape, generator=generator, dtype=self.head.weight.dtype)
        return inputs, _labels(generator, batch_size, self.classes)


class SharedLinearNet(nn.Module):
    """The same Linear applied twice (weight sharing), ``Linear(tanh(shared(tanh(shared(x)))))``."""

    def __init__(
        self, width: int = 5, classes: int = 3, *, dtype: torch.dtype = torch.float64
    ) -> None:
        super().__init__()
        self.width, self.classes = width, classes
        self.shared = nn.Linear(width, width, dtype=dtype)
        self.head = nn.Linear(width, classes, dtype=dtype)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.shared(torch.tanh(self.shared(inputs)))))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        inputs = torch.randn(
            batch_size, self.width, generator=generator, dtype=self.head.weight.dtype
        )
        return inputs, _labels(generator, batch_size, self.classes)


class TrainingOnlyPath(nn.Module):
    """A parameter used only in training mode, through ``h @ W`` (no fast-path rule): the fast
    path's eval-mode trials never reach it, its first training lot does."""

    def __init__(self, classes: int = 2) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.extra = nn.Parameter(0.1 * torch.randn(4, 4))
        self.head = nn.Linear(4, classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.first(inputs))
        if self.training:
            hidden = hidden + hidden @ self.extra
        return self.head(hidden)  # type: ignore[no-any-return]
