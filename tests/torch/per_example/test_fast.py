"""FastEngine (ghost norms + book-keeping) against a one-example-at-a-time autograd loop."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional

from dpcore.errors import InvalidParameterError
from dpcore.torch.errors import IncompatibleModelError, NonFiniteGradientError
from dpcore.torch.layers import DPLSTM
from dpcore.torch.per_example.fast import FastEngine, fast_path_supports
from tests.torch.models import (
    MLP,
    Conv1dNet,
    EmbeddingLSTMClassifier,
    SharedLinearNet,
    SmallCNN,
    TransformerBlockClassifier,
)

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
STRATEGIES = ["auto", "ghost", "materialize"]
MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": MLP,
    "cnn": SmallCNN,
    "conv1d": Conv1dNet,
    "lstm": EmbeddingLSTMClassifier,
    "transformer": TransformerBlockClassifier,
    "shared_linear": SharedLinearNet,
}


def loop_gradients(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Per-example gradients by plain autograd on each example alone, and their norms."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    gradients = []
    for i in range(inputs.shape[0]):
        loss = CROSS_ENTROPY(model(inputs[i : i + 1]), targets[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, parameters, allow_unused=True)
        gradients.append(
            [
                torch.zeros_like(p) if g is None else g
                for p, g in zip(parameters, grads, strict=True)
            ]
        )
    norms = torch.stack([torch.sqrt(sum(g.square().sum() for g in row)) for row in gradients])
    return gradients, norms


def check_against_loop(model: nn.Module, batch_size: int = 6, **engine_options: object) -> None:
    torch.manual_seed(0)
    inputs, targets = model.make_batch(batch_size)  # type: ignore[operator]
    gradients, norms = loop_gradients(model, inputs, targets)
    bound = float(norms.median())  # clips some examples but not all
    engine = FastEngine(model, max_grad_norm=bound, **engine_options)  # type: ignore[arg-type]
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    torch.testing.assert_close(lot.norms, norms, atol=1e-8, rtol=0)
    factors = torch.clamp(bound / norms, max=1.0)
    assert bool((factors < 1).any()) and bool((factors == 1).any())
    for index, summed in enumerate(lot.summed):
        expected = sum(f * row[index] for f, row in zip(factors, gradients, strict=True))
        torch.testing.assert_close(summed, expected, atol=1e-8, rtol=0)
    assert bool((lot.norms * lot.clip_factors <= bound * (1 + 1e-6)).all())
    torch.testing.assert_close(lot.losses, CROSS_ENTROPY(model(inputs), targets).detach())


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_matches_per_example_loop(name: str, strategy: str) -> None:
    torch.manual_seed(1)
    check_against_loop(MODELS[name](), norm_strategy=strategy)


def test_grouped_and_padded_convolutions() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(
        nn.Conv2d(4, 6, 3, groups=2, padding=1, padding_mode="circular", dtype=torch.float64),
        nn.Tanh(),
        nn.Conv2d(6, 6, (2, 3), groups=6, stride=(1, 2), padding="valid", dtype=torch.float64),
        nn.Flatten(),
        nn.Linear(6 * 4 * 2, 3, dtype=torch.float64),
    )
    generator = torch.Generator().manual_seed(0)

    def make_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn(batch_size, 4, 5, 5, generator=generator, dtype=torch.float64)
        return inputs, torch.randint(0, 3, (batch_size,), generator=generator)

    model.make_batch = make_batch  # type: ignore[assignment]
    for strategy in STRATEGIES:
        check_against_loop(model, norm_strategy=strategy)


def test_sequence_linear_with_partly_frozen_parameters() -> None:
    torch.manual_seed(3)
    model = TransformerBlockClassifier()
    model.query.bias.requires_grad_(False)
    model.norm1.weight.requires_grad_(False)
    check_against_loop(model)


def test_dplstm_with_initial_state_and_unidirectional() -> None:
    torch.manual_seed(4)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = DPLSTM(3, 4, dtype=torch.float64)
            self.initial = nn.Linear(3, 8, dtype=torch.float64)
            self.head = nn.Linear(4, 2, dtype=torch.float64)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            h0, c0 = self.initial(inputs[:, 0]).unsqueeze(0).chunk(2, dim=-1)
            _, (h_n, _) = self.lstm(inputs, (h0.contiguous(), c0.contiguous()))
            return self.head(h_n[0])

        def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
            generator = torch.Generator().manual_seed(0)
            inputs = torch.randn(batch_size, 6, 3, generator=generator, dtype=torch.float64)
            return inputs, torch.randint(0, 2, (batch_size,), generator=generator)

    for strategy in STRATEGIES:
        check_against_loop(Model(), norm_strategy=strategy)


def test_embedding_padding_and_repeats() -> None:
    torch.manual_seed(5)
    embedding = nn.Embedding(6, 3, padding_idx=2, dtype=torch.float64)
    tokens = torch.tensor([[2, 1, 1, 2, 1, 4], [3, 3, 3, 3, 2, 2], [2, 2, 2, 2, 2, 2]])
    backprop_weights = torch.randn(3, 6, 3, dtype=torch.float64)
    for strategy in STRATEGIES:
        engine = FastEngine(embedding, max_grad_norm=1e9, norm_strategy=strategy)  # type: ignore[arg-type]
        lot = engine.clipped_sum(
            tokens, backprop_weights, lambda out, weights: (out * weights).sum((1, 2))
        )
        expected_rows = []
        for i in range(3):
            grad = torch.zeros(6, 3, dtype=torch.float64)
            for t in range(6):
                if tokens[i, t] != 2:
                    grad[tokens[i, t]] += backprop_weights[i, t]
            expected_rows.append(grad)
        norms = torch.stack([g.norm() for g in expected_rows])
        torch.testing.assert_close(lot.norms, norms, atol=1e-12, rtol=0)
        assert float(lot.norms[2]) == 0.0
        torch.testing.assert_close(lot.summed[0], sum(expected_rows), atol=1e-12, rtol=0)
        assert float(lot.summed[0][2].abs().sum()) == 0.0


def test_reused_linear_is_handled_exactly() -> None:
    model = SharedLinearNet()
    engine = FastEngine(model, max_grad_norm=1.0)
    assert len(engine._layers) == 2
    check_against_loop(model)


class _MatmulMixer(nn.Module):
    """Mixes features by ``x @ W`` on a parameter (an operation without a per-example rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4, dtype=torch.float64)
        self.mixer = nn.Module()
        self.mixer.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
        self.head = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(inputs) @ self.mixer.weight
        return self.head(hidden.mean(1))


