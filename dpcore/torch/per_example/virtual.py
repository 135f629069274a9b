"""Virtual lots: one logical lot clipped in physical micro-batches, summed before the noise.

Per-example clipping is separable over examples, so a lot's clipped sum is the sum of its
micro-batches' clipped sums: ``sum_i c_i g_i = sum_b sum_{i in b} c_i g_i``. Memory then follows
the physical batch size, not the lot; the noise is added once per logical lot by the optimizer and
the ledger records one event per logical lot (the lot, not the micro-batch, is what the Poisson
analysis samples). The JL engine draws its directions once per logical lot
(:meth:`~dpcore.torch.per_example.base.PerExampleEngine.one_lot`), so a lot's result does not
depend on how it is split.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from dpcore.torch.batches import Batch, batch_size, take
from dpcore.torch.per_example.base import ClippedBatch, LossFunction, PerExampleEngine
from dpcore.validation import check_count

__all__ = ["clipped_sum_in_parts", "combine"]


def combine(parts: Iterable[ClippedBatch], parameters: list[torch.nn.Parameter]) -> ClippedBatch:
    """One lot's :class:`ClippedBatch` from its micro-batches' (sums added, rows concatenated).

    Outputs are kept only when every micro-batch's outputs are a tensor (for accuracy).
    """
    summed = [torch.zeros_like(p) for p in parameters]
    norms, factors, losses, outputs = [], [], [], []
    tensors_only = True
    for part in parts:
        summed = [total + s.to(total.dtype) for total, s in zip(summed, part.summed, strict=True)]
        norms.append(part.norms)
        factors.append(part.clip_factors)
        losses.append(part.losses)
        if part.outputs is not None:
            tensors_only = tensors_only and isinstance(part.outputs, torch.Tensor)
            outputs.append(part.outputs)
    dtype = parameters[0].dtype
    empty = torch.zeros(0, dtype=dtype)
    return ClippedBatch(
        summed=summed,
        norms=torch.cat([n.to(dtype).cpu() for n in norms]) if norms else empty,
        clip_factors=torch.cat([f.to(dtype).cpu() for f in factors]) if factors else empty,
        losses=torch.cat([v.to(dtype).cpu() for v in losses]) if losses else empty,
        outputs=torch.cat(outputs) if outputs and tensors_only else None,
    )


def clipped_sum_in_parts(
    engine: PerExampleEngine,
    inputs: Batch,
    targets: Batch,
    loss_fn: LossFunction,
    *,
    max_physical_batch_size: int,
) -> ClippedBatch:
    """``engine.clipped_sum`` of a lot, computed ``max_physical_batch_size`` examples at a time.

    Equal to the one-batch result up to floating-point summation order (the JL engine's
    directions are drawn once for the lot).

    Raises:
        InvalidParameterError: ``max_physical_batch_size`` is not an integer >= 1.
    """
    physical = check_count("max_physical_batch_size", max_physical_batch_size, minimum=1)
    size = batch_size(inputs)
    with engine.one_lot():
        if size <= physical:
            return engine.clipped_sum(inputs, targets, loss_fn)
        parts = []
        for start in range(0, size, physical):
            part = slice(start, min(start + physical, size))
            parts.append(engine.clipped_sum(take(inputs, part), take(targets, part), loss_fn))
    return combine(parts, engine.parameters)
