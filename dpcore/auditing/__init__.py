"""Empirical privacy auditing: statistically valid *lower* bounds on epsilon from attack outcomes.

A sound audit of a correct mechanism never exceeds the accountant's epsilon (beyond its stated
failure probability); a lower bound above a claimed epsilon is evidence of a bug.
"""

from dpcore.auditing.statistics import (
    AuditBound,
    clopper_pearson,
    epsilon_lower_bound,
    gdp_lower_bound,
    one_run_epsilon_lower_bound,
    threshold_sweep_lower_bound,
)

__all__ = [
    "AuditBound",
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_lower_bound",
    "one_run_epsilon_lower_bound",
    "threshold_sweep_lower_bound",
]
