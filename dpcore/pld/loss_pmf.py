"""Grid privacy-loss distributions: construction from atoms, FFT composition, hockey stick.

Conventions: a :class:`LossPmf` holds P-masses of losses ``(offset + k) * grid_spacing`` plus the
P-mass at loss +inf. The Q-mass of a finite loss l is ``exp(-l)`` times its P-mass; Q-mass where
P has none (loss -inf) is implicit. Masses may sum to less than one (optimistic pairs drop mass,
which only lowers every hockey-stick divergence).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import fft, signal

from dpcore.errors import InvalidParameterError, ResourceLimitError
from dpcore.validation import check_count, check_non_negative, check_positive

__all__ = ["LossPmf", "compose_many", "garble_atoms", "max_profile", "split_atoms"]

#: Tail mass allowed outside the FFT window on each side, per composition (an upper bound via
#: Chernoff; it is reported in ``error_mass`` and added to delta for the certified bound).
TAIL_MASS = 1e-18
#: Floating-point allowance added to every composed PLD's error mass (sums of ~1e6 terms).
FLOAT_ALLOWANCE = 1e-15
#: Most compositions (counts summed) one PLD is composed of. The spectrum is raised to the
#: n-th power, which multiplies its relative rounding error by about n; at 1e18 compositions a
#: certified interval came out with its lower end above its upper end.
MAX_COMPOSITIONS = 10**9
#: Largest composed grid: 2^27 points, about 1 GiB per float64 array (a few such arrays at once).
#: Larger compositions raise :class:`~dpcore.errors.ResourceLimitError` before allocating.
MAX_COMPOSED_POINTS = 2**27
_CHERNOFF_SPREAD = 2.0 ** np.arange(-12, 4)


@dataclasses.dataclass(frozen=True, eq=False)
class LossPmf:
    """P-distribution of the privacy loss of one dominating pair, on a uniform grid.

    Attributes:
        grid_spacing: distance h between neighbouring losses.
        offset: the loss of ``pmf[k]`` is ``(offset + k) * grid_spacing``.
        pmf: P-masses of finite losses (non-negative).
        infinity_mass: P-mass at loss +inf (outcomes impossible under Q).
        error_mass: mass whose position is uncertain after a truncated FFT composition, plus a
            floating-point allowance; a certified delta adds it, an optimistic one subtracts it.
    """

    grid_spacing: float
    offset: int
    pmf: np.ndarray
    infinity_mass: float
    error_mass: float = 0.0

    def losses(self) -> np.ndarray:
        """The finite losses, aligned with :attr:`pmf`."""
        return (self.offset + np.arange(self.pmf.size)) * self.grid_spacing

    def delta(self, epsilon: float) -> float:
        """Hockey-stick divergence E_P[(1 - e^{epsilon - L})_+] (error_mass not included)."""
        epsilon = check_non_negative("epsilon", epsilon, allow_infinity=True)
        if math.isinf(epsilon):
            return self.infinity_mass
        losses = self.losses()
        above = losses > epsilon
        tail = self.pmf[above] * -np.expm1(epsilon - losses[above])
        return float(min(1.0, self.infinity_mass + tail.sum()))

    def largest_loss(self) -> float:
        """The largest loss with positive P-mass: inf with mass at +inf, -inf with no mass."""
        if self.infinity_mass > 0:
            return math.inf
        support = np.flatnonzero(self.pmf > 0)
        if support.size == 0:
            return -math.inf
        return float((self.offset + int(support[-1])) * self.grid_spacing)

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 with :meth:`delta` (epsilon) <= ``delta`` (inf if none).

        At ``delta = 0`` this is the largest loss with positive mass (0 if it is negative).
        """
        if delta < self.infinity_mass or (delta == self.infinity_mass and delta > 0):
            return math.inf
        if delta == 0:
            return max(0.0, self.largest_loss())
        losses = self.losses()
        # Suffix sums give delta at every grid loss at once. With S[j] = sum_{k>=j} p_k
        # e^{-(l_k - l_j)} (a stable backward recursion, no overflow for large losses),
        # delta(l_j) = s1[j+1] - e^{-h} S[j+1], and between grid losses delta(eps) =
        # s1[j] - e^{eps - l_j} S[j] inverts in closed form.
        s1 = np.cumsum(self.pmf[::-1])[::-1]
        decay = math.exp(-self.grid_spacing)
        shifted = signal.lfilter([1.0], [1.0, -decay], self.pmf[::-1])[::-1]
        budget = delta - self.infinity_mass
        at_grid = np.append(s1[1:], 0.0) - decay * np.append(shifted[1:], 0.0)
        j = int(np.argmax(at_grid <= budget))  # the last entry is always 0 <= budget
        floor = float(losses[j - 1]) if j > 0 else -math.inf
        if s1[j] <= budget:
            eps = floor
        else:
            step = math.log((s1[j] - budget) / shifted[j])
            eps = min(float(losses[j]), max(floor, float(losses[j]) + step))
        return max(0.0, eps)

    def tradeoff_vertices(self) -> tuple[np.ndarray, np.ndarray]:
        """Vertices (alpha, beta) of the tradeoff curve T(P, Q), alpha increasing.

        Neyman–Pearson: reject P first where dQ/dP is largest, i.e. in increasing loss order.
        """
        with np.errstate(divide="ignore"):
            # One atom's Q-mass cannot exceed 1; larger values can only be FFT noise.
            q_masses = np.exp(np.minimum(np.log(self.pmf) - self.losses(), 0.0))
        q_only = max(0.0, 1.0 - float(q_masses.sum()))
        alpha = np.concatenate([[0.0, 0.0], np.cumsum(self.pmf)])
        beta = np.concatenate([[1.0, 1.0 - q_only], 1.0 - q_only - np.cumsum(q_masses)])
        alpha = np.append(alpha, min(1.0, alpha[-1] + self.infinity_mass))
        beta = np.append(beta, beta[-1])
        if alpha[-1] < 1.0:
            alpha, beta = np.append(alpha, 1.0), np.append(beta, beta[-1])
        return alpha, np.clip(beta, 0.0, 1.0)

    def compose(self, other: LossPmf) -> LossPmf:
        """The PLD of running both pairs independently."""
        return compose_many([(self, 1), (other, 1)])

    def self_compose(self, count: int) -> LossPmf:
        """The PLD of ``count`` independent runs."""
        return compose_many([(self, count)])


