"""Objective perturbation (Chaudhuri, Monteleoni, Sarwate 2011, Alg. 2 and Thm 9).

Conditions (CMS Thm 9): the regulariser is lambda/2 ||w||^2 with lambda > 0; ell is convex and
twice differentiable with |ell'| <= 1 and |ell''| <= c; ||x_i|| <= 1. The epsilon split
(Alg. 2): epsilon' = epsilon - log(1 + 2c/(n lambda) + c^2/(n^2 lambda^2)); if epsilon' > 0 take
Delta = 0, else Delta = c / (n (e^{epsilon/4} - 1)) - lambda and epsilon' = epsilon/2. Draw b with
density proportional to exp(-(epsilon'/2) ||b||) and release
argmin_w J(w) + b^T w / n + (Delta/2) ||w||^2. Logistic regression (c = 1/4) and CMS's Huber loss
(c = 1/(2h)) satisfy the conditions (CMS Corollaries 10 and 11). The Huber loss is only C^1 (ell''
jumps at |1 - z| = h); CMS Cor. 11 covers it by a limiting argument.

Why lambda > 0 (strong convexity) matters: the map b -> w must be a bijection whose Jacobian
ratio between neighbouring datasets is bounded; without strong convexity the minimiser can sit
at a data-dependent kink for a whole interval of b, and privacy fails outright -- see
:mod:`dpcore.erm.median`.

This is the epsilon-DP (norm-Laplace) variant; the (epsilon, delta) Gaussian variant of Kifer,
Smith, Thakurta 2012 is :mod:`dpcore.erm.objective_perturbation_gaussian`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpcore.erm.losses import MarginLoss
from dpcore.erm.noise import sample_norm_laplace
from dpcore.erm.objective import (
    check_dataset,
    check_loss,
    check_regularisation,
    check_rng,
    minimise,
)
from dpcore.erm.release import PrivateModel
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count, check_non_negative, check_positive

__all__ = ["ObjectivePerturbationPlan", "objective_perturbation", "objective_perturbation_plan"]


@dataclasses.dataclass(frozen=True)
class ObjectivePerturbationPlan:
    """The parameters CMS Alg. 2 derives from (epsilon, n, lambda, c).

    ``noise_epsilon`` is epsilon', ``extra_regularisation`` is Delta and ``noise_scale`` is
    2/epsilon', the scale of the norm-Laplace noise b.
    """

    epsilon: float
    noise_epsilon: float
    extra_regularisation: float
    noise_scale: float


def objective_perturbation_plan(
    *, epsilon: float, n: int, regularisation: float, smoothness: float
) -> ObjectivePerturbationPlan:
    """The epsilon split of CMS 2011, Alg. 2.

    >>> plan = objective_perturbation_plan(epsilon=1.0, n=1000, regularisation=0.01,
    ...                                    smoothness=0.25)
    >>> round(plan.noise_epsilon, 6), plan.extra_regularisation
    (0.950615, 0.0)
    >>> plan = objective_perturbation_plan(epsilon=0.1, n=100, regularisation=1e-4,
    ...                                    smoothness=0.25)
    >>> plan.noise_epsilon, round(plan.extra_regularisation, 6)
    (0.05, 0.098655)
    """
    eps = check_positive("epsilon", epsilon)
    count = check_count("n", n, minimum=1)
    lam = check_regularisation(regularisation)
    c = check_non_negative("smoothness", smoothness)
    with np.errstate(over="ignore"):
        ratio = float(np.float64(c) / (np.float64(count) * np.float64(lam)))
    # log(1 + 2r + r^2) = 2 log(1 + r): no overflow of r^2.
    noise_epsilon = eps - 2 * math.log1p(ratio)
    extra = 0.0
    if noise_epsilon <= 0:
        with np.errstate(over="ignore", divide="ignore"):
            growth = np.expm1(np.float64(eps) / 4)
            extra = float(np.float64(c) / (np.float64(count) * np.float64(growth))) - lam
        noise_epsilon = eps / 2
    scale = 2.0 / noise_epsilon if noise_epsilon > 0 else math.inf
    if not (math.isfinite(scale) and math.isfinite(extra)):
        raise InvalidParameterError(
            "epsilon", "large enough that the noise scale 2/epsilon' and Delta are finite", eps
        )
    return ObjectivePerturbationPlan(eps, noise_epsilon, max(extra, 0.0), scale)


def objective_perturbation(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    loss: MarginLoss,
    regularisation: float,
    epsilon: float,
    rng: np.random.Generator,
) -> PrivateModel:
    """Release argmin_w J(w) + b^T w / n + (Delta/2)||w||^2 (CMS 2011, Alg. 2), epsilon-DP.

    Args:
        features: (n, d) with every row norm <= 1 (rejected otherwise, naming the row).
        labels: n labels in {-1, +1}.
        loss: a margin loss with |ell'| <= 1 and |ell''| <= ``loss.smoothness``.
        regularisation: lambda > 0 (CMS Thm 9 needs a strongly convex regulariser).
        epsilon: > 0.
        rng: the source of the noise.

    Example:
        >>> from dpcore.erm.losses import LogisticLoss
        >>> x = np.array([[0.6, 0.8], [-0.6, -0.8], [1.0, 0.0]]); y = np.array([1.0, -1, 1])
        >>> model = objective_perturbation(x, y, loss=LogisticLoss(), regularisation=0.1,
        ...                                epsilon=1.0, rng=np.random.default_rng(0))
        >>> model.mechanism, model.noise_epsilon, round(model.extra_regularisation, 4)
        ('objective_perturbation_laplace', 0.5, 0.1934)
    """
    x, y = check_dataset(features, labels)
    lam = check_regularisation(regularisation)
    check_loss(loss)
    check_rng(rng)
    if loss.lipschitz > 1.0:
        raise InvalidParameterError("loss.lipschitz", "<= 1 (CMS Thm 9)", loss.lipschitz)
    n, d = x.shape
    plan = objective_perturbation_plan(
        epsilon=epsilon, n=n, regularisation=lam, smoothness=loss.smoothness
    )
    noise = sample_norm_laplace(d, scale=plan.noise_scale, rng=rng)
    weights = minimise(
        x, y, loss=loss, regularisation=lam + plan.extra_regularisation, linear_term=noise
    )
    return PrivateModel(
        weights=weights,
        mechanism="objective_perturbation_laplace",
        epsilon=plan.epsilon,
        delta=0.0,
        regularisation=lam,
        extra_regularisation=plan.extra_regularisation,
        noise_epsilon=plan.noise_epsilon,
        noise_scale=plan.noise_scale,
        sensitivity=None,
        theorem="CMS 2011 Alg. 2, Thm 9",
    )
