"""A certified *lower* bound on the privacy of DP-SGD with shuffled fixed-size batches.

Most DP-SGD code draws fixed-size batches from a fresh shuffle each epoch and reports the epsilon
of Poisson subsampling at rate B/N, which it did not run. This module computes what shuffling
costs at least: an epsilon that some pair of neighbouring datasets provably reaches, so every
valid guarantee for the shuffled run is at least this large.

The pair (Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "How Private are DP-SGD
Implementations?", ICML 2024, arXiv 2403.17673; their "cube" lower bound): a one-parameter
linear model whose per-example gradients are constants in [-1, 1] (clipping norm 1), so the
noisy gradient sums are a post-processing of the iterates and vice versa. Every record but one
has gradient -1; the differing record has gradient +1 in D and is replaced by one with gradient
0 in D' (the zero-out neighbour, under which Poisson subsampling has exactly its add/remove
analysis). After adding B per batch, an epoch of s steps outputs ``N(0, sigma^2 I_s)`` except in
the batch that holds the differing record, which has mean 2 (D) or 1 (D'); that batch is uniform
among the s steps, and with N not a multiple of B the record sits in none of them with
probability ``r = 1 - s B / N`` (it was among the dropped remainder). So one epoch is the pair

    P = r N(0, sigma^2 I) + (B/N) sum_t N(2 e_t, sigma^2 I),
    Q = r N(0, sigma^2 I) + (B/N) sum_t N(e_t, sigma^2 I),

and epochs (independent reshuffles) compose. Any post-processing of this pair lower-bounds its
hockey-stick divergence; following the same paper we keep only ``M = max_t x_t``, cut into
cells (the "cube" sets ``{max_t x_t <= c}``), and discretise the resulting atoms optimistically
(:func:`dpcore.pld.loss_pmf.garble_atoms`), so the composed grid PLD is dominated by the true
pair and its epsilon at delta is a lower bound on the true one. The FFT error mass is counted
against us (:meth:`LossPmf.epsilon` at ``delta + error_mass``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.pld.loss_pmf import LossPmf, compose_many, garble_atoms
from dpcore.validation import check_count, check_delta, check_epsilon, check_positive

__all__ = ["ShuffledLowerBound", "shuffled_lower_bound"]

#: log of the P-mass left in each of the two tail cells of M (it is kept, as a cell of its own).
_LOG_TAIL = -40.0
#: Most cells of M per epoch; a coarser cut is still a post-processing, hence still valid.
_MAX_CELLS = 200_000
#: Means of the differing batch under D and D' (gradients +1 vs 0 against a background of -1).
_MEAN_D, _MEAN_D_PRIME = 2.0, 1.0


def _log_cdf_max(
    caps: np.ndarray, *, mean: float, sigma: float, steps: int, weight: float
) -> np.ndarray:
    """log P[max_t x_t <= c] under ``r N(0, s^2 I) + weight sum_t N(mean e_t, s^2 I)``.

    With ``r = 1 - steps * weight``: P[M <= c] = Phi(c/s)^(steps-1) (r Phi(c/s) +
    steps weight Phi((c - mean)/s)). The last factor is computed from survival functions where
    it is close to 1, so that differences of nearby values keep their relative accuracy.
    """
    z, z_shift = caps / sigma, (caps - mean) / sigma
    rest = 1.0 - steps * weight
    log_rest = math.log(rest) if rest > 0 else -math.inf
    direct = np.logaddexp(
        log_rest + special.log_ndtr(z), math.log(steps * weight) + special.log_ndtr(z_shift)
    )
    with np.errstate(divide="ignore"):  # where the survival form is not used it may be -inf
        survival = np.log1p(-(rest * special.ndtr(-z) + steps * weight * special.ndtr(-z_shift)))
    last = np.where(z_shift > 0, survival, direct)
    return np.asarray((steps - 1) * special.log_ndtr(z) + last)


def _cell_masses(log_cdf: np.ndarray) -> np.ndarray:
    """Masses of consecutive cells from log CDF values: F_i (e^{log F_{i+1} - log F_i} - 1)."""
    return np.asarray(np.exp(log_cdf[:-1]) * np.expm1(np.diff(log_cdf)))


def epoch_pmf(
    *, noise_multiplier: float, steps: int, weight: float, grid_spacing: float
) -> LossPmf:
    """Optimistic grid PLD of the statistic M = max_t x_t over one epoch of ``steps`` steps.

    ``weight`` is B/N, the probability that the differing record is in a given batch.
    """
    sigma = noise_multiplier
    log_tail_each = _LOG_TAIL - math.log(steps)
    low = sigma * float(special.ndtri(math.exp(_LOG_TAIL / steps)))
    high = _MEAN_D + sigma * float(-special.ndtri(math.exp(log_tail_each)))
    # Cells about one grid step of loss wide: the loss grows like (2 - 1) c / sigma^2 in c.
    gap = max(grid_spacing * sigma**2, (high - low) / _MAX_CELLS)
    caps = np.arange(low, high + gap, gap)
    masses = []
    for mean in (_MEAN_D, _MEAN_D_PRIME):
        log_cdf = _log_cdf_max(caps, mean=mean, sigma=sigma, steps=steps, weight=weight)
        cells = _cell_masses(log_cdf)
        bottom, top = math.exp(log_cdf[0]), -math.expm1(log_cdf[-1])
        masses.append(np.concatenate([[bottom], np.maximum(cells, 0.0), [top]]))
    p, q = masses
    keep = (p > 0) & (q > 0)
    losses = np.log(p[keep]) - np.log(q[keep])
    return garble_atoms(
        p_masses=p,
        q_masses=q,
        grid_spacing=grid_spacing,
        min_index=math.floor(float(losses.min()) / grid_spacing) - 1,
        max_index=math.ceil(float(losses.max()) / grid_spacing) + 1,
        finite_losses=True,
    )


@dataclasses.dataclass(frozen=True)
class ShuffledLowerBound:
    """The composed optimistic PLD of shuffled DP-SGD on the pair above, and its queries.

    Attributes:
        noise_multiplier, dataset_size, batch_size, steps: the run (sigma, N, B, T).
        pmf: the composed grid PLD (dominated by the true pair of this dataset).
    """

    noise_multiplier: float
    dataset_size: int
    batch_size: int
    steps: int
    pmf: LossPmf

    def epsilon(self, delta: float) -> float:
        """A lower bound on every valid epsilon of the run at ``delta`` (0 <= delta < 1)."""
        delta = 0.0 if delta == 0 else check_delta("delta", delta)
        return self.pmf.epsilon(min(1.0, delta + self.pmf.error_mass))

    def delta(self, epsilon: float) -> float:
        """A lower bound on the run's delta at ``epsilon``."""
        epsilon = check_epsilon("epsilon", epsilon)
        return max(0.0, self.pmf.delta(epsilon) - self.pmf.error_mass)