def test_unsupported_layers_name_the_parameter_at_the_first_lot() -> None:
    inputs = torch.randn(5, 3, 4, dtype=torch.float64)
    targets = torch.tensor([0, 1, 0, 1, 1])
    engine = FastEngine(_MatmulMixer(), max_grad_norm=1.0)  # decided on the data flow
    with pytest.raises(IncompatibleModelError, match=r"mixer\.weight.*VmapEngine"):
        engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert not fast_path_supports(_MatmulMixer())
    lstm = nn.Sequential(nn.Embedding(6, 3), nn.LSTM(3, 3, batch_first=True, proj_size=2))
    tokens = torch.randint(0, 6, (5, 4))
    with warnings.catch_warnings():  # "LSTM with projections is not supported with oneDNN"
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(IncompatibleModelError, match=r"proj_size"):
            FastEngine(lstm, max_grad_norm=1.0).prepare(
                tokens, torch.zeros(5, 4, 2), lambda out, y: (out[0] - y).square().sum((1, 2))
            )
    assert not fast_path_supports(lstm)
    assert fast_path_supports(EmbeddingLSTMClassifier())
    assert not fast_path_supports(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))


def test_unfrozen_identity_and_sparse_embedding_are_rejected() -> None:
    lstm = DPLSTM(2, 3)
    lstm.requires_grad_(True)
    with pytest.raises(IncompatibleModelError, match=r"directions\.0\.recurrent.*frozen"):
        FastEngine(lstm, max_grad_norm=1.0)
    sparse = nn.Embedding(5, 2, sparse=True)
    with pytest.raises(IncompatibleModelError, match="sparse"):
        FastEngine(sparse, max_grad_norm=1.0)


