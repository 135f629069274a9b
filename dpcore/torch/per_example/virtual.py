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

__all__ = ["LotSum", "clipped_sum_in_parts", "combine"]


class LotSum:
    """The running clipped sum of one logical lot, its micro-batches folded in as they come.

    Only the per-parameter sums and three numbers per example (norm, clip factor, loss) are kept,
    so memory does not grow with the lot beyond those; outputs are kept (for accuracy) only when
    ``keep_outputs`` and every micro-batch's outputs are a tensor.
    """

    def __init__(
        self,
        parameters: list[torch.nn.Parameter],
        *,
        keep_outputs: bool = True,
        size: int | None = None,
    ) -> None:
        self.dtype = parameters[0].dtype
        self.summed = [torch.zeros_like(p) for p in parameters]
        self.rows: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] = ([], [], [])
        self.outputs: list[torch.Tensor] | None = [] if keep_outputs else None
        # With the lot's size known, its rows go into one preallocated block: thousands of small
        # long-lived tensors fragment the heap (RSS grew 797 -> 1,708 MiB from a 524,288- to a
        # 1,048,576-example lot without it).
        self._filled = 0
        self._block = None if size is None else torch.empty(3, size, dtype=self.dtype)

    def add(self, part: ClippedBatch) -> None:
        """Fold one micro-batch's result in."""
        for total, summed in zip(self.summed, part.summed, strict=True):
            total.add_(summed.detach().to(total.dtype))
        rows = (part.norms, part.clip_factors, part.losses)
        if self._block is not None:
            count = int(part.norms.shape[0])
            for k, row in enumerate(rows):
                self._block[k, self._filled : self._filled + count] = row.detach().cpu()
            self._filled += count
        else:
            for kept, row in zip(self.rows, rows, strict=True):
                kept.append(row.detach().to(self.dtype).cpu())
        if self.outputs is not None and part.outputs is not None:
            if isinstance(part.outputs, torch.Tensor):
                self.outputs.append(part.outputs.detach())
            else:
                self.outputs = None

    def result(self) -> ClippedBatch:
        """The lot's :class:`ClippedBatch`."""
        if self._block is not None:
            norms, factors, losses = self._block[:, : self._filled].clone()
        else:
            norms, factors, losses = (
                torch.cat(kept) if kept else torch.zeros(0, dtype=self.dtype) for kept in self.rows
            )
        return ClippedBatch(
            summed=self.summed,
            norms=norms,
            clip_factors=factors,
            losses=losses,
            outputs=torch.cat(self.outputs) if self.outputs else None,
        )


def combine(parts: Iterable[ClippedBatch], parameters: list[torch.nn.Parameter]) -> ClippedBatch:
    """One lot's :class:`ClippedBatch` from its micro-batches' (sums added, rows concatenated)."""
    total = LotSum(parameters)
    for part in parts:
        total.add(part)
    return total.result()


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