def shuffled_lower_bound(
    *,
    noise_multiplier: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    grid_spacing: float = 1e-3,
) -> ShuffledLowerBound:
    """Certified lower bound on the privacy of ``steps`` DP-SGD steps with shuffled batches.

    Epochs are ``N // B`` steps, each from a fresh shuffle with the remainder dropped (as
    :class:`dpcore.torch.samplers.ShuffledBatchSampler` draws them); a last partial epoch
    counts with the steps it ran. ``noise_multiplier`` is sigma, the noise standard deviation
    over the clipping norm. See the module docstring for the pair and why the bound holds.

    Example:
        >>> bound = shuffled_lower_bound(
        ...     noise_multiplier=1.0, dataset_size=1000, batch_size=100, steps=10)
        >>> bound.epsilon(1e-5) > 0
        True
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n = check_count("dataset_size", dataset_size, minimum=1)
    b = check_count("batch_size", batch_size, minimum=1)
    if b > n:
        raise InvalidParameterError("batch_size", f"<= dataset_size = {n}", b)
    total = check_count("steps", steps)
    h = check_positive("grid_spacing", grid_spacing)
    per_epoch = n // b
    epochs, rest = divmod(total, per_epoch)
    parts = [
        (epoch_pmf(noise_multiplier=sigma, steps=s, weight=b / n, grid_spacing=h), count)
        for s, count in ((per_epoch, epochs), (rest, 1))
        if s and count
    ]
    return ShuffledLowerBound(sigma, n, b, total, compose_many(parts))
