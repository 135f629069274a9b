"""Accountants: turn events into (epsilon, delta) guarantees, one module per method."""

from dpcore.accountants.base import (
    Approximate,
    EstimateKind,
    NeighboringRelation,
    PrivacyAccountant,
    accountant_class,
)

__all__ = [
    "Approximate",
    "EstimateKind",
    "NeighboringRelation",
    "PrivacyAccountant",
    "accountant_class",
]
