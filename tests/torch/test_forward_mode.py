"""The forward-mode fallbacks of the JL engine: the decomposed LSTM equals nn.LSTM in value and in
Jacobian-vector products; everything is restored; unsupported layers are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, jvp, vmap

from dpcore.torch.errors import IncompatibleModelError
from dpcore.torch.forward_mode import decomposed_lstm_forward, forward_mode_friendly

CPU = torch.device("cpu")


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_decomposed_lstm_equals_nn_lstm(
    batch_first: bool, bidirectional: bool, num_layers: int, bias: bool, with_state: bool
) -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(
        3,
        4,
        num_layers=num_layers,
        bias=bias,
        batch_first=batch_first,
        bidirectional=bidirectional,
    ).double()
    x = torch.randn((2, 5, 3) if batch_first else (5, 2, 3), dtype=torch.float64)
    states = num_layers * (2 if bidirectional else 1)
    hx = (torch.randn(states, 2, 4, dtype=torch.float64),) * 2 if with_state else None
    expected, (h_expected, c_expected) = lstm(x, hx)
    found, (h_found, c_found) = decomposed_lstm_forward(lstm, x, hx)
    for a, b in ((found, expected), (h_found, h_expected), (c_found, c_expected)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_decomposed_lstm_unbatched_input() -> None:
    torch.manual_seed(1)
    lstm = nn.LSTM(3, 4, bidirectional=True, batch_first=True).double()
    x = torch.randn(6, 3, dtype=torch.float64)  # (time, features): batch_first is ignored
    expected, (h_expected, _) = lstm(x)
    found, (h_found, _) = decomposed_lstm_forward(lstm, x)
    torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_found, h_expected, rtol=1e-12, atol=1e-12)


class _Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1]).squeeze(-1)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # torch's first jvp
def test_decomposed_jvp_equals_native_jvp_under_vmap() -> None:
    """The JL engine's product, <d loss_i / d theta, v_j> for every example and direction:
    decomposed LSTM vs the native CPU LSTM (oneDNN off), float64."""
    torch.manual_seed(2)
    model = _Tagger().double()
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    params = {n: p.detach() for n, p in model.named_parameters()}
    tangents = {n: torch.randn(3, *p.shape, dtype=torch.float64) for n, p in params.items()}

    def products() -> torch.Tensor:
        def one(tangent: dict[str, torch.Tensor]) -> torch.Tensor:
            f = lambda p: functional_call(model, p, (x,)).square()  # noqa: E731
            return jvp(f, (params,), (tangent,))[1]

        return vmap(one)(tangents)

    with forward_mode_friendly(model, CPU, decompose_lstm=True):
        decomposed = products()
    with forward_mode_friendly(model, CPU, decompose_lstm=False):
        native = products()
    assert decomposed.shape == (3, 4)
    torch.testing.assert_close(decomposed, native, rtol=1e-10, atol=1e-12)


def test_everything_is_restored() -> None:
    model = _Tagger()
    onednn = torch._C._get_mkldnn_enabled()
    with forward_mode_friendly(model, CPU, decompose_lstm=True):
        assert "forward" in model.lstm.__dict__
    assert "forward" not in model.lstm.__dict__
    with forward_mode_friendly(model, CPU):
        assert not torch._C._get_mkldnn_enabled()
    assert torch._C._get_mkldnn_enabled() == onednn
    custom = lambda *args: ("mine", args)  # noqa: E731
    model.lstm.forward = custom  # an instance override of the user's survives
    with forward_mode_friendly(model, CPU, decompose_lstm=True):
        assert model.lstm.forward is not custom
    assert model.lstm.forward is custom


def test_other_recurrent_layers_are_refused_when_decomposing() -> None:
    model = nn.Sequential(nn.GRU(3, 4))
    with (
        pytest.raises(IncompatibleModelError, match="GRU"),
        forward_mode_friendly(model, CPU, decompose_lstm=True),
    ):
        pass


def test_packed_sequences_and_projections_are_refused() -> None:
    lstm = nn.LSTM(3, 4)
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 3), [5, 3])
    with pytest.raises(IncompatibleModelError, match="PackedSequence"):
        decomposed_lstm_forward(lstm, packed)
    with pytest.raises(IncompatibleModelError, match="proj_size"):
        decomposed_lstm_forward(nn.LSTM(3, 4, proj_size=2), torch.randn(5, 2, 3))


def test_inter_layer_dropout_is_replayed_on_cpu_and_refused_on_cuda() -> None:
    """The JL engine estimates norms in one pass and clips in another; both must draw the same
    dropout masks. On CPU the fused (oneDNN), native and decomposed LSTMs all draw inter-layer
    masks from torch's generator (checked here); on CUDA cuDNN keeps its own dropout state, so
    that configuration is refused (checked through the device argument, no GPU needed)."""
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 8, num_layers=2, dropout=0.5, batch_first=True).double().train()
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    state = torch.get_rng_state()
    fused = lstm(x)[0]
    torch.set_rng_state(state)
    decomposed = decomposed_lstm_forward(lstm, x)[0]
    torch.testing.assert_close(decomposed, fused, rtol=1e-12, atol=1e-12)
    with (
        pytest.raises(IncompatibleModelError, match="dropout"),
        forward_mode_friendly(lstm, torch.device("cuda")),
    ):
        pass
    lstm.eval()  # no masks in eval mode: allowed
    with forward_mode_friendly(lstm, torch.device("cuda")):
        assert "forward" in lstm.__dict__
    assert "forward" not in lstm.__dict__
