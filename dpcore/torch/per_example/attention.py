"""``F.multi_head_attention_forward`` as the operations it is made of, batch-first.

``nn.MultiheadAttention`` (and so ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``)
does all its work in one call of ``F.multi_head_attention_forward``, which takes the projection
weights and the examples together; the fast path's data flow (:mod:`~dpcore.torch.per_example.
dataflow`) cannot look inside one call. :func:`multi_head_attention` computes the same function
from operations the fast path has exact per-example rules for: the input projections and the
output projection as ``F.linear`` on batch-first example data (the weights as they are, or the
slices of ``in_proj_weight`` a cross-attention uses), ``bias_k``/``bias_v`` expanded over the lot
and concatenated, and the parameter-free attention between them (``scaled_dot_product_attention``
or, when the weights are returned, softmax of the scaled scores). Masks are turned into additive
float masks and merged exactly as torch does (``F._canonical_mask``); the result is returned in
torch's layout (sequence first) so that the calling module is unchanged.

:func:`decomposable` says which calls it takes: batched (3-D) inputs without ``static_k`` /
``static_v``; any other call runs as torch's own operation, and the fast path then refuses its
parameters by name.

:func:`scaled_dot_product_attention` is ``F.scaled_dot_product_attention`` as the matrix products
and softmax it is defined by, for the calls whose ``attn_mask`` is computed from parameters (a
relative position bias passed as the additive mask, transformers' SDPA path for T5): the mask
then meets the examples in an addition, which has an exact per-example rule.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch.nn import functional

__all__ = ["decomposable", "multi_head_attention", "scaled_dot_product_attention"]

_SIGNATURE = inspect.signature(functional.multi_head_attention_forward)


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def decomposable(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether :func:`multi_head_attention` computes this call of
    ``F.multi_head_attention_forward``: batched ``(L, N, E)`` inputs, no static keys or values."""
    try:
        arguments = _arguments(args, kwargs)
    except TypeError:
        return False
    return _decomposable(arguments)


def _decomposable(arguments: dict[str, Any]) -> bool:
    query = arguments["query"]
    return (
        isinstance(query, torch.Tensor)
        and query.dim() == 3
        and arguments["static_k"] is None
        and arguments["static_v"] is None
    )


def _split(tensor: torch.Tensor | None, sizes: list[int]) -> list[torch.Tensor | None]:
    if tensor is None:
        return [None] * len(sizes)
    return list(torch.split(tensor, sizes))


