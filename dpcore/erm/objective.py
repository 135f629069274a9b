"""The regularised ERM objective, input checks and its solver.

J(w) = (1/n) sum_i ell(y_i w^T x_i) + (lambda/2) ||w||^2 (CMS 2011, Eq. (1) with N(w) =
||w||^2 / 2), optionally plus a linear term b^T w / n and an extra (Delta/2) ||w||^2 (CMS Alg. 2).

Solver: scipy's L-BFGS-B with exact gradients. The objective is mu-strongly convex with
mu = lambda + Delta > 0, so a point with gradient norm g is within g / mu of the exact minimiser;
:func:`minimise` checks g <= ``gradient_tolerance`` (default 1e-9) after solving, so the solver
error is at most 1e-9 / mu, far below the noise scale 2/(n lambda epsilon) in every use here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize

from dpcore.erm.losses import MarginLoss
from dpcore.errors import DPCoreError, InvalidParameterError
from dpcore.validation import check_positive

__all__ = [
    "SolverError",
    "check_dataset",
    "check_regularisation",
    "gradient",
    "minimise",
    "regularised_risk",
    "scale_rows",
]

#: Rows may exceed norm 1 by this much (floating-point slack of a row scaled to norm 1).
NORM_SLACK = 1e-9


class SolverError(DPCoreError, ArithmeticError):
    """The solver did not reach the gradient tolerance the privacy analysis assumes."""


def scale_rows(features: np.ndarray) -> np.ndarray:
    """Rows divided by max(1, ||x_i||): a per-row (data-independent) map onto the unit ball.

    >>> scale_rows(np.array([[3.0, 4.0], [0.3, 0.4]])).tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    x = _float_array("features", features)
    if x.ndim != 2:
        raise InvalidParameterError("features", "to be a 2-D array", x.shape)
    norms = row_norms(x)[:, None]
    return np.asarray(x / np.maximum(norms, 1.0), dtype=float)


def row_norms(x: np.ndarray) -> np.ndarray:
    """Euclidean norms of the rows of a 2-D array, without overflow or underflow.

    Each row is divided by its largest |entry| first, so rows of 1e300s (whose squares overflow)
    and of subnormals (whose squares vanish) get their norms right; NaN/inf propagate.
    """
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.max(np.abs(x), axis=1, initial=0.0)
        safe = np.where((top > 0) & np.isfinite(top), top, 1.0)
        norms = safe * np.linalg.norm(x / safe[:, None], axis=1)
    return np.asarray(np.where(np.isfinite(top), norms, top), dtype=float)


def _float_array(name: str, values: object) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "to be an array of real numbers", values) from None


def check_loss(loss: object) -> MarginLoss:
    """A :class:`~dpcore.erm.losses.MarginLoss` (its constants enter the privacy analysis)."""
    if not isinstance(loss, MarginLoss):
        raise InvalidParameterError("loss", "to be a MarginLoss", loss)
    return loss


def check_rng(rng: object) -> np.random.Generator:
    """A ``numpy.random.Generator``, the only source of noise the mechanisms accept."""
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError("rng", "to be a numpy.random.Generator", rng)
    return rng


def check_dataset(features: object, labels: object) -> tuple[np.ndarray, np.ndarray]:
    """Validate (X, y): finite 2-D X with every ||x_i|| <= 1, y in {-1, +1} of matching length.

    The norm bound is a hypothesis of every theorem used here (CMS 2011, §2); rows violating it
    are rejected, naming the first such row (use :func:`scale_rows` beforehand).
    """
    x = _float_array("features", features)
    y = _float_array("labels", labels)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise InvalidParameterError("features", "to be a non-empty 2-D array", x.shape)
    if y.shape != (x.shape[0],):
        raise InvalidParameterError("labels", f"to have shape ({x.shape[0]},)", y.shape)
    if not np.all(np.isfinite(x)):
        raise InvalidParameterError("features", "to be finite", "NaN or inf")
    if not np.all((y == 1.0) | (y == -1.0)):
        raise InvalidParameterError("labels", "to be -1 or +1", sorted(set(y.tolist()))[:5])
    norms = row_norms(x)
    bad = np.flatnonzero(norms > 1.0 + NORM_SLACK)
    if bad.size:
        row = int(bad[0])
        raise InvalidParameterError(
            f"||features[{row}]||", "<= 1 (scale rows first, e.g. with scale_rows)", norms[row]
        )
    return x, y


