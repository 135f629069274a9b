"""Dominating pairs of one DP-SGD-JL step (Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat 2021).

With r JL directions, an example's norm is estimated as ``M = ||g|| sqrt(X / r)``,
``X ~ chi^2_r`` (Lemma 4.1), and its clipped contribution ``min(1, C/M) g`` has norm
``C min(||g|| / C, sqrt(r / X))``. In units of C and with noise N(0, sigma^2), one step on
neighbouring lots is the pair ``N(0, sigma^2)`` vs the mixture ``E_X N(S(X), sigma^2)`` along g,
with ``S = min(a, sqrt(r / X))``, ``a = ||g|| / C``. Poisson sampling mixes in ``1 - q`` of
``N(0, sigma^2)`` (Thm 4.1 composes the subsampled step T times numerically).

Two monotonicity facts make a certified discretisation possible. For any mixture of
``N(s_k, sigma^2)`` with ``s_k >= 0`` against ``N(0, sigma^2)``, the likelihood ratio is increasing
in the outcome, so the set where a hockey-stick divergence integrand is positive is a half-line,
and the derivative of either divergence with respect to each ``s_k`` is ``w_k phi(t - s_k) >= 0``
(envelope argument). Hence (i) the worst case is ``a -> infinity`` (``S = sqrt(r / X)``), and
(ii) replacing X on each probability bin by the bin's lower end (largest shift) gives a pair that
dominates the true one, and its upper end (smallest shift) a pair the true one dominates. The
first bin, of probability 1e-13, has an unbounded shift: its P-mass is treated as an outcome that
reveals the example (loss +infinity), which adds at most T q 1e-13 to the composed delta.

Each step is discretised on cells of the outcome y (cells chosen so that their losses span about
one grid cell), whose P- and Q-masses are exact mixture distribution functions. The pessimistic
grid splits each cell's masses onto the grid losses bracketing the cell's whole loss range
(connect-the-dots, Doroshenko et al. 2022, Thm 4.3, on a possibly wider bracket); the optimistic
grid merges each cell into one atom and garbles it onto the grid (a cell whose Q-mass
underflows keeps a finite loss, the top of the grid: every true loss is finite).

Assumption, as in the paper's analysis: the differing example's estimate X is independent of
what the output reveals about the other examples' clip factors (they share the directions).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special, stats

from dpcore.pld.loss_pmf import LossPmf, _from_bins, _lowest_index, garble_atoms

__all__ = ["JLStepPair", "jl_shift_mixture", "jl_step_pairs"]

#: Probability of the first bin, whose shift is unbounded (treated as revealing).
_FIRST_BIN = 1e-13
#: Quantile (in standard deviations) beyond which Gaussian tails are left to the tail atoms.
_TAIL_Z = 10.0
#: Mixture mass beyond the last cell: it becomes part of the +inf atom (pessimistic).
_TAIL_MASS = 1e-14
#: Mixture mass beyond which cells may span several grid cells.
_BULK_MASS = 1e-10
#: At most this many one-grid-cell-wide cells (heavy tails, r <= 3, get wider cells sooner).
_MAX_BULK_CELLS = 200_000


def _probability_edges(bins: int) -> np.ndarray:
    """Bin edges in probability: log-spaced in the heavy tail (small X), uniform elsewhere."""
    tail = np.logspace(math.log10(_FIRST_BIN), math.log10(0.05), bins // 2)
    body = np.linspace(0.05, 1.0, bins - bins // 2 + 1)[1:]
    return np.concatenate([[0.0], tail, body])


def jl_shift_mixture(
    *, jl_dimension: int, bins: int = 400, pessimistic: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """Discretised law of the worst-case shift ``S = sqrt(r / X)``, X ~ chi^2_r (units of C).

    Returns ``(shifts, weights, unbounded)``: finite shifts with their probabilities, and the
    probability left at an unbounded shift (the first bin, 1e-13, when pessimistic; 0
    otherwise). The pessimistic law is stochastically larger than the true one, the optimistic
    one smaller; refining the edges (splitting bins) moves both towards the true law.
    """
    r = jl_dimension
    edges = _probability_edges(bins)
    # X quantiles at the edges; upper quantiles via the survival function for accuracy.
    x = np.where(
        edges < 0.5,
        stats.chi2.ppf(edges, r),
        stats.chi2.isf(1.0 - edges, r),
    )
    weights = np.diff(edges)
    with np.errstate(divide="ignore"):
        shifts = np.sqrt(r / x)  # inf at x = 0, 0 at x = inf
    if pessimistic:
        finite = shifts[1:-1]  # bin k takes the shift at its lower X edge (k >= 1)
        return finite, weights[1:], float(weights[0])
    return shifts[1:], weights, 0.0


def _log_ratio(
    y: np.ndarray, q: float, sigma: float, shifts: np.ndarray, log_weights: np.ndarray
) -> np.ndarray:
    """L(y) = log((1 - q) + q sum_k w_k exp((2 s_k y - s_k^2) / (2 sigma^2)))."""
    exponents = (2 * np.outer(y, shifts) - shifts**2) / (2 * sigma**2) + log_weights
    mixture: np.ndarray = special.logsumexp(exponents, axis=1) + math.log(q)
    if q == 1.0:
        return mixture
    result: np.ndarray = np.logaddexp(math.log1p(-q), mixture)
    return result


def _mixture_cdfs(
    y: np.ndarray, q: float, sigma: float, shifts: np.ndarray, weights: np.ndarray, unbounded: float
) -> tuple[np.ndarray, np.ndarray]:
    """(CDF, SF) at y of (1 - q) N(0, s^2) + q (sum_k w_k N(s_k, s^2) + unbounded * delta_inf)."""
    centred = (y[:, None] - shifts[None, :]) / sigma
    cdf = (1 - q) * special.ndtr(y / sigma) + q * (special.ndtr(centred) @ weights)
    sf = (1 - q) * special.ndtr(-y / sigma) + q * (special.ndtr(-centred) @ weights + unbounded)
    return cdf, sf


def _cell_masses(cdf: np.ndarray, sf: np.ndarray) -> np.ndarray:
    """Masses of the cells between consecutive points, differencing the smaller tail."""
    left = cdf[1:] - cdf[:-1]
    right = sf[:-1] - sf[1:]
    masses: np.ndarray = np.maximum(np.where(cdf[1:] < 0.5, left, right), 0.0)
    return masses


def _split_cells(
    p: np.ndarray, q: np.ndarray, low: np.ndarray, high: np.ndarray, h: float, infinity: float
) -> LossPmf:
    """Pessimistic PLD: each cell's (p, q) split onto grid losses ``low * h`` and ``high * h``.

    Valid when every outcome of the cell has a loss in that bracket: the split of a group of
    atoms depends only on their total P- and Q-mass, and each atom's own split dominates it.
    Cells whose bracket reaches above 700 split onto (``low``, +inf); losses below the lowest
    representable grid loss are raised to it (more pessimistic).
    """
    floor_index = _lowest_index(None, h)
    top_index = math.floor(700.0 / h)
    low = np.maximum(low, floor_index)
    high = np.maximum(high, low)
    keep = p > 0
    p, q, low, high = p[keep], q[keep], low[keep], high[keep]
    to_infinity = high > top_index
    low = np.minimum(low, top_index)
    l_low, l_high = low * h, np.minimum(high, top_index) * h
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # P-mass kept at l_low so that its Q-mass is q: p_low = q e^{l_low} (capped at p).
        p_low_if_infinite = np.minimum(p, q * np.exp(l_low))
        denominator = -np.expm1(l_low - l_high)  # 1 - e^{-(l_high - l_low)}
        share_up = (p - q * np.exp(l_low)) / (p * denominator)
    share_up = np.where(high > low, np.clip(np.nan_to_num(share_up), 0.0, 1.0), 0.0)
    mass_low = np.where(to_infinity, p_low_if_infinite, p * (1 - share_up))
    mass_high = np.where(to_infinity, 0.0, p * share_up)
    infinity += float(np.where(to_infinity, p - p_low_if_infinite, 0.0).sum())
    index = np.concatenate([low, np.where(to_infinity, low, high)]).astype(np.int64)
    return _from_bins(index, np.concatenate([mass_low, mass_high]), h, infinity)


class JLStepPair:
    """One direction (remove or add) of a subsampled DP-SGD-JL step, discretised on demand.

    Duck-compatible with :class:`dpcore.pld.pairs.GridPair`: ``pessimistic(h)``,
    ``optimistic(h)``, and the loss range ``low``/``high``.
    """

    def __init__(
        self,
        *,
        q: float,
        sigma: float,
        shifts: np.ndarray,
        weights: np.ndarray,
        unbounded: float,
        add: bool,
    ) -> None:
        self.q, self.sigma, self.add = q, sigma, add
        self.shifts, self.weights, self.unbounded = shifts, weights, unbounded
        self.log_weights = np.log(weights)
        table_y = self._table()
        _, sf = _mixture_cdfs(table_y, q, sigma, shifts, weights, 0.0)
        # Outcomes beyond y_far carry mixture mass < _TAIL_MASS: they go to the +inf atom.
        far_index = int(np.argmax(sf < _TAIL_MASS)) if bool((sf < _TAIL_MASS).any()) else -1
        self.y_far = float(table_y[far_index])
        # Cells are one grid cell wide up to y_bulk (mass above it < _BULK_MASS), coarser after.
        bulk_index = int(np.argmax(sf < _BULK_MASS)) if bool((sf < _BULK_MASS).any()) else -1
        self.y_bulk = min(float(table_y[bulk_index]), self.y_far)
        remove_high = min(700.0, float(self._loss(np.array([self.y_far]))[0]))
        remove_low = float(self._loss(np.array([-_TAIL_Z * sigma]))[0])
        self.low, self.high = (-remove_high, -remove_low) if add else (remove_low, remove_high)

    def _table(self) -> np.ndarray:
        """Outcomes from the left tail of N(0, s^2) to beyond the largest finite shift."""
        sigma = self.sigma
        bulk = np.linspace(-(_TAIL_Z + 2) * sigma, 1.0 + (_TAIL_Z + 2) * sigma, 2001)
        far = float(self.shifts.max()) + (_TAIL_Z + 2) * sigma
        tail = np.geomspace(bulk[-1], max(far, bulk[-1] * 1.01), 4001)[1:]
        return np.concatenate([bulk, tail])

    def _loss(self, y: np.ndarray) -> np.ndarray:
        return _log_ratio(y, self.q, self.sigma, self.shifts, self.log_weights)

    def _outcome_points(self, h: float) -> np.ndarray:
        """Increasing outcomes y partitioning the line into cells (any partition is valid).

        Up to ``y_bulk`` the points sit near the outcomes whose remove-loss is a grid loss, so
        most cells span one grid cell; beyond it (mass < 1e-10) 2000 geometric cells up to
        ``y_far`` keep the cost bounded at the price of wider (still valid) brackets. When the
        budget of :data:`_MAX_BULK_CELLS` ends below ``y_bulk`` (heavy tails, small r), the
        geometric cells start there instead: one cell reaching from that loss to ``y_bulk``
        would hold much more than 1e-10 of mass and be merged into one loss.
        """
        table_y = self._table()
        table_l = np.maximum.accumulate(self._loss(table_y))
        bulk_loss = float(self._loss(np.array([self.y_bulk]))[0])
        remove_low = -self.high if self.add else self.low
        top = min(math.ceil(bulk_loss / h), math.floor(remove_low / h) + _MAX_BULK_CELLS)
        grid = np.arange(math.floor(remove_low / h), top + 1) * h
        points = np.interp(grid, table_l, table_y)
        # The geometric cells start where the one-grid-cell-wide ones stop: at y_bulk, or
        # earlier when the cell budget runs out, so that no single cell spans the gap between.
        start = max(min(self.y_bulk, float(points[-1])), 1e-3)
        tail = np.geomspace(start, max(self.y_far, start * 1.001), 2000)
        return np.unique(np.concatenate([points, tail, [table_y[0], self.y_far]]))

    def _cells(self, h: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """(p, q, loss at the left end, loss at the right end, P-mass at +inf loss) per cell."""
        y = self._outcome_points(h)
        edges = np.concatenate([[-np.inf], y, [np.inf]])
        with np.errstate(invalid="ignore"):
            mix_cdf, mix_sf = _mixture_cdfs(
                edges, self.q, self.sigma, self.shifts, self.weights, 0.0
            )
        mix_cdf[0], mix_sf[0] = 0.0, 1.0 - self.q * self.unbounded
        mix_cdf[-1], mix_sf[-1] = 1.0 - self.q * self.unbounded, 0.0
        base_cdf, base_sf = special.ndtr(edges / self.sigma), special.ndtr(-edges / self.sigma)
        mixture = _cell_masses(mix_cdf, mix_sf)
        base = _cell_masses(base_cdf, base_sf)
        floor = math.log1p(-self.q) if self.q < 1 else -np.inf  # L(y) -> log(1 - q), y -> -inf
        with np.errstate(over="ignore"):
            losses = np.concatenate([[floor], self._loss(y), [np.inf]])
        if self.add:  # P = N(0, s^2), Q = mixture, loss -L_remove (decreasing in y)
            return base, mixture, -losses[1:], -losses[:-1], 0.0
        return mixture, base, losses[:-1], losses[1:], self.q * self.unbounded

    def pessimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominating this direction (certified upper bounds on delta)."""
        h = grid_spacing
        p, q, left, right, infinity = self._cells(h)
        left = np.nan_to_num(left, nan=-1e6, neginf=-1e6, posinf=1e6)
        right = np.nan_to_num(right, nan=1e6, neginf=-1e6, posinf=1e6)
        low = np.floor(np.clip(left, -1e6, 1e6) / h)
        high = np.ceil(np.clip(right, -1e6, 1e6) / h)
        return _split_cells(p, q, low.astype(np.int64), high.astype(np.int64), h, infinity)

    def optimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominated by this direction (lower bounds on delta)."""
        h = grid_spacing
        p, q, _, _, infinity = self._cells(h)
        lo, hi = math.floor(self.low / h), math.ceil(self.high / h)
        pmf = garble_atoms(
            p_masses=np.append(p, infinity),
            q_masses=np.append(q, 0.0),
            grid_spacing=h,
            min_index=lo,
            max_index=hi,
            finite_losses=True,  # cells whose Q-mass underflows still have finite losses
        )
        if infinity == 0.0:  # no outcome reveals the example: drop P-mass that underflowed
            pmf = dataclasses.replace(pmf, infinity_mass=0.0)
        return pmf


def jl_step_pairs(
    *,
    sampling_probability: float,
    noise_multiplier: float,
    jl_dimension: int,
    pessimistic: bool,
    bins: int = 400,
) -> tuple[JLStepPair, JLStepPair]:
    """Remove and add pairs of one Poisson-subsampled DP-SGD-JL step (Bu et al. 2021, Thm 4.1).

    Remove: P = (1 - q) N(0, s^2) + q E N(S, s^2), Q = N(0, s^2); add: P and Q swapped. With
    ``pessimistic=True`` the shift law is the dominating discretisation of
    :func:`jl_shift_mixture` (use the pairs' ``pessimistic`` grids for upper bounds); with
    ``False`` the dominated one (use ``optimistic`` grids for lower bounds).
    """
    shifts, weights, unbounded = jl_shift_mixture(
        jl_dimension=jl_dimension, bins=bins, pessimistic=pessimistic
    )
    keep = weights > 0
    common = {
        "q": sampling_probability,
        "sigma": noise_multiplier,
        "shifts": shifts[keep],
        "weights": weights[keep],
        "unbounded": unbounded,
    }
    return JLStepPair(add=False, **common), JLStepPair(add=True, **common)  # type: ignore[arg-type]
