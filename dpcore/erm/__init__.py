"""Convex private ERM: output and objective perturbation (Chaudhuri, Monteleoni, Sarwate 2011).

* :func:`output_perturbation` -- CMS Alg. 1 (epsilon-DP norm-Laplace noise, Thm 6) and a
  Gaussian (epsilon, delta) variant with the analytic calibration.
* :func:`objective_perturbation` -- CMS Alg. 2 (epsilon-DP, Thm 9);
  :func:`objective_perturbation_gaussian` -- Kifer, Smith, Thakurta 2012 ((epsilon, delta), Thm 2).
* :mod:`dpcore.erm.bounds` -- expected excess empirical risk bounds with constants.
* :mod:`dpcore.erm.median` -- the median example: why Alg. 2 needs strong convexity.

Inputs must have ||x_i|| <= 1 (rows are rejected by index otherwise; see :func:`scale_rows`)
and labels in {-1, +1}; lambda > 0 is required by every mechanism here.
"""

from dpcore.erm.losses import HuberLoss, LogisticLoss, MarginLoss
from dpcore.erm.objective import SolverError, check_dataset, minimise, scale_rows
from dpcore.erm.objective_perturbation import objective_perturbation, objective_perturbation_plan
from dpcore.erm.objective_perturbation_gaussian import objective_perturbation_gaussian
from dpcore.erm.output_perturbation import minimiser_sensitivity, output_perturbation
from dpcore.erm.release import PrivateModel

__all__ = [
    "HuberLoss",
    "LogisticLoss",
    "MarginLoss",
    "PrivateModel",
    "SolverError",
    "check_dataset",
    "minimise",
    "minimiser_sensitivity",
    "objective_perturbation",
    "objective_perturbation_gaussian",
    "objective_perturbation_plan",
    "output_perturbation",
    "scale_rows",
]