def regularised_risk(
    weights: np.ndarray,
    *,
    features: np.ndarray,
    labels: np.ndarray,
    loss: MarginLoss,
    regularisation: float,
) -> float:
    """J(w) = (1/n) sum_i ell(y_i w^T x_i) + (lambda/2) ||w||^2 (no input checks; hot path)."""
    margins = labels * (features @ weights)
    return float(np.mean(loss.value(margins)) + 0.5 * regularisation * weights @ weights)


def gradient(
    weights: np.ndarray,
    *,
    features: np.ndarray,
    labels: np.ndarray,
    loss: MarginLoss,
    regularisation: float,
) -> np.ndarray:
    """grad J(w) = (1/n) sum_i ell'(y_i w^T x_i) y_i x_i + lambda w."""
    margins = labels * (features @ weights)
    coefficients = loss.derivative(margins) * labels
    return np.asarray(features.T @ coefficients / labels.size + regularisation * weights)


def minimise(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    loss: MarginLoss,
    regularisation: float,
    linear_term: np.ndarray | None = None,
    gradient_tolerance: float = 1e-9,
) -> np.ndarray:
    """argmin_w J(w) + b^T w / n for validated data, with lambda > 0 (strong convexity).

    ``linear_term`` is b (not b / n). ``regularisation`` here is the total quadratic weight
    (lambda + Delta for CMS Alg. 2). Raises :class:`SolverError` when the final gradient norm
    exceeds ``gradient_tolerance``.
    """
    mu = check_positive("regularisation", regularisation)
    tolerance = check_positive("gradient_tolerance", gradient_tolerance)
    n, d = features.shape
    shift = np.zeros(d) if linear_term is None else np.asarray(linear_term, dtype=float) / n

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        value = regularised_risk(
            w, features=features, labels=labels, loss=loss, regularisation=mu
        ) + float(shift @ w)
        step = gradient(w, features=features, labels=labels, loss=loss, regularisation=mu)
        return value, step + shift

    start = -shift / mu  # the minimiser of the quadratic part: a good start
    result = optimize.minimize(
        objective,
        start,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 20_000, "gtol": tolerance / math.sqrt(d), "ftol": 1e-15},
    )
    weights = np.asarray(result.x, dtype=float)
    norm = float(np.linalg.norm(objective(weights)[1]))
    if not norm <= tolerance:
        weights = _newton_polish(weights, objective, features, labels, loss, mu, tolerance / 100)
        norm = float(np.linalg.norm(objective(weights)[1]))
    if not norm <= tolerance:
        raise SolverError(
            f"ERM solver stopped with gradient norm {norm:.3g} > {tolerance:g} "
            f"(solution error up to {norm / mu:.3g})."
        )
    return weights


def _newton_polish(
    weights: np.ndarray,
    objective: Callable[[np.ndarray], tuple[float, np.ndarray]],
    features: np.ndarray,
    labels: np.ndarray,
    loss: MarginLoss,
    mu: float,
    target: float,
) -> np.ndarray:
    """Damped Newton steps with the exact Hessian (1/n) X^T diag(ell'') X + mu I.

    L-BFGS-B can stop on its function-change test with a gradient of 1e-8; a few Newton steps
    take it to ``target``. A step is kept only if it lowers the gradient norm.
    """
    n, d = features.shape
    norm = float(np.linalg.norm(objective(weights)[1]))
    for _ in range(30):
        if norm <= target:
            break
        curvature = loss.second_derivative(labels * (features @ weights))
        hessian = (features.T * curvature) @ features / n + mu * np.eye(d)
        step = np.linalg.solve(hessian, objective(weights)[1])
        for _ in range(40):
            candidate = weights - step
            candidate_norm = float(np.linalg.norm(objective(candidate)[1]))
            if candidate_norm < norm:
                weights, norm = candidate, candidate_norm
                break
            step = step / 2
        else:
            break
    return weights


def check_regularisation(value: object) -> float:
    """lambda > 0: the strong convexity the sensitivity and privacy theorems need."""
    return check_positive("regularisation", value)
