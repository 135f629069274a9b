"""Expected excess empirical risk bounds for the private ERM mechanisms, with constants.

Let J be the regularised objective of :mod:`dpcore.erm.objective` and w* its minimiser. Both
bounds follow from two facts: J is (c + lambda)-smooth (its Hessian is
(1/n) sum ell'' x x^T + lambda I with ell'' <= c and ||x|| <= 1) and lambda-strongly convex.

* Output perturbation (CMS 2011, Alg. 1): since grad J(w*) = 0,
  J(w* + b) - J(w*) <= ((c + lambda)/2) ||b||^2, so the expected excess is at most
  ((c + lambda)/2) E||b||^2, with E||b||^2 = d (d + 1) s^2 for norm-Laplace noise of scale
  s = 2L/(n lambda epsilon) and d sigma^2 for Gaussian noise.
* Objective perturbation (CMS 2011, Alg. 2): with mu = lambda + Delta, H = J + (Delta/2)||.||^2
  and w_p = argmin H + b^T w / n, strong convexity gives H(w_p) - min H <= ||b||^2 / (2 n^2 mu),
  and J <= H, H(w*) = J(w*) + (Delta/2)||w*||^2, so
  J(w_p) - J(w*) <= ||b||^2 / (2 n^2 mu) + (Delta/2) ||w*||^2, with E||b||^2 = d(d+1)(2/eps')^2.

CMS 2011 state high-probability versions of these (factors log(d/delta) in place of the
moments; their Section 5), giving the rates O(d^2 / (n^2 lambda^2 epsilon^2)) (times c + lambda)
for Alg. 1 against O(d^2 / (n^2 lambda epsilon^2)) for Alg. 2 when Delta = 0: objective
perturbation's noise costs a factor 1/lambda less. These are bounds on the regularised empirical
risk J at the same lambda; the bias J(w*_lambda) - min_w J_0(w) is not included.
"""

from __future__ import annotations

import math
import sys

from dpcore.erm.noise import analytic_gaussian_sigma
from dpcore.erm.objective import check_regularisation
from dpcore.erm.objective_perturbation import objective_perturbation_plan
from dpcore.erm.output_perturbation import minimiser_sensitivity
from dpcore.validation import check_count, check_delta, check_non_negative, check_positive

__all__ = ["objective_perturbation_excess_risk", "output_perturbation_excess_risk"]

_LOG_LARGEST = math.log(sys.float_info.max)


def output_perturbation_excess_risk(
    *,
    n: int,
    dimension: int,
    regularisation: float,
    epsilon: float,
    smoothness: float,
    lipschitz: float = 1.0,
    delta: float | None = None,
) -> float:
    """Upper bound on E[J(w* + b)] - J(w*) for :func:`~dpcore.erm.output_perturbation`.

    ((c + lambda)/2) E||b||^2: d(d+1) s^2 with s = 2L/(n lambda epsilon) (epsilon-DP), or
    d sigma^2 with the analytic Gaussian sigma (``delta`` given).

    >>> round(output_perturbation_excess_risk(n=100, dimension=1, regularisation=0.1,
    ...                                       epsilon=1.0, smoothness=0.25), 6)
    0.014
    """
    d = check_count("dimension", dimension, minimum=1)
    lam = check_regularisation(regularisation)
    c = check_non_negative("smoothness", smoothness)
    eps = check_positive("epsilon", epsilon)
    sensitivity = minimiser_sensitivity(n=n, regularisation=lam, lipschitz=lipschitz)
    if delta is None:
        # log of d (d + 1) s^2 with s = 2L/(n lambda epsilon), from its factors (no overflow).
        lip = check_positive("lipschitz", lipschitz)
        log_scale = math.log(2 * lip) - math.log(n) - math.log(lam) - math.log(eps)
        log_moment = math.log(d) + math.log(d + 1) + 2 * log_scale
    else:
        sigma = analytic_gaussian_sigma(
            sensitivity=sensitivity, epsilon=eps, delta=check_delta("delta", delta)
        )
        log_moment = math.log(d) + 2 * math.log(sigma)
    return _exp(math.log(0.5) + math.log(c + lam) + log_moment)


def objective_perturbation_excess_risk(
    *,
    n: int,
    dimension: int,
    regularisation: float,
    epsilon: float,
    smoothness: float,
    optimum_norm: float = 0.0,
) -> float:
    """Upper bound on E[J(w_p)] - J(w*) for :func:`~dpcore.erm.objective_perturbation`.

    d(d+1)(2/epsilon')^2 / (2 n^2 (lambda + Delta)) + (Delta/2) ||w*||^2, with epsilon' and Delta
    from CMS Alg. 2; ``optimum_norm`` is ||w*|| (only needed when Delta > 0; ||w*||^2 <=
    2 ell(0) / lambda always holds).

    >>> round(objective_perturbation_excess_risk(n=100, dimension=1, regularisation=0.1,
    ...                                          epsilon=1.0, smoothness=0.25), 6)
    0.004426
    """
    d = check_count("dimension", dimension, minimum=1)
    plan = objective_perturbation_plan(
        epsilon=epsilon, n=n, regularisation=regularisation, smoothness=smoothness
    )
    norm = check_non_negative("optimum_norm", optimum_norm)
    mu = regularisation + plan.extra_regularisation
    noise_part = _exp(
        math.log(d)
        + math.log(d + 1)
        + 2 * math.log(plan.noise_scale)
        - math.log(2)
        - 2 * math.log(n)
        - math.log(mu)
    )
    bias_part = (
        _exp(math.log(0.5 * plan.extra_regularisation) + 2 * math.log(norm))
        if (plan.extra_regularisation > 0 and norm > 0)
        else 0.0
    )
    return noise_part + bias_part


def _exp(log_value: float) -> float:
    """e^log_value, inf beyond the float range (an upper bound stays an upper bound)."""
    return math.exp(log_value) if log_value < _LOG_LARGEST else math.inf
