"""The reproduction harness: one run store, one training loop, one evaluator, one output context.

Every reproduction describes a run by a frozen spec, executes it with :func:`run_training` over a
:class:`Trainable` (a DP trainer or :class:`NonPrivateTrainer`) into a :class:`RunState` under
its :class:`Output` (a resumable run in a :class:`dpcore.runs.RunStore`), and saves results with
:meth:`Output.save_results`. Privacy numbers come from
:func:`dpcore.accountants.report.epsilon_report`.

The training names (which need torch) load on first use, so :class:`Output`, :class:`RunState`
also work where torch is not installed (the TF Privacy environment). Runs fan out through
:func:`dpcore.runs.run_many`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from reproductions.harness.output import ROOT, Output
from reproductions.harness.store import RunState, TrainingSpec

if TYPE_CHECKING:
    from reproductions.harness.training import (
        NonPrivateTrainer,
        Trainable,
        cpu_settings,
        evaluate,
        expected_rating,
        hardware_label,
        run_training,
    )

_TRAINING = (
    "NonPrivateTrainer",
    "Trainable",
    "cpu_settings",
    "evaluate",
    "expected_rating",
    "hardware_label",
    "run_training",
)

__all__ = [
    "ROOT",
    "NonPrivateTrainer",
    "Output",
    "RunState",
    "Trainable",
    "TrainingSpec",
    "cpu_settings",
    "evaluate",
    "expected_rating",
    "hardware_label",
    "run_training",
]


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        return getattr(importlib.import_module("reproductions.harness.training"), name)
    raise AttributeError(f"module 'reproductions.harness' has no attribute {name!r}")
