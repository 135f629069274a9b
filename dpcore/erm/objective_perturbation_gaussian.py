"""Objective perturbation with Gaussian noise, (epsilon, delta)-DP (Kifer, Smith, Thakurta 2012).

KST 2012 ("Private Convex Empirical Risk Minimization and High-dimensional Regression", COLT),
Alg. 1 and Thm 2: for a convex loss whose per-example gradient norm is at most zeta and whose
Hessian has rank at most one with eigenvalue at most lambda_s, release

    argmin_w (1/n) sum_i ell(y_i w^T x_i) + r(w) + (Delta / (2n)) ||w||^2 + b^T w / n,

with ``Delta >= 2 lambda_s / epsilon`` and ``b ~ N(0, zeta^2 (8 log(2/delta) + 4 epsilon) /
epsilon^2 I)``. For the margin losses here with ||x|| <= 1: zeta = L = 1 and lambda_s = c (the
Hessian is ell'' x x^T). With our regulariser r(w) = (lambda/2)||w||^2, the quadratic weight
actually used is lambda + Delta/n, where Delta is the smallest value the theorem allows.
The Huber loss is only once differentiable; as for CMS Alg. 2 it relies on the limiting
argument (CMS 2011, Cor. 11), stated rather than hidden.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from dpcore.erm.losses import MarginLoss
from dpcore.erm.noise import finite_noise
from dpcore.erm.objective import (
    check_dataset,
    check_loss,
    check_regularisation,
    check_rng,
    minimise,
)
from dpcore.erm.release import PrivateModel
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_delta, check_positive

__all__ = ["gaussian_objective_noise", "objective_perturbation_gaussian"]


def gaussian_objective_noise(*, epsilon: float, delta: float, lipschitz: float = 1.0) -> float:
    """sigma = zeta sqrt(8 log(2/delta) + 4 epsilon) / epsilon (KST 2012, Alg. 1, line 5).

    >>> round(gaussian_objective_noise(epsilon=1.0, delta=1e-5), 4)
    10.0821
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    zeta = check_positive("lipschitz", lipschitz)
    # log(2) - log(delta): 2 / delta overflows for subnormal delta.
    sigma = zeta * math.sqrt(8 * (math.log(2) - math.log(dlt)) + 4 * eps) / eps
    if sigma < sys.float_info.min:  # coarse or 0 below the normal range: round up
        sigma = math.nextafter(sigma, math.inf)
    if not math.isfinite(sigma):
        raise InvalidParameterError(
            "epsilon", f"large enough for a finite noise scale (lipschitz {zeta!r})", eps
        )
    return sigma


def objective_perturbation_gaussian(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    loss: MarginLoss,
    regularisation: float,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
) -> PrivateModel:
    """(epsilon, delta)-DP objective perturbation with Gaussian b (KST 2012, Alg. 1, Thm 2).

    Args:
        features: (n, d) with every row norm <= 1 (rejected otherwise, naming the row).
        labels: n labels in {-1, +1}.
        loss: a margin loss with |ell'| <= 1 and |ell''| <= ``loss.smoothness``.
        regularisation: lambda > 0.
        epsilon: > 0.
        delta: in (0, 1).
        rng: the source of the noise.

    Example:
        >>> from dpcore.erm.losses import LogisticLoss
        >>> x = np.array([[0.6, 0.8], [-0.6, -0.8], [1.0, 0.0]]); y = np.array([1.0, -1, 1])
        >>> model = objective_perturbation_gaussian(x, y, loss=LogisticLoss(),
        ...     regularisation=0.1, epsilon=1.0, delta=1e-5, rng=np.random.default_rng(0))
        >>> model.mechanism, round(model.extra_regularisation, 4), round(model.noise_scale, 3)
        ('objective_perturbation_gaussian', 0.1667, 10.082)
    """
    x, y = check_dataset(features, labels)
    lam = check_regularisation(regularisation)
    check_loss(loss)
    check_rng(rng)
    if loss.lipschitz > 1.0:
        raise InvalidParameterError(
            "loss.lipschitz", "<= 1 (KST 2012 Thm 2 with zeta = 1)", loss.lipschitz
        )
    n, d = x.shape
    sigma = gaussian_objective_noise(epsilon=epsilon, delta=delta, lipschitz=1.0)
    big_delta = 2 * loss.smoothness / epsilon  # the smallest Delta KST Thm 2 allows
    extra = big_delta / n
    if not math.isfinite(lam + extra):
        raise InvalidParameterError(
            "epsilon", "large enough for a finite Delta = 2 c / epsilon (KST Thm 2)", epsilon
        )
    noise: np.ndarray = finite_noise(sigma * rng.standard_normal(size=(d,)), epsilon)
    weights = minimise(x, y, loss=loss, regularisation=lam + extra, linear_term=noise)
    return PrivateModel(
        weights=weights,
        mechanism="objective_perturbation_gaussian",
        epsilon=float(epsilon),
        delta=float(delta),
        regularisation=lam,
        extra_regularisation=extra,
        noise_epsilon=float(epsilon),
        noise_scale=sigma,
        sensitivity=None,
        theorem="KST 2012 Alg. 1, Thm 2",
    )
