"""The decomposed recurrences equal torch's nn.GRU, nn.RNN and nn.LSTM, and run under vmap,
where torch's own kernels cannot; packed sequences and projections are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.recurrent import decomposed_forward, decomposed_recurrence

LAYERS = {
    "gru": lambda **options: nn.GRU(3, 4, **options),
    "rnn_tanh": lambda **options: nn.RNN(3, 4, nonlinearity="tanh", **options),
    "rnn_relu": lambda **options: nn.RNN(3, 4, nonlinearity="relu", **options),
    "lstm": lambda **options: nn.LSTM(3, 4, **options),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_decomposed_forward_equals_the_layer(
    kind: str, batch_first: bool, bidirectional: bool, bias: bool, with_state: bool
) -> None:
    torch.manual_seed(0)
    layer = LAYERS[kind](
        num_layers=2, bias=bias, batch_first=batch_first, bidirectional=bidirectional
    ).double()
    x = torch.randn((2, 5, 3) if batch_first else (5, 2, 3), dtype=torch.float64)
    states = 2 * (2 if bidirectional else 1)
    hx = None
    if with_state:
        h = torch.randn(states, 2, 4, dtype=torch.float64)
        hx = (h, torch.randn_like(h)) if kind == "lstm" else h
    expected = layer(x, hx)
    found = decomposed_forward(layer, x, hx)
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["gru", "rnn_tanh"])
def test_unbatched_input(kind: str) -> None:
    torch.manual_seed(1)
    layer = LAYERS[kind](bidirectional=True, batch_first=True).double()
    x = torch.randn(6, 3, dtype=torch.float64)  # (time, features)
    torch.testing.assert_close(decomposed_forward(layer, x), layer(x), rtol=1e-12, atol=1e-12)


def test_dropout_between_layers_draws_like_the_layer_in_training() -> None:
    torch.manual_seed(2)
    layer = nn.GRU(3, 4, num_layers=3, dropout=0.5, batch_first=True).double().train()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    torch.manual_seed(7)
    found, _ = decomposed_forward(layer, x)
    assert found.shape == (2, 5, 4) and bool(torch.isfinite(found).all())
    layer.eval()  # no dropout: equal
    torch.testing.assert_close(decomposed_forward(layer, x), layer(x), rtol=1e-12, atol=1e-12)


def test_the_context_routes_and_restores_every_recurrent_layer() -> None:
    model = nn.ModuleDict({"gru": nn.GRU(3, 4), "rnn": nn.RNN(3, 4), "lstm": nn.LSTM(3, 4)})
    with decomposed_recurrence(model):
        assert all("forward" in module.__dict__ for module in model.values())
    assert not any("forward" in module.__dict__ for module in model.values())


def test_under_vmap_where_the_kernels_cannot_run() -> None:
    torch.manual_seed(3)
    layer = nn.GRU(3, 4, batch_first=True).double()
    x = torch.randn(5, 6, 3, dtype=torch.float64)

    def last(row: torch.Tensor) -> torch.Tensor:
        return layer(row.unsqueeze(0))[0][0, -1]

    with pytest.raises(RuntimeError):
        torch.func.vmap(last)(x)
    with decomposed_recurrence(layer):
        batched = torch.func.vmap(last)(x)
    torch.testing.assert_close(batched, layer(x)[0][:, -1], rtol=1e-12, atol=1e-12)


def test_packed_sequences_and_projections_are_refused() -> None:
    gru = nn.GRU(3, 4, batch_first=True)
    packed = nn.utils.rnn.pack_padded_sequence(
        torch.randn(2, 5, 3), torch.tensor([5, 3]), batch_first=True
    )
    with pytest.raises(IncompatibleModelError, match="PackedSequence"):
        decomposed_forward(gru, packed)
    with pytest.raises(IncompatibleModelError, match="proj_size"):
        decomposed_forward(nn.LSTM(3, 4, proj_size=2), torch.randn(5, 1, 3))
