"""Dominating pairs of single mechanisms, discretised into grid PLDs in both directions.

Each pair is given by the distribution functions of its privacy loss L = log(dP/dQ) under P and
under Q, evaluated at loss thresholds; cells between grid losses then become atoms (P-mass,
Q-mass) computed exactly from those functions, with no sampling and no quadrature. Pairs with
finitely many outcomes (:class:`AtomPair`) are discretised from their atoms directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import special

from dpcore.errors import InvalidParameterError
from dpcore.pld.loss_pmf import LossPmf, garble_atoms, split_atoms
from dpcore.validation import check_count, check_non_negative, check_positive, check_probability

__all__ = [
    "LOSS_CAP",
    "AtomPair",
    "GridPair",
    "bounded_range_pair",
    "composed_randomized_response_pair",
    "epsilon_delta_atoms",
    "epsilon_delta_pair",
    "laplace_pair",
    "mixture_of_gaussians_pairs",
    "randomized_response_pair",
    "subsampled_epsilon_delta_pairs",
    "subsampled_gaussian_pairs",
    "subsampled_laplace_pairs",
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
#: Margin added to the exact end of a bounded loss range, so that the end lies inside the grid.
_EDGE = 1e-9
#: Newton iterations allowed to the mixture threshold (it converges in a handful).
_NEWTON_STEPS = 100
#: Elements of the (components x thresholds) arrays of a mixture evaluated at once.
_CHUNK_ELEMENTS = 2**22


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
            finite_losses=True,  # every pair built on GridPair has only finite losses
        )


@dataclasses.dataclass(frozen=True, eq=False)
class AtomPair:
    """A dominating pair with finitely many outcomes: P- and Q-masses of each.

    An outcome with Q-mass 0 has loss +inf, one with P-mass 0 loss -inf. ``reach`` bounds the
    finite |losses| the grid must span (capped at :data:`LOSS_CAP`).
    """

    p_masses: np.ndarray
    q_masses: np.ndarray
    reach: float

    def _indices(self, grid_spacing: float) -> tuple[int, int]:
        reach = min(self.reach, LOSS_CAP)  # beyond it: the end atoms, see LOSS_CAP
        return math.floor(-reach / grid_spacing) - 1, math.ceil(reach / grid_spacing) + 1

    def pessimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominating the pair: every atom split onto its neighbouring grid losses."""
        lo, hi = self._indices(grid_spacing)
        return split_atoms(
            p_masses=self.p_masses,
            q_masses=self.q_masses,
            grid_spacing=grid_spacing,
            min_index=lo,
            max_index=hi,
        )

    def optimistic(self, grid_spacing: float) -> LossPmf:
        """Grid PLD dominated by the pair: atoms merged onto grid losses."""
        lo, hi = self._indices(grid_spacing)
        return garble_atoms(
            p_masses=self.p_masses,
            q_masses=self.q_masses,
            grid_spacing=grid_spacing,
            min_index=lo,
            max_index=hi,
        )


def _atom_pair(
    p_masses: Sequence[float] | np.ndarray, q_masses: Sequence[float] | np.ndarray
) -> AtomPair:
    """An :class:`AtomPair` whose reach is its largest finite |loss|."""
    p, q = np.asarray(p_masses, dtype=float), np.asarray(q_masses, dtype=float)
    finite = (p > 0) & (q > 0)
    losses = np.log(p[finite]) - np.log(q[finite])
    reach = float(np.abs(losses).max()) if losses.size else 0.0
    return AtomPair(p, q, reach)


def _log_exp_minus(values: np.ndarray, zero: float, positive: float) -> np.ndarray:
    """log(e^v - zero) for v > log(zero), with ``positive`` = 1 - zero given separately.

    Where zero e^{-v} < 1/2 it is v + log1p(-zero e^{-v}) (no overflow for large v); nearer the
    pole it is log(expm1(v) + positive), exact where e^v - zero is much smaller than 1. nan or
    -inf below the pole.
    """
    values = np.asarray(values, dtype=float)
    if zero == 0:
        return values
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = zero * np.exp(-values)
        far = values + np.log1p(-ratio)
        near = np.log(np.expm1(np.minimum(values, 1.0)) + positive)
        return np.asarray(np.where(ratio < 0.5, far, near))


