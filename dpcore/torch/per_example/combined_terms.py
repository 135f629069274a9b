"""The term of a parameter that gets gradient from several places in one forward.

A weight used twice (GPT-2's token table: read by the embedding and, tied, by the output layer;
a layer called twice) has per-example gradient ``G_i = G_i^(1) + G_i^(2) + ...``, and clipping
needs ``||G_i||``, not the parts' norms. Where every part is an outer-product sum
(:class:`~dpcore.torch.per_example.layer_handlers.OuterFactors`), the norm follows from the
parts' own squared norms and their pairwise inner products,

    ``||sum_j G^(j)||^2 = sum_j ||G^(j)||^2 + 2 sum_{j<l} <G^(j), G^(l)>``,
    ``<sum_t b_t a_t^T, sum_s b'_s a'_s^T> = sum_{t,s} (a_t . a'_s)(b_t . b'_s)``

(the ghost norm of Li, Tramèr, Liang, Hashimoto 2022, between two factorisations; a one-hot
``b`` of an embedding lookup makes ``b_t . b'_s`` an index read), at a cost of about
``T T' (d_in + d_out)`` per pair instead of ``(T + T') d_in d_out`` for materialising every
``G_i``. The clipped sum is linear: the sum of the parts' clipped sums. Where every part's
factors are dense (no embedding lookup among them: a layer or a recurrent weight called once a
step), the parts are one outer-product sum over all their steps, ``G_i = sum_j sum_t b^(j)_t
a^(j)_t^T``, whose norm takes one Gram matrix per side (or ``G_i`` once, where cheaper) instead
of a product per pair of parts. Parts without factors, or a caller that asks for
materialisation, get the ``G_i`` summed row by row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from dpcore.torch.per_example.layer_handlers import (
    NormStrategy,
    OuterFactors,
    ParameterTerm,
    materialized_term,
    outer_product_term,
)

__all__ = ["combined_term", "inner_products"]


def inner_products(first: OuterFactors, second: OuterFactors) -> torch.Tensor:
    """``(batch,)`` ``<G_i, G'_i>`` (Frobenius) of two factorised per-example gradients of one
    parameter (the same ``d_out`` and ``d_in``)."""
    activations = first.activations @ second.activations.transpose(1, 2)  # (batch, T, T')
    if first.indices is not None and second.indices is not None:
        same = first.indices.unsqueeze(2) == second.indices.unsqueeze(1)
        backprops = same.to(activations.dtype)
    elif first.indices is not None:  # b_t = e_{x_t}: b_t . b'_s = b'_s[x_t]
        assert second.backprops is not None
        index = first.indices.long().unsqueeze(1).expand(-1, second.steps, -1)
        backprops = torch.gather(second.backprops, 2, index).transpose(1, 2)
    elif second.indices is not None:
        assert first.backprops is not None
        index = second.indices.long().unsqueeze(1).expand(-1, first.steps, -1)
        backprops = torch.gather(first.backprops, 2, index)
    else:
        assert first.backprops is not None and second.backprops is not None
        backprops = first.backprops @ second.backprops.transpose(1, 2)
    return (activations * backprops.to(activations.dtype)).sum((1, 2))


def _factorised(terms: Sequence[ParameterTerm], shape: torch.Size) -> list[OuterFactors] | None:
    """The parts' factors when every part has them, in one ``(d_out, d_in)`` layout that is the
    parameter's; else ``None``."""
    factors = [term.factors for term in terms]
    if not all(f is not None for f in factors):
        return None
    listed = [f for f in factors if f is not None]
    layouts = {(f.d_out, f.d_in) for f in listed}
    if len(layouts) != 1:
        return None
    d_out, d_in = layouts.pop()
    return listed if d_out * d_in == shape.numel() else None


def combined_term(
    name: str, terms: Sequence[ParameterTerm], shape: torch.Size, *, strategy: NormStrategy
) -> ParameterTerm:
    """One term for the summed per-example gradient of a parameter with several ``terms``.

    Args:
        name: the parameter's name.
        terms: its parts (at least two), each over the same examples.
        shape: the parameter's shape.
        strategy: ``"materialize"`` sums the parts' rows; ``"ghost"`` uses inner products where
            every part is factorised; ``"auto"`` takes the cheaper of the two.
    """
    factors = _factorised(terms, shape)
    if factors is not None and all(f.indices is None for f in factors):
        # every part dense: one outer-product sum over all the parts' steps
        dtype = torch.promote_types(factors[0].activations.dtype, terms[0].squared_norms.dtype)
        activations = torch.cat([f.activations.to(dtype) for f in factors], dim=1)
        backprops = torch.cat([f.backprops.to(dtype) for f in factors], dim=1)  # type: ignore[union-attr]
        return outer_product_term(
            name, activations.unsqueeze(1), backprops.unsqueeze(1), shape=shape, strategy=strategy
        )
    if factors is not None and strategy != "materialize":
        d_out, d_in = factors[0].d_out, factors[0].d_in
        pairs = list(itertools.combinations(factors, 2))
        inner_cost = sum(x.steps * y.steps for x, y in pairs) * (d_in + d_out)
        rows_cost = sum(f.steps for f in factors) * d_in * d_out
        if strategy == "ghost" or inner_cost <= rows_cost:
            squared = terms[0].squared_norms
            for term in terms[1:]:
                squared = squared + term.squared_norms.to(squared.dtype)
            for x, y in pairs:
                squared = squared + 2 * inner_products(x, y).to(squared.dtype)
            parts = list(terms)

            def weighted_sum(factors: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
                total = parts[0].weighted_sum(factors, keep)
                for part in parts[1:]:
                    total = total + part.weighted_sum(factors, keep)
                return total

            def rows() -> torch.Tensor:
                return sum((part.rows() for part in parts[1:]), parts[0].rows())

            # rounding can take a sum of nearly opposite parts below zero; NaN stays NaN
            return ParameterTerm(name, squared.clamp_min(0.0), weighted_sum, rows)
    total = sum((term.rows() for term in terms[1:]), terms[0].rows())
    return materialized_term(name, total, shape)
