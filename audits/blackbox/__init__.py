"""Black-box and hidden-state membership-inference audits of DP-SGD's final model.

Multi-run (:mod:`audits.blackbox.audit`): a target record is trained on (world "in") or not
("out") in N independent DP-SGD trainings per world, by dpcore or by Opacus, of a logistic
regression, an MLP or the MNIST CNN on a 1,000-record MNIST subset (or all 60,000 records); the
auditor sees only the final model's outputs on the target (its loss and logit margin) and turns
the two samples of scores into a lower bound on epsilon at 95 % (:mod:`audits.blackbox.decision`).
The settings that make such audits tight (Annamalai & De Cristofaro 2024) are options:
worst-case initial parameters, a crafted target, full-batch training
(:mod:`audits.blackbox.settings`, :mod:`audits.blackbox.profiles`). Hidden state with a crafted
gradient at a chosen period (:mod:`audits.blackbox.crafted_gradient`) uses the same runs and
decision; one run with designed canaries (:mod:`audits.blackbox.one_run`) bounds epsilon by
Steinke et al.'s Thm 5.2 and the f-DP one-run bound.

``python -m audits --only blackbox|blackbox_crafted|blackbox_one_run --profile quick|full
[--executor processes:2|dask|ray|slurm]``
"""

from __future__ import annotations

from audits.blackbox.audit import CHECKPOINT, run
from audits.blackbox.report import write_report

__all__ = ["CHECKPOINT", "run", "write_report"]