class _InPlaceResidual(nn.Module):
    """A ResNet-style block: in-place ReLU after a conv, a norm and a linear layer, and
    ``out += shortcut`` on a norm's output."""

    def __init__(self) -> None:
        super().__init__()
        double = {"dtype": torch.float64}
        self.conv1 = nn.Conv2d(2, 2, 3, padding=1, **double)
        self.norm1 = nn.GroupNorm(1, 2, **double)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(2, 2, 3, padding=1, **double)
        self.norm2 = nn.GroupNorm(2, 2, **double)
        self.first = nn.Linear(18, 5, **double)
        self.second = nn.Linear(5, 5, **double)
        self.head = nn.Linear(5, 3, **double)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        shortcut = images
        out = self.relu(self.conv1(images))
        out = self.relu(self.norm1(out))
        out = self.norm2(self.conv2(out))
        out += shortcut
        out = self.relu(out)
        return self.head(self.second(self.relu(self.first(out.flatten(1)))))

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch_size)
        images = torch.randn(batch_size, 2, 3, 3, generator=generator, dtype=torch.float64)
        return images, torch.randint(0, 3, (batch_size,), generator=generator)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_in_place_writes_after_recorded_layers_stay_exact(strategy: str) -> None:
    torch.manual_seed(4)
    model = _InPlaceResidual()
    check_against_loop(model, batch_size=7, norm_strategy=strategy)
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*model.make_batch(8), CROSS_ENTROPY)
    copied = {layer.path for layer in engine._layers if layer.copy_output}
    assert copied == {"conv1", "norm1", "norm2", "first"}
    assert not any(layer.copy_saved for layer in engine._layers)


class _WritesInputAfterUse(nn.Module):
    """Writes in place to a layer's input after the call (legal for autograd: the layer's
    weight is frozen, so autograd kept no reference to the input)."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Linear(4, 4, dtype=torch.float64)
        self.shift.weight.requires_grad_(False)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(inputs)
        shifted = self.shift(hidden)
        hidden.mul_(2.0)
        return self.head(shifted * hidden)

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch_size)
        inputs = torch.randn(batch_size, 4, generator=generator, dtype=torch.float64)
        return inputs, torch.randint(0, 3, (batch_size,), generator=generator)


def test_a_layer_whose_input_is_written_after_its_call_keeps_a_copy() -> None:
    torch.manual_seed(5)
    model = _WritesInputAfterUse()
    check_against_loop(model, batch_size=7)
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*model.make_batch(8), CROSS_ENTROPY)
    assert [(layer.path, layer.copy_saved) for layer in engine._layers] == [
        ("shift", True),
        ("head", False),
    ]


class _ReluInside(nn.Linear):
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return functional.linear(inputs, self.weight, self.bias).relu_()


class _WritesInsideItsCall(nn.Module):
    """A layer whose own call writes the result of its ``F.linear`` in place (timm's
    ``GroupNormAct`` does so to the result of ``F.group_norm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _ReluInside(3, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(inputs))  # type: ignore[no-any-return]

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch_size)
        inputs = torch.randn(batch_size, 3, generator=generator, dtype=torch.float64)
        return inputs, torch.randint(0, 2, (batch_size,), generator=generator)


def test_a_layer_that_writes_in_place_inside_its_call_goes_on_with_a_copy() -> None:
    torch.manual_seed(5)
    model = _WritesInsideItsCall()
    check_against_loop(model, batch_size=7)
    engine = FastEngine(model, max_grad_norm=1.0)
    engine.prepare(*model.make_batch(8), CROSS_ENTROPY)
    assert [(layer.path, layer.copy_result) for layer in engine._layers] == [
        ("inner", True),
        ("head", False),
    ]


def test_non_batch_first_data_is_rejected() -> None:
    class TimeFirst(nn.Module):
        """Time-first data through a reshape, whose layout the data flow does not follow."""

        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 2)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            time_first = inputs.transpose(0, 1).reshape(inputs.shape[1], inputs.shape[0], -1)
            return self.linear(time_first).mean(0)

    engine = FastEngine(TimeFirst(), max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match=r"'linear'.*batch"):
        engine.clipped_sum(torch.randn(4, 5, 3), torch.tensor([0, 1, 0, 1]), CROSS_ENTROPY)