def _projections(
    arguments: dict[str, Any],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v`` of shape ``(N, length, E)``: one ``F.linear`` per distinct input."""
    bias = arguments["in_proj_bias"]
    if arguments["use_separate_proj_weight"]:
        b_q, b_k, b_v = _split(bias, [width] * 3)
        return (
            functional.linear(query, arguments["q_proj_weight"], b_q),
            functional.linear(key, arguments["k_proj_weight"], b_k),
            functional.linear(value, arguments["v_proj_weight"], b_v),
        )
    weight = arguments["in_proj_weight"]
    if key is query and value is query:  # self-attention: the packed weight, as it is
        packed = functional.linear(query, weight, bias)
        q, k, v = packed.reshape(*packed.shape[:-1], 3, width).unbind(-2)
        return q, k, v
    if value is key:
        w_q, w_kv = torch.split(weight, [width, 2 * width])
        b_q, b_kv = _split(bias, [width, 2 * width])
        packed = functional.linear(key, w_kv, b_kv)
        k, v = packed.reshape(*packed.shape[:-1], 2, width).unbind(-2)
        return functional.linear(query, w_q, b_q), k, v
    w_q, w_k, w_v = torch.split(weight, [width] * 3)
    b_q, b_k, b_v = _split(bias, [width] * 3)
    return (
        functional.linear(query, w_q, b_q),
        functional.linear(key, w_k, b_k),
        functional.linear(value, w_v, b_v),
    )


def multi_head_attention(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``F.multi_head_attention_forward(*args, **kwargs)`` from batch-first operations.

    Takes the arguments of ``F.multi_head_attention_forward`` (inputs ``(L, N, E)``) and returns
    what it returns: the attention output ``(L, N, E)`` and, with ``need_weights``, the
    attention weights ``(N, L, S)`` averaged over heads (or ``(N, heads, L, S)``).

    Raises:
        ValueError: a call :func:`decomposable` does not accept.
    """
    arguments = _arguments(args, kwargs)
    if not _decomposable(arguments):
        raise ValueError("multi_head_attention takes batched calls without static keys/values")
    heads, width = int(arguments["num_heads"]), int(arguments["embed_dim_to_check"])
    tgt_len, size = arguments["query"].shape[:2]
    # batch-first views, keeping which inputs are the same tensor (self-attention)
    firsts: dict[int, torch.Tensor] = {}
    for name in ("query", "key", "value"):
        tensor = arguments[name]
        firsts.setdefault(id(tensor), tensor.transpose(0, 1))
    query, key, value = (firsts[id(arguments[n])] for n in ("query", "key", "value"))
    attn_mask, need_weights = arguments["attn_mask"], bool(arguments["need_weights"])
    is_causal = bool(arguments["is_causal"])
    padding = functional._canonical_mask(
        mask=arguments["key_padding_mask"],
        mask_name="key_padding_mask",
        other_type=functional._none_or_dtype(attn_mask),
        other_name="attn_mask",
        target_type=query.dtype,
    )
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
    if is_causal and padding is None and not need_weights:
        attn_mask = None  # scaled_dot_product_attention's own causal mask
    else:
        attn_mask = functional._canonical_mask(
            mask=attn_mask,
            mask_name="attn_mask",
            other_type=None,
            other_name="",
            target_type=query.dtype,
            check_other=False,
        )
        if padding is not None:
            is_causal = False
    head_dim = width // heads
    q, k, v = _projections(arguments, query, key, value, width)
    if attn_mask is not None:  # (1, 1, L, S) or (N, heads, L, S)
        attn_mask = (
            attn_mask.reshape(1, 1, *attn_mask.shape)
            if attn_mask.dim() == 2
            else attn_mask.reshape(size, heads, *attn_mask.shape[1:])
        )
    bias_k, bias_v = arguments["bias_k"], arguments["bias_v"]
    extra = [(bias_k, bias_v)] if bias_k is not None and bias_v is not None else []
    if arguments["add_zero_attn"]:
        extra.append((k.new_zeros(1, 1, width), v.new_zeros(1, 1, width)))
    for extra_k, extra_v in extra:  # one more key position, which no mask hides
        k = torch.cat([k, extra_k.reshape(1, 1, width).expand(size, -1, -1)], dim=1)
        v = torch.cat([v, extra_v.reshape(1, 1, width).expand(size, -1, -1)], dim=1)
        if attn_mask is not None:
            attn_mask = functional.pad(attn_mask, (0, 1))
        if padding is not None:
            padding = functional.pad(padding, (0, 1))
    src_len = k.shape[1]
    q = q.reshape(size, tgt_len, heads, head_dim).transpose(1, 2)
    k = k.reshape(size, src_len, heads, head_dim).transpose(1, 2)
    v = v.reshape(size, src_len, heads, head_dim).transpose(1, 2)
    if padding is not None:
        padding = padding.reshape(size, 1, 1, src_len)
        attn_mask = padding if attn_mask is None else attn_mask + padding
    dropout = float(arguments["dropout_p"]) if arguments["training"] else 0.0
    weights = None
    if need_weights:
        scores = (q * math.sqrt(1.0 / head_dim)) @ k.transpose(-2, -1)
        if attn_mask is not None:
            scores = scores + attn_mask
        weights = functional.softmax(scores, dim=-1)
        if dropout > 0.0:
            weights = functional.dropout(weights, p=dropout)
        attended = weights @ v
        if arguments["average_attn_weights"]:
            weights = weights.mean(dim=1)
    else:
        attended = functional.scaled_dot_product_attention(
            q, k, v, attn_mask, dropout, is_causal and attn_mask is None
        )
    attended = attended.transpose(1, 2).reshape(size, tgt_len, width)
    output = functional.linear(
        attended, arguments["out_proj_weight"], arguments["out_proj_bias"]
    ).transpose(0, 1)
    return output, weights


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` from its definition (torch's documented reference):
    ``softmax(q k^T * scale + mask) v``, a boolean mask filling ``-inf`` where it is False."""
    factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    scores = query @ key.transpose(-2, -1) * factor
    if is_causal:
        allowed = torch.ones(
            query.size(-2), key.size(-2), dtype=torch.bool, device=query.device
        ).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = functional.dropout(weights, dropout_p, training=True)
    return weights @ value
