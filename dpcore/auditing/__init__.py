"""Empirical privacy auditing: statistically valid *lower* bounds on epsilon from attack outcomes.

A sound audit of a correct mechanism never exceeds the accountant's epsilon (beyond its stated
failure probability); a lower bound above a claimed epsilon is evidence of a bug.
"""

from dpcore.auditing.gaussian_scores import gaussian_mu_lower_bound
from dpcore.auditing.implementation import (
    AuditTask,
    Claim,
    Implementation,
    Observer,
    derived_divisor,
    make_mlp_task,
    make_task,
)
from dpcore.auditing.implementation_audits import (
    ONE_RUN_SETTINGS,
    PER_STEP_SETTINGS,
    AuditNotApplicableError,
    AuditSettings,
    audit_implementation,
    audit_seed,
    one_run_audit,
    sampler_audit,
    whitebox_audit,
)
from dpcore.auditing.models import ModelSpec
from dpcore.auditing.multiple_testing import holm, holm_adjusted
from dpcore.auditing.one_run_fdp import one_run_gdp_lower_bound
from dpcore.auditing.statistics import (
    AuditBound,
    clopper_pearson,
    epsilon_lower_bound,
    gdp_lower_bound,
    one_run_epsilon_lower_bound,
    threshold_sweep_lower_bound,
)
from dpcore.auditing.verdicts import AuditReport

__all__ = [
    "ONE_RUN_SETTINGS",
    "PER_STEP_SETTINGS",
    "AuditBound",
    "AuditNotApplicableError",
    "AuditReport",
    "AuditSettings",
    "AuditTask",
    "Claim",
    "Implementation",
    "ModelSpec",
    "Observer",
    "audit_implementation",
    "audit_seed",
    "clopper_pearson",
    "derived_divisor",
    "epsilon_lower_bound",
    "gaussian_mu_lower_bound",
    "gdp_lower_bound",
    "holm",
    "holm_adjusted",
    "make_mlp_task",
    "make_task",
    "one_run_audit",
    "one_run_epsilon_lower_bound",
    "one_run_gdp_lower_bound",
    "sampler_audit",
    "threshold_sweep_lower_bound",
    "whitebox_audit",
]