def _grid_index(losses: np.ndarray, grid_spacing: float) -> tuple[np.ndarray, np.ndarray]:
    scaled = losses / grid_spacing
    lower = np.floor(scaled)
    return lower.astype(np.int64), scaled - lower


def _from_bins(
    index: np.ndarray, masses: np.ndarray, grid_spacing: float, infinity_mass: float
) -> LossPmf:
    if index.size == 0:
        return LossPmf(grid_spacing, 0, np.zeros(1), float(infinity_mass))
    start = int(index.min())
    pmf = np.bincount(index - start, weights=masses)
    return LossPmf(grid_spacing, start, np.maximum(pmf, 0.0), float(infinity_mass))


#: Losses below this are never represented: e^{-loss} would overflow, and an atom there has
#: P-mass below e^{-700} times its Q-mass. Pessimistic grids move such P-mass up to it (a split),
#: optimistic grids drop it.
_LOWEST_LOSS = -700.0


def _lowest_index(min_index: int | None, grid_spacing: float) -> int:
    floor = math.ceil(_LOWEST_LOSS / grid_spacing)
    return floor if min_index is None else max(min_index, floor)


def _finite_atoms(
    p_masses: np.ndarray, q_masses: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """Atoms with both masses positive, and the P-mass of atoms Q cannot produce (loss +inf).

    Atoms without P-mass (loss -inf) are dropped: they never contribute to a hockey stick.
    """
    p = np.asarray(p_masses, dtype=float)
    q = np.asarray(q_masses, dtype=float)
    infinity = float(p[(q <= 0) & (p > 0)].sum())
    keep = (p > 0) & (q > 0)
    return p[keep], q[keep], infinity


def split_atoms(
    *,
    p_masses: np.ndarray,
    q_masses: np.ndarray,
    grid_spacing: float,
    min_index: int | None = None,
    max_index: int | None = None,
) -> LossPmf:
    """Pessimistic grid PLD: split every atom onto grid losses, preserving its P- and Q-mass.

    An atom with masses (p, q) and loss l in [l_i, l_{i+1}] becomes P-mass p*b at l_{i+1} and
    p*(1-b) at l_i with b = (e^{-l_i} - e^{-l}) / (e^{-l_i} - e^{-l_{i+1}}), which preserves the
    Q-mass too. The original pair is a garbling (merge) of the result, so the result dominates
    it; this is the "connect the dots" discretisation (Doroshenko et al. 2022, Thm 4.3).
    Atoms below ``min_index`` keep their P-mass at that grid loss (the spare Q-mass becomes
    Q-only); above ``max_index`` the atom keeps its Q-mass at that loss and the spare P-mass goes
    to +inf. Both are splits too, hence still pessimistic.
    """
    h = check_positive("grid_spacing", grid_spacing)
    p, q, infinity = _finite_atoms(p_masses, q_masses)
    losses = np.log(p) - np.log(q)
    lower, _ = _grid_index(losses, h)
    min_index = _lowest_index(min_index, h)
    if min_index is not None:
        low = lower < min_index
        lower = np.where(low, min_index, lower)
        # P-mass kept at l_min; losses clipped so that b = 0 there.
        losses = np.where(low, min_index * h, losses)
    if max_index is not None:
        high = lower >= max_index
        capped = np.exp(np.minimum(np.log(p), np.log(q) + max_index * h))
        infinity += float(np.maximum(p - capped, 0.0)[high].sum())
        p = np.where(high, capped, p)
        lower = np.where(high, max_index, lower)
        losses = np.where(high, max_index * h, losses)
    l_lo = lower * h
    # b in [0, 1]: share of P-mass moved up to l_{i+1}; written with expm1 for accuracy.
    b = np.clip(-np.expm1(l_lo - losses) / -math.expm1(-h), 0.0, 1.0)
    index = np.concatenate([lower, lower + 1])
    masses = np.concatenate([p * (1 - b), p * b])
    return _from_bins(index, masses, h, infinity)


def garble_atoms(
    *,
    p_masses: np.ndarray,
    q_masses: np.ndarray,
    grid_spacing: float,
    min_index: int,
    max_index: int,
    finite_losses: bool = False,
) -> LossPmf:
    """Optimistic grid PLD: a pair *dominated* by the atoms (its deltas are lower bounds).

    Each atom is shared between its two neighbouring grid losses with linear (hat) weights --
    a Markov kernel, i.e. a garbling. A merged grid atom whose loss lands above its grid loss
    loses the excess P-mass; one that lands below borrows the needed fraction of the next atom
    (a further garbling), or failing that keeps its P-mass one grid step lower with added Q-mass.
    Removing P-mass, adding Q-mass and merging never increase a hockey-stick divergence, also
    after composition. Atoms below ``min_index`` are dropped; atoms above ``max_index`` (at most
    700 / grid_spacing, where e^{-loss} still exists in floating point) keep their P-mass at that
    loss (Q-mass added). With ``finite_losses`` (pairs whose true losses are all finite) an atom
    whose Q-mass underflowed to 0 is such an atom too, not an infinite loss.
    """
    h = check_positive("grid_spacing", grid_spacing)
    max_index = min(max_index, math.floor(-_LOWEST_LOSS / h))
    if finite_losses:
        p_in, q_in = np.asarray(p_masses, dtype=float), np.asarray(q_masses, dtype=float)
        underflow = (p_in > 0) & (q_in <= 0)
        q_masses = np.where(underflow, p_in * math.exp(-max_index * h), q_in)
    p, q, infinity = _finite_atoms(p_masses, q_masses)
    lower, frac = _grid_index(np.log(p) - np.log(q), h)
    min_index = _lowest_index(min_index, h)
    top = lower >= max_index
    lower = np.where(top, max_index, lower)
    q = np.where(top, np.exp(np.log(p) - max_index * h), q)
    frac = np.where(top, 0.0, frac)
    index = np.concatenate([lower, lower + 1])
    weights = np.concatenate([1 - frac, frac])
    inside = (index >= min_index) & (index <= max_index)
    index = index[inside] - min_index
    size = max_index - min_index + 1
    big_p = np.bincount(
        index, weights=np.concatenate([p, p])[inside] * weights[inside], minlength=size
    )
    big_q = np.bincount(
        index, weights=np.concatenate([q, q])[inside] * weights[inside], minlength=size
    )
    grid = (min_index + np.arange(size)) * h
    # Everything below is scaled by e^{-l_j} (atom j's grid loss) so that nothing overflows.
    scale_down = np.exp(-grid)
    deficit = big_q - big_p * scale_down  # > 0: the merged loss lies below its grid loss
    donor_p = np.append(big_p[1:], 0.0)
    donor_q = np.append(big_q[1:], 0.0)
    donor_excess = donor_p * scale_down - donor_q  # the next atom's excess at this grid loss
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where((deficit > 0) & (donor_excess > 0), deficit / donor_excess, np.inf)
    borrow = (deficit > 0) & (share <= 1.0)
    share = np.where(borrow, share, 0.0)
    # Donated fractions leave the donors (scaling an atom keeps its loss).
    kept = 1.0 - np.concatenate([[0.0], share[:-1]])
    final_p = big_p * kept + share * donor_p
    final_q = big_q * kept + share * donor_q
    with np.errstate(divide="ignore"):
        pmf = np.where(final_p * scale_down <= final_q, final_p, np.exp(np.log(final_q) + grid))
    fallback = (deficit > 0) & ~borrow
    if fallback.any():
        # Keep the P-mass one grid step lower: its Q-mass rises to P e^{-l_{j-1}} >= Q.
        moved = np.where(fallback, final_p, 0.0)
        pmf = np.where(fallback, 0.0, pmf)
        pmf[:-1] += moved[1:]
    return LossPmf(h, min_index, np.maximum(pmf, 0.0), infinity)


@dataclasses.dataclass(frozen=True)
class _Profile:
    """A PLD's hockey-stick curve at every grid loss l_j of a window (a_j = e^{l_j}).

    ``p``: P-masses; ``v``: V_j = a_j Q[L > l_j]; ``level``: the curve, accurate in absolute
    terms where it is computed from small terms: for l_j >= 0 as
    delta(l_j) = P[L = inf] + sum_{k > j} p_k (1 - e^{l_j - l_k}), for l_j < 0 as
    sum_{k <= j} p_k (e^{l_j - l_k} - 1) = delta(l_j) - (P_total - a_j Q_total), i.e. without
    the part linear in a_j that every pair with the same totals shares.
    """

    p: np.ndarray
    v: np.ndarray
    level: np.ndarray

    @classmethod
    def of(cls, pmf: LossPmf, start: int, size: int) -> _Profile:
        h = pmf.grid_spacing
        p = np.zeros(size)
        p[pmf.offset - start : pmf.offset - start + pmf.pmf.size] = pmf.pmf
        # V_j = e^{-h} (V_{j+1} + p_{j+1}): a stable backward recursion, as in LossPmf.epsilon.
        decay = math.exp(-h)
        v = decay * signal.lfilter([1.0], [1.0, -decay], np.append(p[1:], 0.0)[::-1])[::-1]
        above = np.append(np.cumsum(p[::-1])[::-1][1:], 0.0)
        level = pmf.infinity_mass + np.maximum(above - v, 0.0)
        # Below loss 0: S_{j+1} = e^h S_j + expm1(h) P[L <= l_j], all terms non-negative.
        negative = int(np.count_nonzero((start + np.arange(size)) * h < 0))
        if negative:
            grow = math.exp(h)
            below = math.expm1(h) * np.cumsum(p[: negative - 1])
            tail = signal.lfilter([1.0], [1.0, -grow], np.concatenate([[0.0], below]))
            level[:negative] = tail
        return cls(p, v, level)


def max_profile(first: LossPmf, second: LossPmf, *, certify: bool = True) -> LossPmf:
    """A grid PLD whose delta(eps) is the larger of the two at every grid loss eps.

    With a = e^eps, delta is convex and piecewise linear in a, with kinks at grid losses only;
    the result interpolates max(delta_first, delta_second), a convex function, linearly in a
    between grid losses, which lies above it. So the result dominates both pairs (its tradeoff
    curve is below both: the convex hull of their minimum, up to the grid), and it is again a
    grid PLD: on each grid cell its slope is -Q[L > l_j] of the winner (or the chord where the
    winner changes), and the slope change at a grid loss l_j is its Q-mass, e^{l_j} times that
    its P-mass. For a pair and its reverse this is the symmetrised curve min{f, f^-1}** of
    Dong, Roth, Su 2019 (the C_p(f) of their subsampling theorem, Thm 4.2). Both PLDs must share the
    grid. Below loss 0 the winner is decided by the small terms only, as if the totals were
    equal (for probability pairs they differ by rounding and far-tail mass), and the difference
    of the totals is added to ``error_mass`` (unless ``certify`` is False: for optimistic
    PLDs, whose totals fall short by the mass they drop, the result is then only an estimate).
    """
    h = first.grid_spacing
    if not math.isclose(second.grid_spacing, h, rel_tol=1e-12):
        spacings = sorted({first.grid_spacing, second.grid_spacing})
        raise InvalidParameterError("grid_spacing", "equal for both PLDs", spacings)
    start = min(first.offset, second.offset) - 1
    stop = max(first.offset + first.pmf.size, second.offset + second.pmf.size) + 1
    size = stop - start
    a, b = _Profile.of(first, start, size), _Profile.of(second, start, size)
    gap = a.level - b.level  # delta_first - delta_second at each grid loss
    take_a = gap >= 0
    scale = math.expm1(h)
    # V of the interpolant on the cell [l_j, l_{j+1}]: the winner's own V_j, plus, where the
    # winner changes from X to Y, (delta_X - delta_Y)(l_j) / expm1(h) (the chord).
    winner_next = take_a[1:]
    v = np.where(winner_next, a.v[:-1], b.v[:-1])
    switch = take_a[:-1] != take_a[1:]
    v = v + np.where(switch, np.abs(gap[:-1]) / scale, 0.0)
    v = np.append(v, 0.0)  # nothing lies above the last grid loss
    pmf = np.zeros(size)
    pmf[1:] = math.exp(h) * v[:-1] - v[1:]
    # Where one pmf wins on both sides of a grid loss, its own mass is exact there. The lowest
    # grid loss lies below both supports, where the curves coincide: no mass.
    interior = np.zeros(size, dtype=bool)
    interior[1:-1] = ~switch[:-1] & ~switch[1:]
    pmf = np.where(interior, np.where(take_a, a.p, b.p), pmf)
    pmf[0] = 0.0
    infinity = max(first.infinity_mass, second.infinity_mass)
    # Below loss 0 the winner was chosen as if the totals were equal; a curve there is off by
    # at most the difference of the P totals plus that of the Q totals (a_j < 1): error mass.
    totals = [
        (float(x.pmf.sum()) + x.infinity_mass, float(x.pmf @ np.exp(-x.losses())))
        for x in (first, second)
    ]
    mismatch = abs(totals[0][0] - totals[1][0]) + abs(totals[0][1] - totals[1][1])
    error = max(first.error_mass, second.error_mass) + (mismatch if certify else 0.0)
    return LossPmf(h, start, np.maximum(pmf, 0.0), infinity, error)


def _log_mgf(pmf: LossPmf, order: float) -> float:
    """log E[e^{t L}] of the renormalised finite part at t = ``order``."""
    support = pmf.pmf > 0
    exponents = np.log(pmf.pmf[support] / pmf.pmf.sum()) + order * pmf.losses()[support]
    top = float(exponents.max())
    return top + math.log(float(np.exp(exponents - top).sum()))


def _chernoff_orders(parts: Sequence[tuple[LossPmf, int]]) -> np.ndarray:
    """Tilts near the optimum of the Chernoff bound at :data:`TAIL_MASS` for a Gaussian sum.

    Any tilt gives a valid bound. Heavy right tails (rare large losses of subsampled
    mechanisms) need much smaller tilts than the Gaussian optimum, hence the wide spread.
    """
    variance = 0.0
    for pmf, n in parts:
        weights = pmf.pmf / pmf.pmf.sum()
        losses = pmf.losses()
        mean = float(weights @ losses)
        variance += n * float(weights @ (losses - mean) ** 2)
    centre = math.sqrt(2 * math.log(1 / TAIL_MASS) / max(variance, 1e-300))
    return np.asarray(np.clip(centre * _CHERNOFF_SPREAD, 1e-6, 1e3), dtype=float)


def compose_many(parts: Sequence[tuple[LossPmf, int]]) -> LossPmf:
    """PLD of independently running each ``pmf`` ``count`` times (all on one grid).

    The convolution is computed as a product of discrete Fourier transforms on a window chosen by
    Chernoff bounds so that at most :data:`TAIL_MASS` of the composed (normalised) mass lies
    outside it on either side; that mass may alias into the window and is reported in
    ``error_mass`` together with a floating-point allowance read off negative FFT outputs.
    """
    parts = [(pmf, check_count("count", count)) for pmf, count in parts if count]
    compositions = sum(n for _, n in parts)
    if compositions > MAX_COMPOSITIONS:
        raise InvalidParameterError(
            "steps",
            f"<= {MAX_COMPOSITIONS:.0e} compositions in one PLD: the transform's n-th power "
            "loses about n * 2.2e-16 of relative precision, beyond what the error terms cover "
            "(the rdp accountant answers longer compositions)",
            compositions,
        )
    if not parts:
        return LossPmf(1.0, 0, np.ones(1), 0.0)
    if len(parts) == 1 and parts[0][1] == 1:
        # Nothing to convolve; only the rounding of the discretisation's own sums remains.
        pmf = parts[0][0]
        return dataclasses.replace(pmf, error_mass=pmf.error_mass + FLOAT_ALLOWANCE)
    h = parts[0][0].grid_spacing
    if any(not math.isclose(pmf.grid_spacing, h, rel_tol=1e-12) for pmf, _ in parts):
        spacings = sorted({pmf.grid_spacing for pmf, _ in parts})
        raise InvalidParameterError("grid_spacing", "equal for all composed PLDs", spacings)
    finite_total = math.prod(float(pmf.pmf.sum()) ** n for pmf, n in parts)
    all_total = math.prod(float(pmf.pmf.sum() + pmf.infinity_mass) ** n for pmf, n in parts)
    infinity = max(0.0, all_total - finite_total)
    error = sum(n * pmf.error_mass for pmf, n in parts)
    if finite_total <= 0:
        return LossPmf(h, 0, np.zeros(1), infinity, error)
    # Exact support of the sum, in grid units relative to the summed offsets.
    base = sum(n * pmf.offset for pmf, n in parts)
    full_hi = sum(n * (pmf.pmf.size - 1) for pmf, n in parts)
    lo, hi = 0, full_hi
    tail = 0.0
    if full_hi + 1 > 2**16:
        orders = _chernoff_orders(parts)
        up = np.array([sum(n * _log_mgf(pmf, t) for pmf, n in parts) for t in orders])
        down = np.array([sum(n * _log_mgf(pmf, -t) for pmf, n in parts) for t in orders])
        log_tail = math.log(TAIL_MASS)
        upper = float(np.min((up - log_tail) / orders)) / h - base
        lower = float(np.max((log_tail - down) / orders)) / h - base
        lo, hi = max(0, math.floor(lower)), min(full_hi, math.ceil(upper))
        tail = (2 * TAIL_MASS if (lo > 0 or hi < full_hi) else 0.0) * finite_total
        if hi < lo:
            # The two tail bounds overlap (huge counts, where n * log E[e^{tL}] has lost its
            # precision): no window is certified, so all the finite mass is counted as error,
            # added to delta for upper bounds and taken from it for lower bounds.
            return LossPmf(h, 0, np.zeros(1), infinity, error + finite_total)
    if hi - lo + 1 > MAX_COMPOSED_POINTS:
        steps = sum(n for _, n in parts)
        raise ResourceLimitError(
            "steps",
            f"few enough that the composed PLD fits in {MAX_COMPOSED_POINTS:,} grid points of "
            f"{h:g} (it needs {hi - lo + 1:.3g}); a coarser grid (value_discretization_"
            "interval) or another accountant answers such compositions",
            steps,
        )
    size = fft.next_fast_len(hi - lo + 1, real=True)
    spectrum = np.ones(size // 2 + 1, dtype=complex)
    for pmf, n in parts:
        folded = np.bincount(np.arange(pmf.pmf.size) % size, weights=pmf.pmf, minlength=size)
        spectrum *= fft.rfft(folded) ** n
    values = fft.irfft(spectrum, n=size)
    # Composite index s (relative to base) sits at position s mod size; read the window [lo, hi].
    values = np.roll(values, -(lo % size))[: hi - lo + 1]
    # FFT roundoff shows as negative outputs where the true mass is ~0. Their largest magnitude
    # estimates the noise amplitude; every entry may carry that much (an estimate, not a proof).
    # It puts a floor of roughly 1e-13..1e-11 under the deltas this module can certify: below
    # it the upper bound becomes infinite rather than wrong.
    roundoff = max(float(-values.min(initial=0.0)) * values.size, FLOAT_ALLOWANCE)
    pmf_out = np.maximum(values, 0.0)
    return LossPmf(h, base + lo, pmf_out, infinity, error + tail + roundoff)
