"""What the white-box training audits share: the gradient canary, installed as an audit hook on a
per-example engine (:meth:`dpcore.torch.per_example.base.PerExampleEngine.add_audit_hook`), and
the lot samplers an implementation under audit may use.

A gradient canary is an extra example whose per-example gradient is the Dirac vector
``CANARY_NORM * C * e_j`` on a weight coordinate j that no real example touches (Nasr et al. 2023,
arXiv 2302.07956, "white-box, gradient canary"). The hook adds the canaries chosen for the
current lot (:attr:`GradientCanaries.coordinates`) to the engine's clipped sum, each scaled by
the engine's clipping rule ``min(1, C / ||g||)`` like a real example (or not at all, for the
no-clipping mutant), and records the real lot's clipped sum of that parameter
(:attr:`GradientCanaries.known_sum`), which the white-box auditor knows.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dpcore.torch.per_example.base import ClippedBatch, PerExampleEngine, clip_factors
from dpcore.torch.samplers import PoissonMismatchWarning, PoissonSampler, ShuffledBatchSampler

#: The canary's gradient norm, in units of C (> 1, so that clipping matters).
CANARY_NORM = 4.0

#: ``estimate(engine, coordinate, norm) -> the norm the engine's clipping sees`` (exact: ``norm``).
NormEstimate = Callable[[PerExampleEngine, int, float], float]


class GradientCanaries:
    """Audit hook adding Dirac gradient canaries to every clipped sum of an engine.

    Args:
        engine: the engine to hook (:meth:`install` is called here).
        norm: the canaries' gradient norm (``CANARY_NORM * C`` in the audits).
        parameter_index: which trainable parameter the canaries live in.
        clip: clip the canaries with the engine's rule (off: the no-clipping mutant).
        estimate: the norm the engine's clipping sees for a canary (JL engines estimate it
            from their projections); default: the true norm.
    """

    def __init__(
        self,
        engine: PerExampleEngine,
        *,
        norm: float,
        parameter_index: int = 0,
        clip: bool = True,
        estimate: NormEstimate | None = None,
    ) -> None:
        self.norm = norm
        self.parameter_index = parameter_index
        self.clip = clip
        self.estimate = estimate
        #: flat coordinates of the canaries in the next lot (set by the auditor before each lot)
        self.coordinates: list[int] = []
        #: the real lot's clipped sum of the hooked parameter, flattened (known to the auditor)
        self.known_sum = np.zeros(0)
        #: what each canary of the last lot added to its coordinate
        self.contributions = np.zeros(0)
        engine.add_audit_hook(self)

    def __call__(self, engine: PerExampleEngine, batch: ClippedBatch) -> ClippedBatch:
        summed = [s.detach().clone() for s in batch.summed]
        target = summed[self.parameter_index]
        self.known_sum = target.reshape(-1).cpu().numpy().astype(np.float64, copy=True)
        self.contributions = np.zeros(len(self.coordinates))
        if not self.coordinates:
            return dataclasses.replace(batch, summed=summed)
        dtype = target.dtype
        seen = [
            self.estimate(engine, j, self.norm) if self.estimate else self.norm
            for j in self.coordinates
        ]
        norms = torch.tensor(seen, dtype=dtype)
        factors = (
            clip_factors(norms, max_grad_norm=engine.max_grad_norm)
            if self.clip
            else torch.ones_like(norms)
        )
        added = factors * self.norm
        target.reshape(-1)[torch.tensor(self.coordinates)] += added
        self.contributions = added.numpy().astype(np.float64)
        return ClippedBatch(
            summed=summed,
            norms=torch.cat([batch.norms.to(dtype), norms]),
            clip_factors=torch.cat([batch.clip_factors.to(dtype), factors]),
            losses=torch.cat([batch.losses.to(dtype), torch.zeros_like(norms)]),
            outputs=batch.outputs,
        )


#: ``sampler(dataset_size, sampling_probability, seed)``: the lots an implementation trains on
SamplerFactory = Callable[[int, float, int], Any]


def poisson_sampler(dataset_size: int, sampling_probability: float, seed: int) -> PoissonSampler:
    """dpcore's Poisson sampler: what the accountants assume."""
    return PoissonSampler(dataset_size, sampling_probability=sampling_probability, seed=seed)


def shuffled_sampler(
    dataset_size: int, sampling_probability: float, seed: int
) -> ShuffledBatchSampler:
    """Fixed-size batches of round(q N) from a shuffle per epoch (its warning silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoissonMismatchWarning)
        return ShuffledBatchSampler(
            dataset_size, batch_size=round(sampling_probability * dataset_size), seed=seed
        )
