"""The paper models: sizes, shapes, and nn.LSTM vs DPLSTM computing the same function."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.layers import DPLSTM
from dpcore.torch.models import IMDB_SEQUENCE_LENGTH, imdb_lstm, tf_privacy_mnist_cnn
from dpcore.torch.per_example.fast import fast_path_supports


def _count(model: nn.Module, *, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def test_mnist_cnn_matches_the_tutorial_sizes() -> None:
    model = tf_privacy_mnist_cnn()
    assert _count(model) == 26_010  # 1040 + 8224 + 16416 + 330
    assert tuple(model(torch.rand(3, 1, 28, 28)).shape) == (3, 10)
    assert fast_path_supports(model)


def test_mnist_cnn_dtype() -> None:
    model = tf_privacy_mnist_cnn(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model(torch.rand(2, 1, 28, 28, dtype=torch.float64)).dtype == torch.float64


def test_imdb_lstm_sizes_and_shapes() -> None:
    reference = imdb_lstm(recurrent="lstm")
    # 8000 * 64 + 2 * (4 * 64 * (64 + 64) + 2 * 4 * 64) + (128 * 64 + 64) + (64 + 1)
    assert _count(reference) == 586_881
    private = imdb_lstm()  # DPLSTM merges b_ih + b_hh: 2 * 256 fewer trainable parameters
    assert isinstance(private.lstm, DPLSTM)
    assert _count(private) == 586_881 - 2 * 256
    tokens = torch.randint(0, 8000, (4, IMDB_SEQUENCE_LENGTH))
    for model in (reference, private):
        assert tuple(model(tokens).shape) == (4,)
    assert fast_path_supports(private)
    assert fast_path_supports(reference)  # its recurrence decomposed


def test_imdb_lstm_small_sizes() -> None:
    model = imdb_lstm(vocab_size=50, embedding_dim=4, hidden_size=3)
    assert tuple(model(torch.randint(0, 50, (2, 7))).shape) == (2,)


def test_imdb_lstm_rejects_unknown_recurrent() -> None:
    with pytest.raises(InvalidParameterError, match="recurrent"):
        imdb_lstm(recurrent="gru")  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="vocab_size"):
        imdb_lstm(vocab_size=0)


def test_lstm_and_dplstm_variants_compute_the_same_function() -> None:
    torch.manual_seed(0)
    sizes = {"vocab_size": 300, "embedding_dim": 16, "hidden_size": 8}
    reference = imdb_lstm(**sizes, recurrent="lstm", dtype=torch.float64)
    private = imdb_lstm(**sizes, recurrent="dplstm", dtype=torch.float64)
    with torch.no_grad():
        for name in ("embedding", "dense", "output"):
            getattr(private, name).load_state_dict(getattr(reference, name).state_dict())
    assert isinstance(private.lstm, DPLSTM) and isinstance(reference.lstm, nn.LSTM)
    private.lstm.load_lstm_weights(reference.lstm)
    tokens = torch.randint(0, 300, (5, 23))
    labels = torch.randint(0, 2, (5,), dtype=torch.float64)
    outputs = [model(tokens) for model in (reference, private)]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-12, atol=1e-12)
    # The summary is h_n of both directions: forward after the last token, reverse after the first.
    sequence, _ = reference.lstm(reference.embedding(tokens))
    hidden = reference.lstm.hidden_size
    summary = torch.cat([sequence[:, -1, :hidden], sequence[:, 0, hidden:]], dim=1)
    expected = reference.output(reference.activation(reference.dense(summary))).squeeze(-1)
    torch.testing.assert_close(outputs[0], expected, rtol=1e-12, atol=1e-12)
    # Same function, so the same gradients for the shared layers.
    loss = nn.BCEWithLogitsLoss()
    for output in outputs:
        loss(output, labels).backward()
    for name in ("embedding.weight", "dense.weight", "dense.bias", "output.weight"):
        torch.testing.assert_close(
            reference.get_parameter(name).grad, private.get_parameter(name).grad
        )
