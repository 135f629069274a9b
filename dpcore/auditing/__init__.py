"""Empirical privacy auditing: statistically valid *lower* bounds on epsilon from attack outcomes.

A sound audit of a correct mechanism never exceeds the accountant's epsilon (beyond its stated
failure probability); a lower bound above a claimed epsilon is evidence of a bug.
"""

from dpcore.auditing.implementation import AuditTask, Claim, Implementation, Observer
from dpcore.auditing.implementation_audits import (
    AuditNotApplicableError,
    AuditSettings,
    audit_implementation,
    one_run_audit,
    sampler_audit,
    whitebox_audit,
)
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
    "AuditNotApplicableError",
    "AuditSettings",
    "AuditTask",
    "Claim",
    "Implementation",
    "Observer",
    "audit_implementation",
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_lower_bound",
    "one_run_audit",
    "one_run_epsilon_lower_bound",
    "sampler_audit",
    "threshold_sweep_lower_bound",
    "whitebox_audit",
]
