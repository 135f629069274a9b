"""Convex private ERM (Chaudhuri, Monteleoni, Sarwate 2011) measured against its bounds.

``compute(profile)`` runs both parts (excess risk on real data, the median audit) and saves
their results; ``plot()`` draws the figures from the saved files only.
"""

from __future__ import annotations

from reproductions.erm import excess_risk, median_audit
from reproductions.harness import Executor, Output


def compute(profile: str, *, output: Output | None = None, executor: Executor = None) -> None:
    """Compute and save both parts at the given profile (``quick`` or ``full``) to ``output``
    (default: figures/), their runs through :func:`dpcore.runs.run_many` on ``executor`` (None or
    ``"local"``: here, one after another)."""
    median_audit.compute(profile, output=output, executor=executor)
    excess_risk.compute(profile, output=output, executor=executor)


def plot(*, output: Output | None = None) -> None:
    """Draw both figures from the results saved in ``output`` (default: figures/)."""
    median_audit.plot(output=output)
    excess_risk.plot(output=output)