@pytest.mark.parametrize("name", ["cnn", "lstm", "transformer"])
def test_nonfinite_rows(name: str) -> None:
    torch.manual_seed(6)
    model = MODELS[name]()
    inputs, targets = model.make_batch(5)  # type: ignore[operator]
    if inputs.is_floating_point():
        inputs[2] = float("nan")
    else:  # poison the embedding row of a token only example 2 uses
        model.embedding.weight.data[7] = float("nan")  # type: ignore[union-attr, index]
        inputs[2, 0] = 7
    with pytest.raises(NonFiniteGradientError, match=r"\[2\]"):
        FastEngine(model, max_grad_norm=0.5).clipped_sum(inputs, targets, CROSS_ENTROPY)
    lot = FastEngine(model, max_grad_norm=0.5, nonfinite="zero").clipped_sum(
        inputs, targets, CROSS_ENTROPY
    )
    assert float(lot.clip_factors[2]) == 0.0
    keep = torch.tensor([0, 1, 3, 4])
    rest = FastEngine(model, max_grad_norm=0.5).clipped_sum(
        inputs[keep], targets[keep], CROSS_ENTROPY
    )
    for summed, expected in zip(lot.summed, rest.summed, strict=True):
        assert bool(torch.isfinite(summed).all())
        torch.testing.assert_close(summed, expected, atol=1e-10, rtol=0)


def test_empty_lot_and_invalid_strategy() -> None:
    model = MLP()
    engine = FastEngine(model, max_grad_norm=1.0)
    lot = engine.clipped_sum(
        torch.zeros(0, 6, dtype=torch.float64), torch.zeros(0, dtype=torch.long), CROSS_ENTROPY
    )
    assert lot.norms.shape == (0,)
    assert all(float(s.abs().sum()) == 0.0 for s in lot.summed)
    with pytest.raises(InvalidParameterError, match="norm_strategy"):
        FastEngine(model, max_grad_norm=1.0, norm_strategy="fast")  # type: ignore[arg-type]


def test_hooks_are_removed_and_model_still_trains_normally() -> None:
    model = MLP()
    inputs, targets = model.make_batch(4)
    FastEngine(model, max_grad_norm=1.0).clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    CROSS_ENTROPY(model(inputs), targets).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


class _HiddenProduct(torch.autograd.Function):
    """``x @ w.T`` whose forward reads ``w`` detached: the data flow sees no use of ``w``, and
    only the function's own backward gives it gradient."""

    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        return inputs @ weight.detach().t()

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, weight = ctx.saved_tensors
        return gradient @ weight, gradient.t() @ inputs


class _HiddenReuse(nn.Module):
    """Uses its child's weight both through the child and in an operation the data flow cannot
    see (hooks and meetings see one use)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inner(x) + _HiddenProduct.apply(x, self.inner.weight)
        return self.head(torch.tanh(hidden))


class _FunctionalReuse(nn.Module):
    """Uses its child's weight both through the child and by ``F.linear`` (summed, exact)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 2, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inner(x) + torch.nn.functional.linear(x, self.inner.weight)
        return self.head(torch.tanh(hidden))

    def make_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch_size)
        inputs = torch.randn(batch_size, 4, generator=generator, dtype=torch.float64)
        return inputs, torch.randint(0, 2, (batch_size,), generator=generator)


def test_first_lot_verification_catches_gradient_the_hooks_miss() -> None:
    model = _HiddenReuse()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 2, (6,), generator=generator)
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    with pytest.raises(IncompatibleModelError, match=r"'inner\.weight'.*VmapEngine"):
        FastEngine(model, max_grad_norm=1.0).clipped_sum(inputs, targets, loss_fn)


def test_a_weight_used_through_its_layer_and_functionally_is_exact() -> None:
    check_against_loop(_FunctionalReuse())


def test_verification_runs_once_and_passes_on_supported_models() -> None:
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    engine = FastEngine(model, max_grad_norm=1.0)
    inputs = torch.randn(4, 3, dtype=torch.float64)
    targets = torch.tensor([0, 1, 1, 0])
    loss_fn = nn.CrossEntropyLoss(reduction="none")
    engine.clipped_sum(inputs, targets, loss_fn)
    assert engine._verified


