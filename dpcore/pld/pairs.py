"""Dominating pairs of single mechanisms, discretised into grid PLDs in both directions.

Each pair is given by the distribution functions of its privacy loss L = log(dP/dQ) under P and
under Q, evaluated at loss thresholds; cells between grid losses then become atoms (P-mass,
Q-mass) computed exactly from those functions, with no sampling and no quadrature.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import special

from dpcore.pld.loss_pmf import LossPmf, garble_atoms, split_atoms

__all__ = [
    "LOSS_CAP",
    "GridPair",
    "epsilon_delta_pair",
    "laplace_pair",
    "subsampled_gaussian_pairs",
]

# Loss distribution functions at thresholds: (P[L <= l], P[L > l], Q[L <= l], Q[L > l]).
Cdfs = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

#: Quantile (in standard deviations) beyond which Gaussian tails are left to the tail atoms.
_TAIL_Z = 10.0
#: Largest |loss| a grid spans. Above it P-mass goes to +inf in pessimistic grids (a split) and
#: stays at the top grid loss in optimistic ones; e^{-loss} underflows there anyway, so only
#: epsilons above ~700 or deltas below the mass beyond it are affected (made looser, never wrong).
LOSS_CAP = 750.0
#: Sub-cells per grid cell merged into atoms for the optimistic discretisation.
_SUBCELLS = 4


@dataclasses.dataclass(frozen=True)
class GridPair:
    """A dominating pair known through its loss distribution functions on [low, high]."""

    cdfs: Cdfs
    low: float
    high: float

    def _atoms(self, boundaries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p_le, p_gt, q_le, q_gt = self.cdfs(boundaries)
        # Difference whichever tail is smaller, to keep relative accuracy in both tails.
        p_cell = np.where(p_le[1:] < 0.5, p_le[1:] - p_le[:-1], p_gt[:-1] - p_gt[1:])
        q_cell = np.where(q_le[1:] < 0.5, q_le[1:] - q_le[:-1], q_gt[:-1] - q_gt[1:])
        p = np.concatenate([[p_le[0]], np.maximum(p_cell, 0.0), [p_gt[-1]]])
        q = np.concatenate([[q_le[0]], np.maximum(q_cell, 0.0), [q_gt[-1]]])
        return p, q

    def _indices(self, grid_spacing: float) -> tuple[int, int]:
        return math.floor(self.low / grid_spacing), math.ceil(self.high / grid_spacing)

    def pessimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominating the pair (certified upper bounds on delta)."""
        lo, hi = self._indices(grid_spacing)
        boundaries = np.arange(lo, hi + 1) * grid_spacing
        p, q = self._atoms(boundaries)
        return split_atoms(
            p_masses=p, q_masses=q, grid_spacing=grid_spacing, min_index=lo, max_index=hi
        )

    def optimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominated by the pair (lower bounds on delta)."""
        lo, hi = self._indices(grid_spacing)
        fine = np.arange(lo * _SUBCELLS, hi * _SUBCELLS + 1) * (grid_spacing / _SUBCELLS)
        p, q = self._atoms(fine)
        return garble_atoms(
            p_masses=p,
            q_masses=q,
            grid_spacing=grid_spacing,
            min_index=lo,
            max_index=hi,
            finite_losses=True,  # Gaussian and Laplace pairs have no outcome Q cannot produce
        )


def _mixture_threshold(loss: np.ndarray, q: float, sigma: float) -> np.ndarray:
    """x with log(1 - q + q exp((2x - 1) / (2 sigma^2))) = loss (-inf below the range)."""
    loss = np.asarray(loss, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inner = np.expm1(np.minimum(loss, 30.0)) + q  # e^l - (1 - q), for moderate l
        # log(e^l - (1 - q)) = l + log1p(-(1 - q) e^{-l}): no overflow for large l.
        log_inner = np.where(loss > 30.0, loss + np.log1p(-(1 - q) * np.exp(-loss)), np.log(inner))
        x = sigma * sigma * (log_inner - math.log(q)) + 0.5
    return np.where((loss > 30.0) | (inner > 0), x, -np.inf)


def _mixture_cdfs(x: np.ndarray, q: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(CDF, SF) at x of (1 - q) N(0, sigma^2) + q N(1, sigma^2)."""
    cdf = (1 - q) * special.ndtr(x / sigma) + q * special.ndtr((x - 1) / sigma)
    sf = (1 - q) * special.ndtr(-x / sigma) + q * special.ndtr((1 - x) / sigma)
    return cdf, sf


