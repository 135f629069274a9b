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

Small noise: a cell's loss above 700 (where ``e^{-loss}`` leaves floating point) is lowered to
700, which only weakens the pair, so each epoch contributes at most about 700 to epsilon. For
sigma below about 0.03 the true per-epoch loss is larger (about ``1 / (2 sigma^2)``) and the bound
is loose but still valid; it never fails or turns infinite. Cell masses are computed in log
space, so the losses stay finite where the masses themselves underflow.
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
#: Smaller noise multipliers are bounded as this one: the pair at a larger sigma is the pair at a
#: smaller one plus independent Gaussian noise (a post-processing), so its lower bound holds for
#: every smaller sigma. Each epoch already reaches the loss cap (about 700) below sigma ~ 0.03.
_MIN_NOISE_MULTIPLIER = 1e-6
#: Above this noise multiplier the bound is the trivial epsilon = 0 (always valid); the true
#: epsilon is then below 1e-90 for any step count, and sigma^2 would leave floating point.
_MAX_NOISE_MULTIPLIER = 1e100
#: Range of ``grid_spacing``: finer grids need more than 10^7 points per epoch.
_MIN_GRID_SPACING, _MAX_GRID_SPACING = 1e-4, 1.0
#: Largest support of the composed grid (sum over epochs of each epoch's grid points); beyond
#: it the grid is coarsened, so that the FFT stays a few seconds (at the loss cap every epoch
#: spans 700 / grid_spacing points).
_MAX_COMPOSED_SPAN = 2**24
#: Largest loss a cell keeps (:func:`dpcore.pld.loss_pmf.garble_atoms` caps losses at 700 too,
#: where e^{-loss} still exists in floating point); larger losses are lowered to it.
_LOSS_CAP = 700.0


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


def _log_sf_max(
    caps: np.ndarray, *, mean: float, sigma: float, steps: int, weight: float
) -> np.ndarray:
    """log P[max_t x_t > c] for the mixture of :func:`_log_cdf_max`, accurate where it is tiny.

    ``1 - A^(s-1) B = (1 - A^(s-1)) + A^(s-1) (1 - B)`` with ``A = Phi(c/s)`` and ``B`` the
    last factor, each term from survival functions in log space, so that no term rounds to 0
    while it is representable as a logarithm (for small sigma it is e^{-1/sigma^2} and less).
    """
    z, z_shift = caps / sigma, (caps - mean) / sigma
    rest = 1.0 - steps * weight
    log_rest = math.log(rest) if rest > 0 else -math.inf
    log_abar = special.log_ndtr(-z)  # log(1 - A)
    head = np.full_like(z, -np.inf)  # log(1 - A^(s-1)): no other step when s = 1
    if steps > 1:
        # -expm1((s-1) log1p(-(1 - A))), or (s-1)(1 - A) once 1 - A underflows.
        abar = np.exp(log_abar)
        with np.errstate(divide="ignore"):
            direct = np.log(-np.expm1((steps - 1) * np.log1p(-abar)))
        head = np.where(abar > 1e-300, direct, math.log(steps - 1) + log_abar)
    log_bbar = np.logaddexp(
        log_rest + log_abar, math.log(steps * weight) + special.log_ndtr(-z_shift)
    )
    tail = (steps - 1) * special.log_ndtr(z) + log_bbar
    return np.asarray(np.logaddexp(head, tail))