# ------------------------------------------------------------------ mixtures of Gaussians
@dataclasses.dataclass(frozen=True, eq=False)
class _Mixture:
    """sum_i p_i N(c_i, s^2) against N(0, s^2), reduced to what the loss needs.

    ``zero`` is the weight of shift 0 and ``positive`` = 1 - zero; ``slopes`` a_i = c_i / s^2 and
    ``intercepts`` b_i = log p_i - c_i^2 / (2 s^2) describe the components with c_i > 0, so that
    the remove loss is L(x) = log(zero + exp(G(x))) with G(x) = log sum_i exp(a_i x + b_i).
    """

    sigma: float
    shifts: np.ndarray  # all shifts with positive weight (0 included), ascending
    weights: np.ndarray  # their weights, summing to 1
    zero: float
    positive: float
    slopes: np.ndarray
    intercepts: np.ndarray
    halves: np.ndarray  # c_i^2 / (2 s^2) of the positive shifts

    @classmethod
    def build(cls, sigma: float, shifts: Sequence[float], weights: Sequence[float]) -> _Mixture:
        merged: dict[float, list[float]] = {}
        for shift, weight in zip(shifts, weights, strict=True):
            if weight > 0:
                merged.setdefault(float(shift), []).append(float(weight))
        total = math.fsum(w for ws in merged.values() for w in ws)
        keys = sorted(merged)
        values = np.array([math.fsum(merged[key]) / total for key in keys])
        shift_array = np.array(keys)
        up = shift_array > 0
        zero = math.fsum(float(v) for v in values[~up])
        positive = math.fsum(float(v) for v in values[up])
        scaled = shift_array[up] / sigma  # c_i / s
        halves = scaled * scaled / 2
        return cls(
            sigma=sigma,
            shifts=shift_array,
            weights=values,
            zero=zero,
            positive=positive,
            slopes=scaled / sigma,
            intercepts=np.log(values[up]) - halves,
            halves=halves,
        )

    def loss(self, x: float) -> float:
        """The remove loss L(x) at one point."""
        excess = float(special.logsumexp(self.slopes * x + self.intercepts))
        if self.zero == 0:
            return excess
        return float(np.logaddexp(math.log(self.zero), excess))

    def _chunks(self, size: int) -> list[slice]:
        """Slices of [0, size) short enough that (components x slice) arrays stay ~32 MiB."""
        step = max(1, _CHUNK_ELEMENTS // self.shifts.size)
        return [slice(start, start + step) for start in range(0, size, step)]

    def threshold(self, losses: np.ndarray) -> np.ndarray:
        """x(l) with L(x(l)) = l; -inf where l <= inf L = log(zero) (no x has L(x) <= l).

        Solves G(x) = r = log(e^l - zero). G is convex and increasing with slopes in
        [min a_i, max a_i], so Newton's method started right of the root decreases monotonically
        onto it. The start x_hi = min_i (r - b_i) / a_i lies right of the root (G >= a_i x + b_i),
        and x_lo = min_i (r - log(positive) + c_i^2 / (2 s^2)) / a_i left of it
        (G <= log(positive) + max_i (a_i x - c_i^2 / (2 s^2))); every iterate is clipped to
        [x_lo, previous iterate], so rounding can neither overshoot nor cycle, and the iteration
        stops when a step moves x by at most 4 ulps. A single positive shift needs no iteration:
        x_hi is then the closed form.
        """
        losses = np.asarray(losses, dtype=float)
        floor = math.log(self.zero) if self.zero > 0 else -math.inf
        with np.errstate(invalid="ignore"):
            target = _log_exp_minus(losses, self.zero, self.positive)
            valid = (losses > floor) & np.isfinite(target)
        r = np.where(valid, target, 0.0)
        x = np.empty_like(r)
        for part in self._chunks(r.size):
            x[part] = self._root(r[part])
        return np.where(valid, x, -np.inf)

    def _root(self, r: np.ndarray) -> np.ndarray:
        a, b = self.slopes[:, None], self.intercepts[:, None]
        x: np.ndarray = np.min((r[None, :] - b) / a, axis=0)
        if self.slopes.size == 1:
            return x
        low = np.min((r[None, :] - math.log(self.positive) + self.halves[:, None]) / a, axis=0)
        active = np.arange(r.size)
        for _ in range(_NEWTON_STEPS):
            if active.size == 0:
                break
            current = x[active]
            exponents = a * current[None, :] + b
            peak = exponents.max(axis=0)
            terms = np.exp(exponents - peak)
            total = terms.sum(axis=0)
            value = peak + np.log(total)  # G(x), and G'(x) below
            slope = (terms * a).sum(axis=0) / total
            new = np.clip(current - (value - r[active]) / slope, low[active], current)
            x[active] = new
            ulps = 4 * np.spacing(np.maximum(np.abs(current), 1e-300))
            active = active[np.abs(new - current) > ulps]
        return x

    def cdf_sf(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(CDF, SF) of the mixture at x."""
        cdf, sf = np.empty_like(x), np.empty_like(x)
        w = self.weights[:, None]
        for part in self._chunks(x.size):
            z = (x[None, part] - self.shifts[:, None]) / self.sigma
            cdf[part] = (w * special.ndtr(z)).sum(axis=0)
            sf[part] = (w * special.ndtr(-z)).sum(axis=0)
        return cdf, sf


def mixture_of_gaussians_pairs(
    *, noise_multiplier: float, sensitivities: Sequence[float], probabilities: Sequence[float]
) -> tuple[GridPair, GridPair]:
    """Remove and add dominating pairs of the mixture-of-Gaussians mechanism.

    Remove: P = sum_i p_i N(c_i, s^2), Q = N(0, s^2); add: P and Q swapped (Choquette-Choo,
    Ganesh, Steinke, Thakurta 2023, arXiv 2310.15526, Sec. 4 -- Cor. 4.7 reduces vector-valued
    mixtures to this scalar one; dp_accounting's ``MixtureGaussianPrivacyLoss``). With all
    c_i >= 0 the loss L(x) = log sum_i p_i exp((2 c_i x - c_i^2) / (2 s^2)) is increasing in
    x, so its distribution functions are mixtures of Gaussian distribution functions at the
    inverse x(l), found by a bracketed monotone Newton iteration (:meth:`_Mixture.threshold`).
    ``c = (0, 1)``, ``p = (1 - q, q)`` is the Poisson-subsampled Gaussian
    (:func:`subsampled_gaussian_pairs`). Probabilities are renormalised to sum to 1; at least
    one sensitivity with positive probability must be positive.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    shifts = [check_non_negative(f"sensitivities[{i}]", c) for i, c in enumerate(sensitivities)]
    weights = [check_probability(f"probabilities[{i}]", p) for i, p in enumerate(probabilities)]
    if len(shifts) != len(weights) or not any(
        c > 0 and p > 0 for c, p in zip(shifts, weights, strict=True)
    ):
        raise InvalidParameterError(
            "sensitivities",
            "one per probability, one of them > 0 with probability > 0",
            tuple(sensitivities),
        )
    mixture = _Mixture.build(sigma, shifts, weights)

    def remove(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x = mixture.threshold(losses)
        p_le, p_gt = mixture.cdf_sf(x)
        return p_le, p_gt, special.ndtr(x / sigma), special.ndtr(-x / sigma)

    def add(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # L_add = -L_remove(x) <= l  <=>  x >= x(-l); P = N(0, s^2), Q = mixture.
        x = mixture.threshold(-losses)
        q_gt, q_le = mixture.cdf_sf(x)
        return special.ndtr(-x / sigma), special.ndtr(x / sigma), q_le, q_gt

    top = float(mixture.shifts[-1])
    high = min(mixture.loss(top + _TAIL_Z * sigma), LOSS_CAP)
    low = max(mixture.loss(-_TAIL_Z * sigma), -LOSS_CAP)
    return GridPair(remove, low, high), GridPair(add, -high, -low)


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
    This is :func:`mixture_of_gaussians_pairs` with ``c = (0, 1)``, with its closed-form inverse.
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


# ------------------------------------------------------------------ Laplace
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

    reach = min(1 / b + _EDGE, LOSS_CAP)  # 1 / b is inf for subnormal b
    return GridPair(cdfs, -reach, reach)


def _laplace_cdf(z: np.ndarray) -> np.ndarray:
    """CDF of the standard Laplace distribution at z (accurate in the lower tail; the upper tail
    is computed as the CDF at -z where it matters)."""
    return np.asarray(
        np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1 - 0.5 * np.exp(-np.abs(z)))
    )


def subsampled_laplace_pairs(
    *, sampling_probability: float, noise_multiplier: float
) -> tuple[GridPair, GridPair]:
    """Remove and add dominating pairs of the Poisson-subsampled Laplace mechanism.

    Remove: P = (1 - q) Lap(0, b) + q Lap(1, b), Q = Lap(0, b); add: P and Q swapped. If a
    kernel K carries the Laplace pair (Lap(1, b), Lap(0, b)) to (M(D), M(D - x)), it carries
    ((1 - q) Lap(0, b) + q Lap(1, b), Lap(0, b)) to the sampled pair ((1 - q) M(D - x) + q M(D),
    M(D - x)), so these dominate (Zhu, Dong, Wang 2022, Sec. 5, Poisson subsampling of a
    dominating pair; dp_accounting's ``from_laplace_mechanism(sampling_prob=q)`` uses the same
    pairs). With g(x) = (|x| - |x - 1|) / b the loss L(x) = log(1 - q + q e^{g(x)}) is constant
    for x <= 0 and for x >= 1 (point masses at L_min = log(1 - q + q e^{-1/b}) and
    L_max = log(1 - q + q e^{1/b})) and increasing in between, with inverse
    x(l) = (b log((e^l - 1 + q) / q) + 1) / 2, so its distribution functions are Laplace
    distribution functions at x(l). ``q = 1`` returns :func:`laplace_pair` twice.
    """
    q = check_probability("sampling_probability", sampling_probability)
    b = check_positive("noise_multiplier", noise_multiplier)
    if q == 0:
        raise InvalidParameterError("sampling_probability", "> 0", sampling_probability)
    if q == 1:
        pair = laplace_pair(noise_multiplier=b)
        return pair, pair
    reach = 1 / b  # inf for subnormal b
    low_loss = math.log1p(-q * -math.expm1(-reach))
    if reach > 30:
        high_loss = float(np.logaddexp(math.log1p(-q), math.log(q) + reach))
    else:
        high_loss = math.log1p(q * math.expm1(reach))

    def inverse(values: np.ndarray, strict: bool) -> np.ndarray:
        """y with {L <= v} = {x <= y} (``strict``: {L < v} = {x < y}).

        -inf below L_min (at L_min too when strict), +inf at and above L_max (only above when
        strict); the Laplace laws have no atoms, so x < y and x <= y have the same mass.
        """
        with np.errstate(invalid="ignore"):
            ratio = _log_exp_minus(values, 1 - q, q) - math.log(q)
            y = np.clip((b * ratio + 1) / 2, 0.0, 1.0)
        if strict:
            return np.where(values <= low_loss, -np.inf, np.where(values > high_loss, np.inf, y))
        return np.where(values < low_loss, -np.inf, np.where(values >= high_loss, np.inf, y))

    def scaled(y: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # y / b is +-inf for a subnormal b: CDF 0 or 1
            return y / b

    def mixture(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cdf = (1 - q) * _laplace_cdf(scaled(y)) + q * _laplace_cdf(scaled(y - 1))
        sf = (1 - q) * _laplace_cdf(scaled(-y)) + q * _laplace_cdf(scaled(1 - y))
        return cdf, sf

    def remove(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        y = inverse(losses, strict=False)
        p_le, p_gt = mixture(y)
        return p_le, p_gt, _laplace_cdf(scaled(y)), _laplace_cdf(scaled(-y))

    def add(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        # L_add = -L_remove <= l  <=>  L_remove >= -l  <=>  x >= y with {L_remove < -l} = {x < y}.
        y = inverse(-losses, strict=True)
        q_gt, q_le = mixture(y)
        return _laplace_cdf(scaled(-y)), _laplace_cdf(scaled(y)), q_le, q_gt

    high = min(high_loss + _EDGE, LOSS_CAP)
    low = max(low_loss - _EDGE, -LOSS_CAP)
    return GridPair(remove, low, high), GridPair(add, -high, -low)


# ------------------------------------------------------------------ pure and approximate DP
def _epsilon_delta_atoms(epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The four outcomes of the (epsilon, delta) pair: P-only, two finite, Q-only."""
    heavy = (1 - delta) * float(special.expit(epsilon))  # e^eps / (1 + e^eps), no overflow
    light = (1 - delta) * float(special.expit(-epsilon))
    return np.array([heavy, light, delta, 0.0]), np.array([light, heavy, 0.0, delta])


def epsilon_delta_atoms(*, epsilon: float, delta: float) -> AtomPair:
    """The pair of :func:`epsilon_delta_pair` as atoms (for discretising on several grids)."""
    p, q = _epsilon_delta_atoms(epsilon, delta)
    return AtomPair(p, q, epsilon)


def epsilon_delta_pair(
    *, epsilon: float, delta: float, grid_spacing: float
) -> tuple[LossPmf, LossPmf]:
    """(pessimistic, optimistic) PLDs of the dominating pair of an (epsilon, delta)-DP mechanism.

    P puts mass delta on an outcome impossible under Q and (1 - delta) e^eps / (1 + e^eps),
    (1 - delta) / (1 + e^eps) on two outcomes with losses +eps and -eps; Q mirrors it, with mass
    delta on an outcome impossible under P (Kairouz, Oh, Viswanath 2015, Thm 2.1; its tradeoff
    function is f_{eps, delta}). That last outcome has loss -inf: it never adds to a delta here,
    but it does once the pair is mixed (:func:`subsampled_epsilon_delta_pairs`).
    """
    pair = epsilon_delta_atoms(epsilon=epsilon, delta=delta)
    return pair.pessimistic(grid_spacing), pair.optimistic(grid_spacing)


def subsampled_epsilon_delta_pairs(
    *, sampling_probability: float, epsilon: float, delta: float
) -> tuple[AtomPair, AtomPair]:
    """Remove and add dominating pairs of a Poisson-subsampled (epsilon, delta)-DP mechanism.

    With (P, Q) the pair of :func:`epsilon_delta_pair`, remove is ((1 - q) Q + q P, Q) and add
    (Q, (1 - q) Q + q P): a kernel carrying (P, Q) to (M(D), M(D - x)) carries these to the
    sampled pairs (Zhu, Dong, Wang 2022, Sec. 5, Poisson subsampling of a dominating pair under
    add/remove neighbouring). Their losses are finite except the +inf of the delta atom.
    """
    q = check_probability("sampling_probability", sampling_probability)
    p_atoms, q_atoms = _epsilon_delta_atoms(
        check_non_negative("epsilon", epsilon), check_non_negative("delta", delta)
    )
    mixed = (1 - q) * q_atoms + q * p_atoms
    return _atom_pair(mixed, q_atoms), _atom_pair(q_atoms, mixed)


def randomized_response_pair(*, noise_parameter: float, num_buckets: int) -> AtomPair:
    """The exact pair of k-ary randomized response with noise parameter p, 0 < p <= 1.

    On input a the output is a w.p. 1 - p + p/k and each other value w.p. p/k; the pair is the
    output laws on two different inputs a, b: P = (1 - p + p/k, p/k, (k - 2) p/k) and
    Q = (p/k, 1 - p + p/k, (k - 2) p/k) over the outputs {a, b, other}, with losses
    +-log(1 + k (1 - p) / p) and 0 (Warner 1965; the pair of dp_accounting's
    ``from_randomized_response`` under replace-one). It is symmetric.
    """
    p = check_probability("noise_parameter", noise_parameter)
    k = check_count("num_buckets", num_buckets, minimum=2)
    if p == 0:
        raise InvalidParameterError("noise_parameter", "> 0 (0 reports the value itself)", p)
    light = p / k
    heavy = 1 - p * (k - 1) / k
    other = (k - 2) * light
    return AtomPair(
        np.array([heavy, light, other]),
        np.array([light, heavy, other]),
        math.log1p(k * (1 - p) / p),
    )


def composed_randomized_response_pair(*, epsilon: float, count: int) -> AtomPair:
    """The exact ``count``-fold composition of the epsilon-DP randomized-response pair.

    With a = e^eps / (1 + e^eps), b = 1 - a: j of ``count`` outcomes land on the heavy side with
    P-mass C(n, j) a^j b^(n-j) and Q-mass C(n, j) b^j a^(n-j), loss (2j - n) epsilon (the
    binomial form of Kairouz, Oh, Viswanath 2015, Thm 3.3).
    """
    epsilon = check_non_negative("epsilon", epsilon)
    n = check_count("count", count, minimum=1)
    j = np.arange(n + 1)
    log_choose = special.gammaln(n + 1) - special.gammaln(j + 1) - special.gammaln(n - j + 1)
    log_a, log_b = special.log_expit(epsilon), special.log_expit(-epsilon)
    p = np.exp(log_choose + j * log_a + (n - j) * log_b)
    q = np.exp(log_choose + j * log_b + (n - j) * log_a)
    return AtomPair(p, q, n * epsilon)


def bounded_range_pair(*, epsilon: float) -> GridPair:
    """A dominating pair of every epsilon-bounded-range mechanism (e.g. the exponential one).

    A mechanism is epsilon-BR when its privacy loss takes values in [t - eps, t] for some t
    (Durfee & Rogers 2019, Def. 3.1); the exponential mechanism at parameter epsilon is
    (Lemma 3.2). Splitting every outcome onto the two ends shows each such pair is dominated by
    the two-point pair with losses t and t - eps, whose tradeoff curve bends at
    ((e^t - 1)/(e^eps - 1), (e^(eps - t) - 1)/(e^eps - 1)) (the generalised randomized
    response of Dong, Durfee, Rogers 2020, Sec. 4). These corners trace the convex curve
    f(a) = (1 - a) / (1 + (e^eps - 1) a), which is therefore the infimum over t: every
    epsilon-BR mechanism is f-DP, and f-DP composes (Dong, Roth, Su 2019, Thm 3.2). This is its
    pair: under P the loss is L = 2 log(1 + (e^eps - 1) U) - eps with U uniform on [0, 1], so
    P[L <= l] = expm1((l + eps)/2) / expm1(eps) and Q[L > l] = expm1((eps - l)/2) / expm1(eps)
    on [-eps, eps]. It is symmetric and tight for one step (the supremum over t of the
    two-point profiles), and tighter than the pure-DP pair with losses +-eps; composed, it is a
    valid upper bound, also for adaptive compositions, which need not be attained.
    """
    epsilon = check_positive("epsilon", epsilon)

    def log_expm1(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.asarray(
                np.where(
                    x > 30.0,
                    x + np.log1p(-np.exp(-np.minimum(x, 700.0))),
                    np.log(np.expm1(np.minimum(x, 30.0))),
                )
            )

    log_norm = float(log_expm1(np.array([epsilon]))[0])

    def cdfs(losses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        clipped = np.clip(losses, -epsilon, epsilon)
        up, down = (clipped + epsilon) / 2, (epsilon - clipped) / 2  # both in [0, eps]
        with np.errstate(divide="ignore"):
            log_up, log_down = log_expm1(up), log_expm1(down)
        p_le = np.exp(log_up - log_norm)
        p_gt = np.exp(up + log_down - log_norm)
        q_gt = np.exp(log_down - log_norm)
        q_le = np.exp(down + log_up - log_norm)
        return p_le, p_gt, q_le, q_gt

    reach = min(epsilon + _EDGE, LOSS_CAP)
    return GridPair(cdfs, -reach, reach)