def subsampled_gaussian_pairs(
    *, sampling_probability: float, noise_multiplier: float
) -> tuple[GridPair, GridPair]:
    """The remove and add dominating pairs of the Poisson-subsampled Gaussian mechanism.

    Remove: P = (1 - q) N(0, s^2) + q N(1, s^2), Q = N(0, s^2); add: the same with P and Q
    swapped (Mironov, Talwar, Zhang 2019, Sec. 3; Zhu, Dong, Wang 2022, Prop. 30). The loss
    L(x) = log(1 - q + q exp((2x - 1)/(2 s^2))) is increasing in x, so its distribution functions
    are Gaussian distribution functions at the inverse x(l). ``q = 1`` is the plain Gaussian.
    """
    q, sigma = sampling_probability, noise_multiplier

    def remove(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x = _mixture_threshold(losses, q, sigma)
        p_le, p_gt = _mixture_cdfs(x, q, sigma)
        return p_le, p_gt, special.ndtr(x / sigma), special.ndtr(-x / sigma)

    def add(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # L_add = -L_remove(x) <= l  <=>  x >= x(-l); P = N(0, s^2), Q = mixture.
        x = _mixture_threshold(-losses, q, sigma)
        q_gt, q_le = _mixture_cdfs(x, q, sigma)
        return special.ndtr(-x / sigma), special.ndtr(x / sigma), q_le, q_gt

    def loss_at(x: float) -> float:
        exponent = (2 * x - 1) / (2 * sigma) / sigma
        if q == 1:
            return exponent
        return float(np.logaddexp(math.log1p(-q), math.log(q) + exponent))

    # Losses beyond +-LOSS_CAP are left to the grids' end atoms (pessimistic: +inf; optimistic:
    # the last grid loss), so a tiny sigma does not ask for a grid of 1 / sigma^2 points.
    high = min(loss_at(1 + _TAIL_Z * sigma), LOSS_CAP)
    low = max(loss_at(-_TAIL_Z * sigma), -LOSS_CAP)
    return GridPair(remove, low, high), GridPair(add, -high, -low)


def laplace_pair(*, noise_multiplier: float) -> GridPair:
    """Dominating pair of the Laplace mechanism: P = Lap(0, b), Q = Lap(1, b) (symmetric).

    L(x) = (|x - 1| - |x|) / b takes the values +-1/b with point masses 1/2 and e^{-1/b}/2 under
    P and is linear in between (Koskela, Jälkö, Honkela 2020, Sec. 6).
    """
    b = noise_multiplier

    def cdfs(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # L <= l  <=>  x >= y(l) = (1 - b l) / 2, clipped to the support of L.
        y = np.clip((1 - b * losses) / 2, 0.0, 1.0)
        p_le = 0.5 * np.exp(-y / b)
        q_gt = 0.5 * np.exp(-(1 - y) / b)
        below, above = losses < -1 / b, losses >= 1 / b
        p_le = np.where(below, 0.0, np.where(above, 1.0, p_le))
        q_gt = np.where(below, 1.0, np.where(above, 0.0, q_gt))
        return p_le, 1 - p_le, 1 - q_gt, q_gt

    reach = min(1 / b + 1e-9, LOSS_CAP)  # 1 / b is inf for subnormal b
    return GridPair(cdfs, -reach, reach)


def epsilon_delta_pair(
    *, epsilon: float, delta: float, grid_spacing: float
) -> tuple[LossPmf, LossPmf]:
    """(pessimistic, optimistic) PLDs of the dominating pair of an (epsilon, delta)-DP mechanism.

    P puts mass delta on an outcome impossible under Q and (1 - delta) e^eps / (1 + e^eps),
    (1 - delta) / (1 + e^eps) on two outcomes with losses +eps and -eps (Kairouz, Oh, Viswanath
    2015, Thm 2.1; its tradeoff function is f_{eps, delta}).
    """
    heavy = (1 - delta) * float(special.expit(epsilon))  # e^eps / (1 + e^eps), no overflow
    light = (1 - delta) * float(special.expit(-epsilon))
    p = np.array([heavy, light, delta])
    q = np.array([light, heavy, 0.0])
    reach = min(epsilon, LOSS_CAP)  # beyond it: the end atoms (pessimistic +inf), see LOSS_CAP
    lo = math.floor(-reach / grid_spacing) - 1
    hi = math.ceil(reach / grid_spacing) + 1
    return (
        split_atoms(p_masses=p, q_masses=q, grid_spacing=grid_spacing, min_index=lo, max_index=hi),
        garble_atoms(p_masses=p, q_masses=q, grid_spacing=grid_spacing, min_index=lo, max_index=hi),
    )
