"""torch's ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` on the fast path (their recurrence decomposed
into batch-first ``F.linear`` calls) against a one-example-at-a-time float64 autograd loop with
the modules' own kernels, in every layout the modules take."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from dpcore.torch.per_example.fast import FastEngine, fast_path_supports
from tests.torch.reference import assert_matches_loop

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
KINDS = {
    "lstm": lambda **options: nn.LSTM(**options),
    "gru": lambda **options: nn.GRU(**options),
    "rnn_tanh": lambda **options: nn.RNN(**options),
    "rnn_relu": lambda **options: nn.RNN(nonlinearity="relu", **options),
}
LAYOUTS = {
    "one layer, batch first": dict(num_layers=1, batch_first=True),
    "two layers, bidirectional, time first": dict(
        num_layers=2, bidirectional=True, batch_first=False
    ),
    "two layers, bidirectional, no bias": dict(
        num_layers=2, bidirectional=True, batch_first=True, bias=False
    ),
}


class Recurrent(nn.Module):
    """A recurrent layer whose last output and final hidden state feed a linear head; with
    ``initial``, the initial state is a function of the input (so it carries the examples)."""

    def __init__(self, kind: str, initial: bool = False, **options: object) -> None:
        super().__init__()
        self.rnn = KINDS[kind](input_size=3, hidden_size=4, dtype=torch.float64, **options)
        directions = 2 if self.rnn.bidirectional else 1
        self.initial = initial
        self.head = nn.Linear(4 * directions + 4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        layers = self.rnn.num_layers * (2 if self.rnn.bidirectional else 1)
        sequence = inputs if self.rnn.batch_first else inputs.transpose(0, 1)
        state = None
        if self.initial:
            h0 = torch.tanh(inputs.mean(1)[:, :1]).expand(-1, 4).unsqueeze(0)
            h0 = h0.expand(layers, -1, -1).contiguous()
            state = (h0, torch.zeros_like(h0)) if isinstance(self.rnn, nn.LSTM) else h0
        output, final = self.rnn(sequence, state)
        last = output[:, -1] if self.rnn.batch_first else output[-1]
        hidden = final[0] if isinstance(final, tuple) else final
        return self.head(torch.cat([last, hidden[-1]], dim=1))  # type: ignore[no-any-return]


def check(model: nn.Module, lot: int, strategy: str = "auto") -> None:
    generator = torch.Generator().manual_seed(lot)
    inputs = torch.randn(lot, 5, 3, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 3, (lot,), generator=generator)
    engine = FastEngine(model, max_grad_norm=1.0, norm_strategy=strategy)  # type: ignore[arg-type]
    engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, 1e-10)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_recurrent_layers_are_exact_on_the_fast_path(kind: str, layout: str) -> None:
    torch.manual_seed(0)
    model = Recurrent(kind, **LAYOUTS[layout])
    assert fast_path_supports(model)
    for lot in (1, 6):
        check(model, lot)


@pytest.mark.parametrize("strategy", ["ghost", "materialize"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_initial_state_from_the_examples_and_each_norm_strategy(kind: str, strategy: str) -> None:
    torch.manual_seed(1)
    check(Recurrent(kind, initial=True, num_layers=2, batch_first=True), 7, strategy)


def test_auto_trains_recurrent_layers_on_the_fast_path() -> None:
    torch.manual_seed(2)
    model = Recurrent("gru", num_layers=2, bidirectional=True, batch_first=True)
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    inputs = torch.randn(8, 5, 3, dtype=torch.float64)
    targets = torch.randint(0, 3, (8,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "fast"
    assert type(model.rnn).forward is nn.GRU.forward and "forward" not in vars(model.rnn)


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(3, 4, batch_first=True, dtype=torch.float64)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((inputs.shape[0],), inputs.shape[1])
        packed = nn.utils.rnn.pack_padded_sequence(inputs, lengths, batch_first=True)
        _, hidden = self.rnn(packed)
        return self.head(hidden[-1])  # type: ignore[no-any-return]


def test_packed_sequences_are_refused_and_auto_falls_back_to_an_exact_engine() -> None:
    torch.manual_seed(3)
    inputs = torch.randn(6, 5, 3, dtype=torch.float64)
    targets = torch.randint(0, 3, (6,))
    with pytest.raises(IncompatibleModelError, match="PackedSequence"):
        FastEngine(Packed(), max_grad_norm=1.0).prepare(inputs, targets, CROSS_ENTROPY)
    model = Packed()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with pytest.warns(EngineFallbackWarning, match="PackedSequence"):
        engine.prepare(inputs, targets, CROSS_ENTROPY)
    assert engine.name == "loop"
    assert_matches_loop(engine, model, inputs, targets, CROSS_ENTROPY, 1e-10)
