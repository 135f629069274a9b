"""Seeding torch's global generator when runs share a process (threads of a pool, Dask's
threads): :func:`torch_seeded`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

__all__ = ["GLOBAL_GENERATOR", "torch_seeded"]

#: held while one block seeds torch's global generator and draws from it, or saves and restores
#: its state (the engines' training-mode trials); re-entrant, so a trial may run inside a block
GLOBAL_GENERATOR = threading.RLock()


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Seed torch's global generator for a block that no other thread enters meanwhile.

    A model's initial weights are drawn from the global generator; runs fanned out on the
    threads of one process (a thread pool, Dask's threads) build their models at the same
    moment, and only one at a time may seed and draw, or a run's weights would depend on the
    others. Keep the block short (the model's construction). Runs in separate processes need
    no lock; the block is the same there.

    Example:
        >>> with torch_seeded(3):
        ...     first = torch.rand(2)
        >>> with torch_seeded(3):
        ...     bool(torch.equal(first, torch.rand(2)))
        True
    """
    with GLOBAL_GENERATOR:
        torch.manual_seed(seed)
        yield
