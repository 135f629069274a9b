"""Accountants: turn events into (epsilon, delta) guarantees, one module per method.

Importing this package registers all six accountants under their names (``basic``,
``advanced``, ``moments``, ``rdp``, ``gdp_clt``, ``pld``) for :func:`accountant_class`.
"""

from dpcore.accountants.advanced import AdvancedCompositionAccountant
from dpcore.accountants.base import (
    Approximate,
    EstimateKind,
    NeighboringRelation,
    PrivacyAccountant,
    accountant_class,
)
from dpcore.accountants.basic import BasicCompositionAccountant
from dpcore.accountants.gdp_clt import GdpCltAccountant
from dpcore.accountants.moments import MomentsAccountant
from dpcore.accountants.pld import DeltaInterval, EpsilonInterval, PldAccountant
from dpcore.accountants.rdp import RdpAccountant

#: Every accountant, in the order the CLI prints them.
ACCOUNTANT_NAMES = ("basic", "advanced", "moments", "rdp", "gdp_clt", "pld")

__all__ = [
    "ACCOUNTANT_NAMES",
    "AdvancedCompositionAccountant",
    "Approximate",
    "BasicCompositionAccountant",
    "DeltaInterval",
    "EpsilonInterval",
    "EstimateKind",
    "GdpCltAccountant",
    "MomentsAccountant",
    "NeighboringRelation",
    "PldAccountant",
    "PrivacyAccountant",
    "RdpAccountant",
    "accountant_class",
]