def test_first_lot_reference_is_taken_in_ieee_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuDNN convolutions default to TF32; autograd's reference gradient for the first-lot check
    must be taken in IEEE float32 (a TF32 reference refused a correct CNN at lot 262,144 on an
    H100). The precision in force during the reference backward is recorded here."""
    seen: list[str] = []
    original = torch.autograd.grad

    def recording_grad(*args: object, **kwargs: object) -> object:
        seen.append(torch.backends.cudnn.conv.fp32_precision)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    engine = FastEngine(model, max_grad_norm=1.0)
    monkeypatch.setattr(torch.autograd, "grad", recording_grad)
    engine.clipped_sum(
        torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 0]), nn.CrossEntropyLoss(reduction="none")
    )
    assert "ieee" in seen
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"  # restored afterwards


class _TokenTypes(nn.Module):
    """BERT's embeddings in small: tokens plus a position table plus token types looked up at a
    batch-sized expansion of a constant buffer (with a padding row)."""

    def __init__(self, padding_idx: int | None) -> None:
        super().__init__()
        self.tokens = nn.Embedding(11, 4)
        self.positions = nn.Embedding(8, 4)
        self.types = nn.Embedding(3, 4, padding_idx=padding_idx)
        self.register_buffer("type_ids", torch.tensor([[0, 1, 2, 1, 0, 2, 2]]))
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        size, length = tokens.shape
        types = self.types(self.type_ids[:, :length].expand(size, length))
        positions = self.positions(torch.arange(length).unsqueeze(0))
        hidden = torch.tanh(self.tokens(tokens) + types + positions)
        return self.head(hidden.mean(1))

    def make_batch(self, batch_size: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 11, (batch_size, 7), generator=generator)
        return tokens, torch.randint(0, 3, (batch_size,), generator=generator)


@pytest.mark.parametrize("padding_idx", [None, 2, -1])
@pytest.mark.parametrize("batch_size", [3, 5, 8])
def test_tables_looked_up_at_constant_indices_are_exact_without_a_pull_back(
    monkeypatch: pytest.MonkeyPatch, padding_idx: int | None, batch_size: int
) -> None:
    """The per-example table gradients of lookups at constant indices (a shared position table, a
    batch-sized expansion of a buffer) follow the lookup's rule: no gradient is pulled back
    through them (for the expansion, that would be a (B, B, T, d) tensor)."""
    from dpcore.torch.per_example import independent

    pulled: list[tuple[int, ...]] = []
    original = independent.pull_back

    def spy(tensor: torch.Tensor, rows: torch.Tensor, parameters: Any) -> Any:
        pulled.append(tuple(tensor.shape))
        return original(tensor, rows, parameters)

    monkeypatch.setattr(independent, "pull_back", spy)
    torch.manual_seed(2)
    check_against_loop(_TokenTypes(padding_idx).double(), batch_size=batch_size)
    assert not pulled  # both tables read by the lookup's rule


class _ScaledInPlace(_TokenTypes):
    """The token types scaled in place after the lookup: no longer a plain lookup."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        size, length = tokens.shape
        types = self.types(self.type_ids[:, :length].expand(size, length))
        types.mul_(3.0)
        return self.head(torch.tanh(self.tokens(tokens) + types).mean(1))


def test_a_lookup_written_in_place_is_pulled_back_through_autograd() -> None:
    torch.manual_seed(3)
    check_against_loop(_ScaledInPlace(None).double(), batch_size=5)


def test_a_forward_that_never_settles_is_refused_not_looped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every re-run of the pass sets one more layer to copy or to trace; a pass that asks for
    re-runs without end (a subclass that undoes the setting, as an audit's planted engine once
    did) is a typed refusal after a bounded number, not a hang."""
    from dpcore.torch.per_example import fast

    calls = []

    def rerun(*args: object, **kwargs: object) -> None:
        calls.append(1)
        raise fast._RerunError

    model = nn.Sequential(nn.Linear(3, 2))
    engine = FastEngine(model, max_grad_norm=1.0)
    monkeypatch.setattr(engine, "_pass_once", rerun)
    with pytest.raises(IncompatibleModelError, match="did not settle"):
        engine._pass(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]), CROSS_ENTROPY, reference=False)
    assert 1 < len(calls) <= 4 * len(engine._layers) + 2 * len(engine.named_parameters) + 8
