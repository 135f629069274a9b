"""An independent hockey-stick oracle for the pair tests: mpmath quadrature."""

from __future__ import annotations

import mpmath


def hockey_stick(p_pdf, q_pdf, epsilon: float, points: list[float]) -> float:  # type: ignore[no-untyped-def]
    """The integral of (p - e^eps q)_+ by mpmath quadrature (30 digits).

    The integrand has a kink where p = e^eps q; that point is located by bisection on the pdf
    difference (the likelihood ratios here are monotone) and given to the quadrature with
    ``points``, the other places where the densities are not smooth.
    """
    mpmath.mp.dps = 30
    gap = lambda x: p_pdf(x) - mpmath.e**epsilon * q_pdf(x)  # noqa: E731
    low, high = mpmath.mpf(-60), mpmath.mpf(60)
    if gap(low) * gap(high) < 0:
        for _ in range(200):
            middle = (low + high) / 2
            low, high = (middle, high) if gap(middle) * gap(low) > 0 else (low, middle)
        points = sorted([*points, float(low)])
    integrand = lambda x: max(gap(x), 0)  # noqa: E731
    return float(mpmath.quad(integrand, [-mpmath.inf, *points, mpmath.inf]))
