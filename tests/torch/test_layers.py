"""DPLSTM computes the same function as nn.LSTM."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.layers import DPLSTM, IdentityInputLSTM


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_dplstm_matches_nn_lstm(bidirectional: bool, with_state: bool) -> None:
    torch.manual_seed(0)
    reference = nn.LSTM(3, 4, batch_first=True, bidirectional=bidirectional, dtype=torch.float64)
    lstm = DPLSTM(3, 4, bidirectional=bidirectional, dtype=torch.float64)
    lstm.load_lstm_weights(reference)
    inputs = torch.randn(5, 7, 3, dtype=torch.float64)
    directions = 2 if bidirectional else 1
    state = None
    if with_state:
        state = (
            torch.randn(directions, 5, 4, dtype=torch.float64),
            torch.randn(directions, 5, 4, dtype=torch.float64),
        )
    expected, (h_expected, c_expected) = reference(inputs, state)
    output, (h_n, c_n) = lstm(inputs, state)
    assert output.shape == (5, 7, 4 * directions)
    assert h_n.shape == c_n.shape == (directions, 5, 4)
    torch.testing.assert_close(output, expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(h_n, h_expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(c_n, c_expected, atol=1e-10, rtol=0)
    # Gradients agree too (the inner identity is frozen and receives none).
    (output.square().sum() + h_n.sum()).backward()
    (expected.square().sum() + h_expected.sum()).backward()
    assert reference.weight_hh_l0.grad is not None
    torch.testing.assert_close(
        lstm.directions[0].recurrent.weight_hh_l0.grad,
        reference.weight_hh_l0.grad,
        atol=1e-10,
        rtol=0,
    )
    assert lstm.directions[0].recurrent.weight_ih_l0.grad is None


def test_dplstm_without_bias_and_trainable_parameters() -> None:
    reference = nn.LSTM(2, 3, batch_first=True, bias=False, dtype=torch.float64)
    lstm = DPLSTM(2, 3, bias=False, dtype=torch.float64)
    lstm.load_lstm_weights(reference)
    inputs = torch.randn(2, 4, 2, dtype=torch.float64)
    torch.testing.assert_close(lstm(inputs)[0], reference(inputs)[0], atol=1e-10, rtol=0)
    names = [n for n, p in lstm.named_parameters() if p.requires_grad]
    assert names == ["directions.0.input_projection.weight", "directions.0.recurrent.weight_hh_l0"]


def test_identity_input_lstm_reset_keeps_identity_frozen() -> None:
    inner = IdentityInputLSTM(3)
    inner.reset_parameters()
    assert torch.equal(inner.weight_ih_l0, torch.eye(12))
    assert not inner.weight_ih_l0.requires_grad


def test_invalid_arguments() -> None:
    with pytest.raises(InvalidParameterError, match="hidden_size"):
        DPLSTM(3, 0)
    with pytest.raises(InvalidParameterError, match="batch_first"):
        DPLSTM(3, 4, batch_first=False)
    with pytest.raises(InvalidParameterError, match="num_layers"):
        DPLSTM(3, 4, num_layers=2)
    lstm = DPLSTM(3, 4)
    with pytest.raises(InvalidParameterError, match="input"):
        lstm(torch.randn(7, 3))
    with pytest.raises(InvalidParameterError, match="h_0"):
        lstm(torch.randn(2, 7, 3), (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(InvalidParameterError, match="lstm"):
        lstm.load_lstm_weights(nn.LSTM(3, 5, batch_first=True))
