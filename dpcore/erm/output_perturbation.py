"""Output perturbation for L2-regularised ERM (CMS 2011, Alg. 1; Dwork et al. 2006).

If ell is convex and differentiable with |ell'| <= L and ||x_i|| <= 1, the minimiser w*(D) of
J(w) = (1/n) sum ell(y_i w^T x_i) + (lambda/2)||w||^2 has L2 sensitivity at most 2L/(n lambda)
(CMS 2011, Corollary 8, for L = 1; the proof scales linearly in L): changing one example moves
the gradient of the lambda-strongly convex J by at most 2L/n. Releasing w* + b with density of
b proportional to exp(-(n lambda epsilon / (2L)) ||b||) is then epsilon-DP (CMS Thm 6). The
Gaussian variant releases w* + N(0, sigma^2 I) with sigma the analytic Gaussian calibration at
that sensitivity (Balle & Wang 2018), (epsilon, delta)-DP for every epsilon > 0.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from dpcore.erm.losses import MarginLoss
from dpcore.erm.noise import analytic_gaussian_sigma, finite_noise, sample_norm_laplace
from dpcore.erm.objective import (
    check_dataset,
    check_loss,
    check_regularisation,
    check_rng,
    minimise,
)
from dpcore.erm.release import PrivateModel
from dpcore.errors import InvalidParameterError
from dpcore.validation import check_count, check_delta, check_positive

__all__ = ["minimiser_sensitivity", "output_perturbation"]


def minimiser_sensitivity(*, n: int, regularisation: float, lipschitz: float = 1.0) -> float:
    """2 L / (n lambda): L2 sensitivity of the regularised minimiser (CMS 2011, Cor. 8).

    >>> minimiser_sensitivity(n=100, regularisation=0.01)
    2.0
    """
    count = check_count("n", n, minimum=1)
    lam = check_regularisation(regularisation)
    lip = check_positive("lipschitz", lipschitz)
    # In numpy floats: overflow gives inf (a valid, if useless, bound), never an exception.
    # Divided one factor at a time (n lambda alone can overflow); rounded up below the normal
    # range, so that a sensitivity is never rounded to 0 (no noise).
    with np.errstate(over="ignore", under="ignore"):
        value = float(np.float64(lip) / np.float64(count) / np.float64(lam) * 2.0)
    return value if value >= sys.float_info.min else math.nextafter(value, math.inf)


def output_perturbation(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    loss: MarginLoss,
    regularisation: float,
    epsilon: float,
    delta: float | None = None,
    rng: np.random.Generator,
) -> PrivateModel:
    """Release w*(D) + b (CMS 2011, Alg. 1).

    Args:
        features: (n, d) with every row norm <= 1 (rejected otherwise, naming the row).
        labels: n labels in {-1, +1}.
        loss: a convex margin loss with Lipschitz constant L (differentiable).
        regularisation: lambda > 0.
        epsilon: > 0.
        delta: None for the epsilon-DP norm-Laplace noise (CMS Thm 6); a value in (0, 1) for
            the (epsilon, delta)-DP Gaussian noise with analytic calibration.
        rng: the source of the noise.

    Example:
        >>> from dpcore.erm.losses import LogisticLoss
        >>> x = np.array([[0.6, 0.8], [-0.6, -0.8], [1.0, 0.0]]); y = np.array([1.0, -1, 1])
        >>> model = output_perturbation(x, y, loss=LogisticLoss(), regularisation=0.1,
        ...                             epsilon=1.0, rng=np.random.default_rng(0))
        >>> model.weights.shape, round(model.sensitivity, 3), round(model.noise_scale, 3)
        ((2,), 6.667, 6.667)
    """
    x, y = check_dataset(features, labels)
    lam = check_regularisation(regularisation)
    eps = check_positive("epsilon", epsilon)
    check_loss(loss)
    check_rng(rng)
    dlt = 0.0 if delta is None else check_delta("delta", delta)
    n, d = x.shape
    sensitivity = minimiser_sensitivity(n=n, regularisation=lam, lipschitz=loss.lipschitz)
    if delta is None:
        with np.errstate(over="ignore"):
            scale = float(np.float64(sensitivity) / np.float64(eps))
        if scale < sys.float_info.min:  # coarse or 0 below the normal range: round up
            scale = math.nextafter(scale, math.inf)
        if not math.isfinite(scale):
            raise InvalidParameterError(
                "epsilon", "large enough for a finite noise scale 2L/(n lambda epsilon)", eps
            )
    else:
        scale = analytic_gaussian_sigma(sensitivity=sensitivity, epsilon=eps, delta=dlt)
    optimum = minimise(x, y, loss=loss, regularisation=lam)
    if delta is None:
        noise = sample_norm_laplace(d, scale=scale, rng=rng)
        mechanism, theorem = "output_perturbation_laplace", "CMS 2011 Alg. 1, Thm 6"
    else:
        noise = finite_noise(np.asarray(scale * rng.standard_normal(d)), eps)
        mechanism = "output_perturbation_gaussian"
        theorem = "CMS 2011 Cor. 8 sensitivity + Balle & Wang 2018 Thm 8"
    return PrivateModel(
        weights=optimum + noise,
        mechanism=mechanism,
        epsilon=eps,
        delta=dlt,
        regularisation=lam,
        extra_regularisation=0.0,
        noise_epsilon=eps,
        noise_scale=scale,
        sensitivity=sensitivity,
        theorem=theorem,
    )