def _log_differences(log_values: np.ndarray, *, increasing: bool) -> np.ndarray:
    """log|v_{i+1} - v_i| from log v, as ``log hi + log(1 - e^{log lo - log hi})``.

    The exponent is <= 0, so nothing overflows; a difference that rounds to <= 0 (or two zero
    values) gets ``-inf``.
    """
    high, low = (
        (log_values[1:], log_values[:-1]) if increasing else (log_values[:-1], log_values[1:])
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        out = high + np.log(-np.expm1(low - high))
    return np.where(np.isnan(out), -np.inf, out)


def _log_cell_masses(log_cdf: np.ndarray, log_sf: np.ndarray) -> np.ndarray:
    """log masses of the bottom tail, the cells between consecutive caps, and the top tail.

    A cell's mass is ``F_{i+1} - F_i`` (from the CDF where it is at most 1/2) or
    ``S_i - S_{i+1}`` (from the survival function elsewhere), so that it never is a difference
    of two numbers close to 1. It is kept in log space because for small sigma the two
    hypotheses put their mass ~1/sigma standard deviations apart and every cell's mass
    underflows under one of them. A cell whose mass rounds to <= 0 gets ``-inf``: dropping mass
    only weakens a lower bound.
    """
    from_cdf = _log_differences(log_cdf, increasing=True)
    from_sf = _log_differences(log_sf, increasing=False)
    cells = np.where(log_cdf[1:] <= -math.log(2.0), from_cdf, from_sf)
    return np.concatenate([log_cdf[:1], cells, log_sf[-1:]])


def epoch_pmf(
    *, noise_multiplier: float, steps: int, weight: float, grid_spacing: float
) -> LossPmf:
    """Optimistic grid PLD of the statistic M = max_t x_t over one epoch of ``steps`` steps.

    ``weight`` is B/N, the probability that the differing record is in a given batch. Cell
    losses are computed from log masses, so they stay finite where the masses underflow (small
    sigma); losses above ``_LOSS_CAP`` (where ``e^{-loss}`` leaves floating point) are lowered
    to it, and atoms whose lowered Q-mass still underflows are dropped -- both weaken the pair
    (adding Q-mass, removing an atom), so the grid PLD stays dominated by the true pair. For
    tiny sigma each epoch therefore contributes about ``_LOSS_CAP`` to epsilon: a valid, if
    loose, lower bound.
    """
    sigma = noise_multiplier
    log_tail_each = _LOG_TAIL - math.log(steps)
    low = sigma * float(special.ndtri(math.exp(_LOG_TAIL / steps)))
    high = _MEAN_D + sigma * float(-special.ndtri(math.exp(log_tail_each)))
    # Cells about one grid step of loss wide: the loss grows like (2 - 1) c / sigma^2 in c.
    gap = max(grid_spacing * sigma**2, (high - low) / _MAX_CELLS)
    caps = np.arange(low, high + gap, gap)
    log_p, log_q = (
        _log_cell_masses(
            _log_cdf_max(caps, mean=mean, sigma=sigma, steps=steps, weight=weight),
            _log_sf_max(caps, mean=mean, sigma=sigma, steps=steps, weight=weight),
        )
        for mean in (_MEAN_D, _MEAN_D_PRIME)
    )
    # True Q-masses are all positive: a cell whose Q-mass rounded to 0 is dropped, not +inf.
    keep = np.isfinite(log_p) & np.isfinite(log_q)
    log_p, log_q = log_p[keep], log_q[keep]
    if log_p.size == 0:  # every cell's mass rounded to 0: nothing certified beyond zero
        return LossPmf(grid_spacing, 0, np.zeros(1), 0.0)
    cap = math.floor(_LOSS_CAP / grid_spacing)
    losses = np.minimum(log_p - log_q, cap * grid_spacing)
    p = np.exp(log_p)
    q = np.exp(log_p - losses)  # >= the true Q-mass where the loss was lowered to the cap
    usable = (p > 0) & (q > 0)
    if not usable.any():
        return LossPmf(grid_spacing, 0, np.zeros(1), 0.0)
    return garble_atoms(
        p_masses=np.where(usable, p, 0.0),
        q_masses=np.where(usable, q, 0.0),
        grid_spacing=grid_spacing,
        min_index=math.floor(float(losses[usable].min()) / grid_spacing) - 1,
        max_index=min(cap, math.ceil(float(losses[usable].max()) / grid_spacing) + 1),
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
    Every epoch adds at most about 700 (the largest loss kept in floating point) to epsilon,
    so for tiny sigma the bound is valid but loose; sigma below 1e-6 is bounded as 1e-6 (adding
    noise is a post-processing, so that bound holds for every smaller sigma), and above 1e100
    the bound is 0. Where the composed grid would exceed 2^24 points (many epochs at large
    losses) ``grid_spacing`` is coarsened to fit: a coarser grid only loosens the bound.

    Args:
        noise_multiplier: sigma > 0.
        dataset_size: N >= 1.
        batch_size: B in [1, N].
        steps: T >= 0.
        grid_spacing: loss grid h in [1e-4, 1] (each epoch's losses are rounded down by < h).

    Returns:
        The composed bound; query it with :meth:`ShuffledLowerBound.epsilon` or ``delta``.

    Raises:
        InvalidParameterError: a parameter outside the ranges above, or more than 10^9 epochs.

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
    if not _MIN_GRID_SPACING <= h <= _MAX_GRID_SPACING:
        raise InvalidParameterError(
            "grid_spacing", f"in [{_MIN_GRID_SPACING:g}, {_MAX_GRID_SPACING:g}]", grid_spacing
        )
    per_epoch = n // b
    epochs, rest = divmod(total, per_epoch)
    if sigma > _MAX_NOISE_MULTIPLIER:  # the trivial bound, epsilon = 0 (see the constant)
        return ShuffledLowerBound(sigma, n, b, total, compose_many([]))
    computed = max(sigma, _MIN_NOISE_MULTIPLIER)

    def parts(spacing: float) -> list[tuple[LossPmf, int]]:
        return [
            (epoch_pmf(noise_multiplier=computed, steps=s, weight=b / n, grid_spacing=spacing), k)
            for s, k in ((per_epoch, epochs), (rest, 1))
            if s and k
        ]

    pieces = parts(h)
    span = sum(count * (pmf.pmf.size - 1) for pmf, count in pieces)
    if span > _MAX_COMPOSED_SPAN:  # a coarser grid: still a valid lower bound, only looser
        pieces = parts(h * math.ceil(span / _MAX_COMPOSED_SPAN))
    return ShuffledLowerBound(sigma, n, b, total, compose_many(pieces))
