"""The median example: objective perturbation needs strong convexity and smoothness.

Private location estimation: minimise (1/n) sum_i ell(w - x_i) + b w / n over w. With the
absolute loss ell(u) = |u| and no regulariser (lambda = 0) the objective is piecewise linear, its
slope on (x_(1), x_(2)) for D = {0, 100} is b/n, so for -2 < b < 0 the minimiser is the data
point 100 itself, and for D' = {0, 101} it is 101. The released value then names the dataset:
P[output = 101 | D] = 0 while P[output = 101 | D'] = P[-2 < b < 0] > 0, so no epsilon works
(for delta below that probability), whatever the noise scale. We restrict w to [-R, R] so a
minimiser always exists (for |b| >= 2 it is an endpoint, the same for D and D').

The correct variant meets CMS 2011 Thm 9's conditions: the Huber-smoothed absolute loss
ell_h(u) = u^2/(2h) for |u| <= h, |u| - h/2 otherwise (|ell'| <= 1, ell'' <= c = 1/h), plus
(lambda/2) w^2 with lambda > 0, and CMS Alg. 2's epsilon split. CMS's proof only uses that each
example's gradient has norm <= 1 and its Hessian is rank one with eigenvalue <= c, which holds
here (the gradient of ell_h(w - x) in w is ell_h'(w - x), whatever x), so it is epsilon-DP.
"""

from __future__ import annotations

import numpy as np

from dpcore.erm.noise import sample_norm_laplace
from dpcore.erm.objective import check_rng
from dpcore.erm.objective_perturbation import objective_perturbation_plan
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_allocation, check_count, check_positive

__all__ = ["naive_median_release", "smooth_median_release"]


def _data(data: object) -> np.ndarray:
    try:
        values = np.asarray(data, dtype=float)
    except (TypeError, ValueError):
        raise InvalidParameterError("data", "to be an array of real numbers", data) from None
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise InvalidParameterError("data", "to be a non-empty 1-D array of finite values", data)
    return values


def naive_median_release(
    data: object,
    *,
    epsilon: float,
    domain_radius: float = 1e3,
    rng: np.random.Generator,
    size: int,
) -> np.ndarray:
    """``size`` releases of argmin_{|w| <= R} (1/n) sum |w - x_i| + b w / n, b ~ Laplace(2/eps).

    The noise is what CMS Alg. 2 would add if its conditions were ignored (c = 0, Delta = 0,
    epsilon' = epsilon): NOT differentially private (see the module docstring).
    """
    x = _data(data)
    eps = check_positive("epsilon", epsilon)
    radius = check_positive("domain_radius", domain_radius)
    if np.max(np.abs(x)) >= radius:
        raise InvalidParameterError("domain_radius", f"> max |x_i| = {np.max(np.abs(x))}", radius)
    count = check_count("size", size, minimum=1)
    check_rng(rng)
    check_allocation("data", x.size, elements=float(x.size + 2) * x.size)
    check_allocation("size", count, elements=float(count) * (x.size + 2))
    scale = 2.0 / eps
    if not np.isfinite(scale):
        raise InvalidParameterError("epsilon", "large enough for a finite noise scale", eps)
    b = sample_norm_laplace(1, scale=scale, rng=rng, size=count)[:, 0]
    # A convex piecewise-linear function on [-R, R] attains its minimum at a breakpoint.
    candidates = np.concatenate([x, [-radius, radius]])
    data_term = np.abs(candidates[:, None] - x[None, :]).mean(axis=1)
    objective = data_term[None, :] + b[:, None] * candidates[None, :] / x.size
    return np.asarray(candidates[np.argmin(objective, axis=1)], dtype=float)


def smooth_median_release(
    data: object,
    *,
    epsilon: float,
    regularisation: float,
    huber_width: float,
    rng: np.random.Generator,
    size: int,
) -> np.ndarray:
    """``size`` epsilon-DP releases of CMS Alg. 2 on the Huber-smoothed median objective.

    Minimises (1/n) sum ell_h(w - x_i) + ((lambda + Delta)/2) w^2 + b w / n, with epsilon',
    Delta from :func:`~dpcore.erm.objective_perturbation.objective_perturbation_plan` at
    c = 1/h, by bisection on the (strictly increasing) derivative to 1e-9 relative accuracy.
    """
    x = _data(data)
    lam = check_positive("regularisation", regularisation)
    h = check_positive("huber_width", huber_width)
    if not np.isfinite(1.0 / h):
        raise InvalidParameterError("huber_width", "large enough that 1/h is finite", h)
    count = check_count("size", size, minimum=1)
    check_rng(rng)
    check_allocation("size", count, elements=float(count) * x.size)
    plan = objective_perturbation_plan(
        epsilon=epsilon, n=x.size, regularisation=lam, smoothness=1.0 / h
    )
    mu = lam + plan.extra_regularisation
    b = sample_norm_laplace(1, scale=plan.noise_scale, rng=rng, size=count)[:, 0]

    def derivative(w: np.ndarray) -> np.ndarray:
        slopes = np.clip((w[:, None] - x[None, :]) / h, -1.0, 1.0).mean(axis=1)
        return np.asarray(slopes + mu * w + b / x.size)

    bound = (1.0 + np.abs(b) / x.size) / mu  # |w| <= bound at the root
    low, high = -bound, bound.copy()
    for _ in range(80):
        middle = 0.5 * (low + high)
        positive = derivative(middle) > 0
        high = np.where(positive, middle, high)
        low = np.where(positive, low, middle)
    return np.asarray(0.5 * (low + high), dtype=float)
