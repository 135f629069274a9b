"""Convex private ERM (Chaudhuri, Monteleoni, Sarwate 2011) measured against its bounds.

``compute(profile)`` runs both parts (excess risk on real data, the median audit) and saves
their results; ``plot()`` draws the figures from the saved files only.
"""

from __future__ import annotations

from reproductions.erm import excess_risk, median_audit


def compute(profile: str) -> None:
    """Compute and save both parts at the given profile (``quick`` or ``full``)."""
    median_audit.compute(profile)
    excess_risk.compute(profile)


def plot() -> None:
    """Draw both figures from the saved results."""
    median_audit.plot()
    excess_risk.plot()
