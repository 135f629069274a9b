"""Multi-run black-box membership-inference audits of the final model of DP-SGD.

A target record is trained on (world "in") or not ("out") in N independent DP-SGD trainings
per world on a 1,000-record MNIST subset; the auditor sees only the final model's outputs on
the target (its loss and logit margin) and turns the two samples of scores into a lower bound
on epsilon at 95 % (:mod:`audits.blackbox.decision`). The settings that make such audits tight
(Annamalai & De Cristofaro 2024) are options: worst-case initial parameters, a crafted target,
full-batch training (:mod:`audits.blackbox.settings`, :mod:`audits.blackbox.profiles`).

``python -m audits --only blackbox --profile quick|full [--executor processes:2|dask|ray|slurm]``
"""

from __future__ import annotations

from audits.blackbox.audit import run
from audits.blackbox.report import write_report

__all__ = ["run", "write_report"]
