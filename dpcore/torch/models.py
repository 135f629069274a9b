"""The models of the papers dpcore reproduces, as small builders (benchmarks and reproductions).

- :func:`tf_privacy_mnist_cnn`: the MNIST CNN of the TensorFlow Privacy tutorial
  (``tutorials/mnist_dpsgd_tutorial.py``), also used by the Opacus MNIST example
  (``examples/mnist.py``): 26,010 parameters.
- :func:`imdb_lstm`: the IMDb sentiment model of DP-SGD-JL (Bu, Gopi, Kulkarni, Lee, Shen,
  Tantipongpipat 2021, arXiv 2102.03013, §5): ``Embedding(8000, 64)``, a bidirectional
  ``LSTM(64)``, ``Dense(64)`` with ReLU and ``Dense(1)``, on sequences of 150 token ids:
  586,881 parameters with ``nn.LSTM`` (586,369 trainable with :class:`~dpcore.torch.layers.DPLSTM`,
  which merges the two biases of each direction).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.layers import DPLSTM
from dpcore.validation import check_count

__all__ = ["IMDB_SEQUENCE_LENGTH", "IMDbLSTM", "imdb_lstm", "tf_privacy_mnist_cnn"]

IMDB_SEQUENCE_LENGTH = 150
"""Tokens per IMDb review after truncation/padding in the JL paper's experiments."""

Recurrent = Literal["dplstm", "lstm"]


def tf_privacy_mnist_cnn(hidden: int = 32, *, dtype: torch.dtype | None = None) -> nn.Sequential:
    """The TensorFlow Privacy tutorial's MNIST CNN (26,010 parameters at ``hidden = 32``).

    ``Conv2d(1, 16, 8, stride 2, padding 3) -> ReLU -> MaxPool2d(2, stride 1)
    -> Conv2d(16, 32, 4, stride 2) -> ReLU -> MaxPool2d(2, stride 1) -> Flatten
    -> Linear(512, hidden) -> ReLU -> Linear(hidden, 10)``, on ``(batch, 1, 28, 28)`` images;
    returns ``(batch, 10)`` logits. Source: TensorFlow Privacy tutorial, ``mnist_dpsgd_tutorial``;
    also the Opacus MNIST example. Every layer has a fast-path handler (exact clipping at about
    the cost of one backward). The count is ``9,264 + 523 hidden + 10``: ``hidden = 32,768``
    gives 17,146,938, exactly the "17M" model of Bu et al. 2021 (arXiv 2102.03013), Table 4.

    Args:
        hidden: units of the dense hidden layer (the tutorial's 32 by default).
        dtype: parameter dtype (default: torch's default dtype).

    Raises:
        InvalidParameterError: ``hidden`` is not an integer >= 1.

    Example:
        >>> model = tf_privacy_mnist_cnn()
        >>> sum(p.numel() for p in model.parameters())
        26010
        >>> tuple(model(torch.zeros(2, 1, 28, 28)).shape)
        (2, 10)
        >>> sum(p.numel() for p in tf_privacy_mnist_cnn(32_768).parameters())
        17146938
    """
    hidden = check_count("hidden", hidden, minimum=1)
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3, dtype=dtype),  # 28x28 -> 14x14
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 13x13
        nn.Conv2d(16, 32, 4, stride=2, dtype=dtype),  # -> 5x5
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 4x4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, hidden, dtype=dtype),
        nn.ReLU(),
        nn.Linear(hidden, 10, dtype=dtype),
    )


class IMDbLSTM(nn.Module):
    """Embedding, bidirectional LSTM, Dense + ReLU, Dense(1): one logit per review.

    The review is summarised as in Keras' ``Bidirectional(LSTM(h))`` (``return_sequences=False``):
    the forward direction's hidden state after the *last* token concatenated with the reverse
    direction's hidden state after the *first* token (i.e. ``h_n`` of both directions). Build it
    with :func:`imdb_lstm`.

    Args:
        vocab_size: rows of the embedding (token ids must be below it).
        embedding_dim: width of the embedding and input size of the LSTM.
        hidden_size: hidden size H of each LSTM direction (and width of the dense layer).
        recurrent: ``"dplstm"`` for :class:`~dpcore.torch.layers.DPLSTM` (same function,
            supported by the exact fast clipping path) or ``"lstm"`` for ``nn.LSTM`` (the
            non-private reference; per-example gradients only through ``VmapEngine``/``JLEngine``).
        dtype: parameter dtype (default: torch's default dtype).
    """

    def __init__(
        self,
        vocab_size: int = 8000,
        embedding_dim: int = 64,
        hidden_size: int = 64,
        *,
        recurrent: Recurrent = "dplstm",
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        vocab_size = check_count("vocab_size", vocab_size, minimum=1)
        embedding_dim = check_count("embedding_dim", embedding_dim, minimum=1)
        hidden_size = check_count("hidden_size", hidden_size, minimum=1)
        self.recurrent_kind: Recurrent = recurrent
        self.embedding = nn.Embedding(vocab_size, embedding_dim, dtype=dtype)
        self.lstm: nn.Module
        if recurrent == "dplstm":
            self.lstm = DPLSTM(embedding_dim, hidden_size, bidirectional=True, dtype=dtype)
        elif recurrent == "lstm":
            self.lstm = nn.LSTM(
                embedding_dim, hidden_size, batch_first=True, bidirectional=True, dtype=dtype
            )
        else:
            raise InvalidParameterError("recurrent", "in {'dplstm', 'lstm'}", recurrent)
        self.dense = nn.Linear(2 * hidden_size, hidden_size, dtype=dtype)
        self.activation = nn.ReLU()
        self.output = nn.Linear(hidden_size, 1, dtype=dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, time)`` token ids -> ``(batch,)`` logits of the positive class."""
        _, (h_n, _) = self.lstm(self.embedding(tokens))
        summary = h_n.transpose(0, 1).reshape(tokens.shape[0], -1)  # (batch, 2H): [fwd, bwd]
        logits: torch.Tensor = self.output(self.activation(self.dense(summary)))
        return logits.squeeze(-1)


def imdb_lstm(
    vocab_size: int = 8000,
    embedding_dim: int = 64,
    hidden_size: int = 64,
    recurrent: Recurrent = "dplstm",
    *,
    dtype: torch.dtype | None = None,
) -> IMDbLSTM:
    """The DP-SGD-JL paper's IMDb model (Bu et al. 2021, arXiv 2102.03013, §5).

    ``Embedding(8000, 64) -> bidirectional LSTM(64) -> Linear(128, 64) -> ReLU -> Linear(64, 1)``
    on ``(batch, 150)`` token ids (:data:`IMDB_SEQUENCE_LENGTH`), returning ``(batch,)`` logits
    for ``nn.BCEWithLogitsLoss``. See :class:`IMDbLSTM` for how the sequence is summarised.

    Example:
        >>> sum(p.numel() for p in imdb_lstm(recurrent="lstm").parameters())
        586881
        >>> model = imdb_lstm()  # DPLSTM: b_ih + b_hh merged, so 2 x 256 fewer parameters
        >>> sum(p.numel() for p in model.parameters() if p.requires_grad)
        586369
        >>> tuple(model(torch.randint(0, 8000, (3, IMDB_SEQUENCE_LENGTH))).shape)
        (3,)
    """
    return IMDbLSTM(vocab_size, embedding_dim, hidden_size, recurrent=recurrent, dtype=dtype)
