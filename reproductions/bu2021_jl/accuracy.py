"""Bu et al. 2021 (arXiv 2102.03013), Fig. 4: MNIST test accuracy vs epochs, DP-SGD vs DP-SGD-JL.

Model: the TensorFlow Privacy tutorial's CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`);
the paper (§5) trains "a convolutional neural network from [TP] tutorial on MNIST", N = 60,000.
Methods: DP-SGD with exact per-example clipping (engine ``"fast"``) and DP-SGD-JL with r = 1, 3,
20 random projections (engine ``"jl"``; the r of Fig. 4). Hyperparameters are the tutorial's
defaults -- learning rate 0.15, noise multiplier 1.1, clipping norm 1.0, lot 256, 60 epochs,
delta = 1e-5 -- because we could not read the paper's own values for this figure (an
assumption, stated in the README). Lots are Poisson (q = 256 / 60,000).

Privacy per method (the events are the same for every seed): the tight PLD interval for DP-SGD
and the JL accountant's interval (Lemma 4.1 / Thm 4.1 of the paper, computed by
:class:`dpcore.accountants.JlAccountant`) for DP-SGD-JL, for the steps run and for the full
60-epoch schedule. :func:`compute` trains every method for several seeds and saves
``figures/bu2021_jl_accuracy.{json,csv}`` and one privacy statement per method; the full profile
is resumable from ``reproductions/checkpoints/bu2021_jl_accuracy/``. :func:`plot` draws mean and
min/max band per method from the saved JSON only.

This module runs the computation; the profiles, data and trainers are in
:mod:`~reproductions.bu2021_jl.accuracy_setup`, the figure and README table in
:mod:`~reproductions.bu2021_jl.accuracy_report`, and the training loop and epsilon intervals it
shares with the summary in :mod:`~reproductions.bu2021_jl.training_loop` and
:mod:`~reproductions.bu2021_jl.privacy_intervals` (all re-exported here).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from dpcore.errors import InvalidParameterError
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.accuracy_report import (
    TABLE_END,
    TABLE_START,
    plot,
    profile_label,
    readme_table,
)
from reproductions.bu2021_jl.accuracy_setup import (
    PROFILES,
    STEM,
    AccuracyConfig,
    Data,
    load_data,
    make_trainer,
    methods,
    spread,
    steps_per_epoch,
)
from reproductions.bu2021_jl.config import CHECKPOINTS as CHECKPOINT_ROOT
from reproductions.bu2021_jl.privacy_intervals import (
    epsilon_interval,
    fmt_interval,
    method_privacy,
    step_event,
)
from reproductions.bu2021_jl.training_loop import (
    Trainable,
    cpu_settings,
    evaluate,
    hardware_label,
    run_training,
)
from reproductions.common import FIGURES, save_results

__all__ = [
    "CHECKPOINTS",
    "PROFILES",
    "STEM",
    "TABLE_END",
    "TABLE_START",
    "AccuracyConfig",
    "Data",
    "Trainable",
    "compute",
    "cpu_settings",
    "epsilon_interval",
    "evaluate",
    "fmt_interval",
    "load_data",
    "make_trainer",
    "method_privacy",
    "methods",
    "plot",
    "profile_label",
    "readme_table",
    "run_training",
    "spread",
    "step_event",
    "steps_per_epoch",
]

CHECKPOINTS = CHECKPOINT_ROOT / STEM


def _slug(label: str) -> str:
    return label.lower().replace(" ", "_").replace("=", "")


def compute(
    profile: str = "quick",
    *,
    data_loader: Callable[[AccuracyConfig], Data] | None = None,
    config: AccuracyConfig | None = None,
) -> None:
    """Train every method for every seed; save rows, per-method summary and privacy statements."""
    config = config or PROFILES[profile]
    device = torch.device(paper.default_device())  # CUDA when present (or $DPCORE_DEVICE)
    data = tuple(part.to(device) for part in (data_loader or load_data)(config))
    with cpu_settings(config.threads):
        _compute(config, data)  # type: ignore[arg-type]


def _compute(config: AccuracyConfig, data: Data) -> None:
    x_train, y_train, x_test, y_test = data
    if len(x_train) != config.dataset_size:
        raise InvalidParameterError("dataset_size", f"to equal {len(x_train)}", config.dataset_size)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    FIGURES.mkdir(parents=True, exist_ok=True)
    for label, r in methods(config):
        finals, seconds = [], []
        statement: dict[str, Any] | None = None
        for seed in config.seeds:
            trainer = make_trainer(config, r, seed, x_train, y_train)
            stem = CHECKPOINTS / config.profile / f"{_slug(label)}_seed{seed}"
            result = run_training(
                trainer,
                (x_test, y_test),
                steps=config.steps,
                eval_every=config.eval_every,
                per_epoch=steps_per_epoch(config),
                fingerprint={"config": dataclasses.asdict(config), "method": label, "seed": seed},
                checkpoint=stem if config.checkpoint else None,
                row={"method": label, "r": r, "seed": seed},
            )
            rows += result["rows"]
            finals.append(result["rows"][-1]["test_accuracy"])
            seconds.append(result["train_seconds"] / config.steps)
            if statement is None:
                statement = trainer.privacy_statement(
                    delta=config.delta,
                    accountants=() if r is not None else ("rdp", "pld"),
                    model="tf_privacy_mnist_cnn (26,010 parameters)",
                    method=label,
                    steps_planned=config.steps,
                )
        assert statement is not None
        privacy = method_privacy(
            step_event(config.lot_size / config.dataset_size, config.noise_multiplier, r),
            jl=r is not None,
            steps=config.steps,
            paper_steps=config.paper_epochs * steps_per_epoch(config),
            delta=config.delta,
            jl_bins=config.jl_bins,
            run_event=trainer.ledger.event() if trainer.steps_done == config.steps else None,
        )
        statement["epsilon_interval"] = privacy
        path = FIGURES / f"{STEM}_{_slug(label)}_privacy.json"
        path.write_text(json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n")
        summary[label] = {
            "r": r,
            "final_accuracy": spread(finals),
            "seconds_per_step": spread(seconds),
            "privacy": privacy,
            "privacy_statement": path.name,
        }
        acc = summary[label]["final_accuracy"]
        print(f"{STEM} {label}: {acc['mean']:.4f} [{acc['min']:.4f}, {acc['max']:.4f}]", flush=True)
    save_results(
        STEM,
        config=config,
        rows=rows,
        extra={
            "seeds": list(config.seeds),
            "hardware": hardware_label(x_train.device),
            "torch": torch.__version__,
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "steps_per_epoch": steps_per_epoch(config),
            "summary": summary,
        },
    )
