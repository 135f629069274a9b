"""The norm of a parameter's summed per-example gradient from its parts' factors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.torch.per_example.combined_terms import combined_term, inner_products
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.per_example.layer_handlers import (
    OuterFactors,
    ParameterTerm,
    materialized_term,
    outer_product_term,
)

BATCH, D_OUT, D_IN = 4, 7, 5


def _dense(steps: int, generator: torch.Generator) -> OuterFactors:
    activations = torch.randn(BATCH, steps, D_IN, generator=generator, dtype=torch.float64)
    backprops = torch.randn(BATCH, steps, D_OUT, generator=generator, dtype=torch.float64)
    return OuterFactors(activations, backprops, None, D_OUT)


def _indexed(steps: int, generator: torch.Generator) -> OuterFactors:
    activations = torch.randn(BATCH, steps, D_IN, generator=generator, dtype=torch.float64)
    indices = torch.randint(0, D_OUT, (BATCH, steps), generator=generator)
    indices[:, 0] = indices[:, -1]  # a repeated index in every example
    return OuterFactors(activations, None, indices, D_OUT)


def _rows(factors: OuterFactors) -> torch.Tensor:
    """``(batch, d_out, d_in)`` ``G_i = sum_t b_t a_t^T``, written out."""
    if factors.indices is None:
        assert factors.backprops is not None
        backprops = factors.backprops
    else:
        backprops = nn.functional.one_hot(factors.indices, D_OUT).to(torch.float64)
    return torch.einsum("bto,bti->boi", backprops, factors.activations)


@pytest.mark.parametrize(
    "kinds",
    [("dense", "dense"), ("indexed", "dense"), ("dense", "indexed"), ("indexed", "indexed")],
)
def test_inner_products_equal_those_of_the_written_out_gradients(kinds: tuple[str, str]) -> None:
    generator = torch.Generator().manual_seed(3)
    make = {"dense": _dense, "indexed": _indexed}
    first, second = make[kinds[0]](6, generator), make[kinds[1]](3, generator)
    expected = (_rows(first) * _rows(second)).sum((1, 2))
    torch.testing.assert_close(inner_products(first, second), expected, atol=1e-12, rtol=0)


def _term(factors: OuterFactors, *, rows_allowed: bool = True) -> ParameterTerm:
    rows = _rows(factors)

    def no_rows() -> torch.Tensor:
        raise AssertionError("the rows were materialised")

    term = materialized_term("weight", rows, torch.Size([D_OUT, D_IN]))
    return ParameterTerm(
        "weight",
        term.squared_norms,
        term.weighted_sum,
        term.rows if rows_allowed else no_rows,
        factors,
    )


@pytest.mark.parametrize("strategy", ["auto", "ghost", "materialize"])
def test_combined_norms_and_clipped_sums_are_those_of_the_summed_gradient(strategy: str) -> None:
    generator = torch.Generator().manual_seed(5)
    parts = [_dense(2, generator), _indexed(3, generator), _dense(1, generator)]
    total = sum(_rows(p) for p in parts)
    # auto: 3 pairs of at most 6 products of (d_in + d_out) = 12 cost less than 6 * 35 rows
    terms = [_term(p, rows_allowed=strategy == "materialize") for p in parts]
    combined = combined_term("weight", terms, torch.Size([D_OUT, D_IN]), strategy=strategy)  # type: ignore[arg-type]
    torch.testing.assert_close(
        combined.squared_norms, total.square().sum((1, 2)), atol=1e-12, rtol=0
    )
    factors = torch.tensor([1.0, 0.5, 0.0, 0.25], dtype=torch.float64)
    keep = torch.tensor([True, True, False, True])
    expected = (factors.view(-1, 1, 1) * total)[keep].sum(0)
    torch.testing.assert_close(combined.weighted_sum(factors, keep), expected, atol=1e-12, rtol=0)


def test_parts_without_factors_or_in_other_layouts_are_summed_row_by_row() -> None:
    generator = torch.Generator().manual_seed(7)
    first = _dense(4, generator)
    shape = torch.Size([D_OUT, D_IN])
    without = materialized_term("weight", _rows(_dense(2, generator)), shape)
    combined = combined_term("weight", [_term(first), without], shape, strategy="ghost")
    total = _rows(first) + without.rows()
    torch.testing.assert_close(
        combined.squared_norms, total.square().sum((1, 2)), atol=1e-12, rtol=0
    )
    # a conv-like layout (d_out, d_in) = (7, 5) against a parameter of another element count
    wrong = combined_term(
        "weight", [_term(first), _term(first)], torch.Size([D_OUT, D_IN + 1]), strategy="ghost"
    )
    assert wrong.factors is None
    torch.testing.assert_close(wrong.squared_norms, (2 * _rows(first)).square().sum((1, 2)))


def test_the_auto_rule_materialises_when_the_pairs_cost_more() -> None:
    generator = torch.Generator().manual_seed(9)
    long = [_indexed(40, generator), _dense(40, generator)]  # 1600 * 12 > 80 * 35
    with pytest.raises(AssertionError, match="materialised"):
        combined_term(
            "weight",
            [_term(f, rows_allowed=False) for f in long],
            torch.Size([D_OUT, D_IN]),
            strategy="auto",
        )
    term = outer_product_term(
        "weight",
        long[1].activations.unsqueeze(1),
        long[1].backprops.unsqueeze(1),  # type: ignore[union-attr]
        shape=torch.Size([D_OUT, D_IN]),
        strategy="materialize",
    )
    assert term.factors is not None  # materialised terms keep their factors for combining


@pytest.mark.parametrize("strategy", ["auto", "ghost", "materialize"])
def test_dense_parts_are_one_sum_over_all_their_steps(strategy: str) -> None:
    """A weight used once a step (a recurrent weight): its dense parts are concatenated along
    the steps, and no part's gradient is written out."""
    generator = torch.Generator().manual_seed(11)
    parts = [_dense(1, generator) for _ in range(12)] + [_dense(40, generator)]
    total = sum(_rows(p) for p in parts)
    terms = [_term(p, rows_allowed=False) for p in parts]
    combined = combined_term("weight", terms, torch.Size([D_OUT, D_IN]), strategy=strategy)  # type: ignore[arg-type]
    torch.testing.assert_close(
        combined.squared_norms, total.square().sum((1, 2)), atol=1e-12, rtol=0
    )
    assert combined.factors is not None and combined.factors.steps == 52
    factors = torch.tensor([1.0, 0.5, 0.0, 0.25], dtype=torch.float64)
    keep = torch.tensor([True, True, False, True])
    expected = (factors.view(-1, 1, 1) * total)[keep].sum(0)
    torch.testing.assert_close(combined.weighted_sum(factors, keep), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(combined.rows(), total, atol=1e-12, rtol=0)


class TiedLanguageModel(nn.Module):
    """A token table read by the embedding and, transposed, by the output layer (GPT-2's tie)."""

    def __init__(self, vocabulary: int = 11, width: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width, padding_idx=0, dtype=torch.float64)
        self.mix = nn.Linear(width, width, dtype=torch.float64)
        self.head = nn.Linear(width, vocabulary, bias=False, dtype=torch.float64)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def _loop(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Per-example gradient norms and gradients, one example at a time."""
    norms, gradients = [], []
    for i in range(tokens.shape[0]):
        model.zero_grad()
        logits = model(tokens[i : i + 1])
        nn.functional.cross_entropy(logits.flatten(0, 1), targets[i], reduction="sum").backward()
        row = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        gradients.append(row)
        norms.append(torch.sqrt(sum(g.square().sum() for g in row)))
    return torch.stack(norms), gradients


@pytest.mark.parametrize("steps", [2, 9])  # the embedding's index-Gram rule and its row rule
@pytest.mark.parametrize("strategy", ["auto", "ghost", "materialize"])
def test_a_tied_language_model_is_exact(steps: int, strategy: str) -> None:
    torch.manual_seed(11)
    model = TiedLanguageModel()
    tokens = torch.randint(0, 11, (5, steps))
    tokens[0, 0] = 0  # a padding lookup
    targets = torch.randint(0, 11, (5, steps))
    expected, gradients = _loop(model, tokens, targets)
    bound = float(expected.median())
    engine = FastEngine(model, max_grad_norm=bound, norm_strategy=strategy)  # type: ignore[arg-type]
    lot = engine.clipped_sum(
        tokens,
        targets,
        lambda logits, t: nn.functional.cross_entropy(
            logits.transpose(1, 2), t, reduction="none"
        ).sum(1),
    )
    torch.testing.assert_close(lot.norms, expected, atol=1e-10, rtol=0)
    factors = (bound / expected).clamp(max=1.0)
    for index, summed in enumerate(lot.summed):
        clipped = sum(f * row[index] for f, row in zip(factors, gradients, strict=True))
        torch.testing.assert_close(summed, clipped, atol=1e-10, rtol=0)
    assert engine._verified
