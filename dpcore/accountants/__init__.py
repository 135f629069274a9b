"""Accountants: turn events into (epsilon, delta) guarantees, one module per method.

Importing this package registers all seven accountants under their names (``basic``,
``advanced``, ``moments``, ``rdp``, ``gdp_clt``, ``pld``, ``jl``) for :func:`accountant_class`.
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
from dpcore.accountants.jl import JlAccountant
from dpcore.accountants.moments import MomentsAccountant
from dpcore.accountants.pld import DeltaInterval, EpsilonInterval, PldAccountant
from dpcore.accountants.rdp import RdpAccountant

#: The accountants of DP-SGD, in the order the CLI prints them.
ACCOUNTANT_NAMES = ("basic", "advanced", "moments", "rdp", "gdp_clt", "pld")
#: Every accountant: the above and ``jl`` (DP-SGD-JL steps, PLD accounting for the others).
ALL_ACCOUNTANT_NAMES = (*ACCOUNTANT_NAMES, "jl")

__all__ = [
    "ACCOUNTANT_NAMES",
    "ALL_ACCOUNTANT_NAMES",
    "AdvancedCompositionAccountant",
    "Approximate",
    "BasicCompositionAccountant",
    "DeltaInterval",
    "EpsilonInterval",
    "EstimateKind",
    "GdpCltAccountant",
    "JlAccountant",
    "MomentsAccountant",
    "NeighboringRelation",
    "PldAccountant",
    "PrivacyAccountant",
    "RdpAccountant",
    "accountant_class",
]
