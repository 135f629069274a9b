"""The reproduction harness: one run store, one training loop, one evaluator, one output context.

Every reproduction describes a run by a frozen spec, executes it with :func:`run_training` over a
:class:`Trainable` (a DP trainer or :class:`NonPrivateTrainer`) into a :class:`RunState` under
its :class:`Output` (a resumable run in a :class:`dpcore.runs.RunStore`), and saves results with
:meth:`Output.save_results`. Privacy numbers come from
:func:`dpcore.accountants.report.epsilon_report`.

The training names (which need torch) load on first use, so :class:`Output`, :class:`RunState`
also work where torch is not installed (the TF Privacy environment). Runs fan out through
:func:`dpcore.runs.run_many` on the executor a reproduction is given (:func:`fanning_out`,
described in its results by :func:`spread`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from reproductions.harness.fanout import Executor, fanned_store, fanning_out, spread
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
        torch_seeded,
    )

_TRAINING = (
    "NonPrivateTrainer",
    "Trainable",
    "cpu_settings",
    "evaluate",
    "expected_rating",
    "hardware_label",
    "run_training",
    "torch_seeded",
)

__all__ = [
    "ROOT",
    "Executor",
    "NonPrivateTrainer",
    "Output",
    "RunState",
    "Trainable",
    "TrainingSpec",
    "cpu_settings",
    "evaluate",
    "expected_rating",
    "fanned_store",
    "fanning_out",
    "hardware_label",
    "run_training",
    "spread",
    "torch_seeded",
]


def __getattr__(name: str) -> Any:
    if name in _TRAINING:
        return getattr(importlib.import_module("reproductions.harness.training"), name)
    raise AttributeError(f"module 'reproductions.harness' has no attribute {name!r}")
