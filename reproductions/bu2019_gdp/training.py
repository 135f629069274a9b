"""Bu, Dong, Long, Su (2019/2020), Sec. 5: DP training of the four tasks, accounted with the CLT.

For every :class:`~reproductions.bu2019_gdp.settings.Setting` (the paper's noise multiplier sigma,
lot size, learning rate, clipping norm, optimizer and epochs), the task's model
(:mod:`~reproductions.bu2019_gdp.models`) is trained with :class:`~dpcore.torch.training.DPTrainer`
on Poisson lots (exact per-example clipping, engine ``"fast"``). After every epoch we record the
test accuracy (RMSE for MovieLens), the CLT's mu (Bu et al. Thm 5 / Cor. 5: mu = q sqrt(T
(e^{1/sigma^2} - 1))), the epsilon of mu-GDP at the setting's delta (an approximation, not a
bound) and the RDP epsilon; at the end the certified PLD interval. A non-private baseline (same
model, plain SGD/Adam with the same learning rate on shuffled batches, same epochs) is trained per
task.

Sampling rate: the setting's rate on our data, q = ``local_lot_size / local_n``. MNIST and IMDb
are the paper's data; Adult is the UCI split (32,561 rows, lot 256, so q is 256/32,561 instead of
the paper's 256/29,305); MovieLens-100K (80,000 training ratings) replaces ML-1M with a lot of
1,000, which keeps the paper's q = 0.0125, hence its mu per epoch, but puts ten times the paper's
relative noise on the averaged gradient.

Profiles: ``full`` runs every setting for the paper's epochs (resumable from checkpoints under
``reproductions/checkpoints/bu2019_training/``); ``quick`` runs the first setting of each task
for a few epochs (labelled "quick" in the table). :func:`compute` saves ``figures/
bu2019_training.{json,csv}`` and ``figures/bu2019_training_<task>_privacy.json``; :func:`plot`
(:mod:`~reproductions.bu2019_gdp.training_report`) draws from the saved JSON only.

This module runs the computation; the profiles and data are in
:mod:`~reproductions.bu2019_gdp.training_setup` and the training of one setting or baseline in
:mod:`~reproductions.bu2019_gdp.training_runs` (both re-exported here).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from reproductions.bu2019_gdp import models
from reproductions.bu2019_gdp.data import TaskData
from reproductions.bu2019_gdp.settings import SETTINGS, Setting
from reproductions.bu2019_gdp.training_runs import (
    make_trainer,
    privacy_at,
    train_baseline,
    train_private,
)
from reproductions.bu2019_gdp.training_setup import (
    PAPER_NON_PRIVATE,
    PRIVACY_UNITS,
    PROFILES,
    STEM,
    TrainingConfig,
    epochs_run,
    load_task,
    sampling_probability,
    selected_settings,
)
from reproductions.common import FIGURES, ROOT, finite_or_none, save_results

__all__ = [
    "CHECKPOINTS",
    "PAPER_NON_PRIVATE",
    "PRIVACY_UNITS",
    "PROFILES",
    "STEM",
    "TrainingConfig",
    "compute",
    "epochs_run",
    "load_task",
    "make_trainer",
    "plot",
    "privacy_at",
    "sampling_probability",
    "selected_settings",
    "train_baseline",
    "train_private",
]

CHECKPOINTS = ROOT / "reproductions" / "checkpoints" / STEM


def compute(
    profile: str = "quick",
    *,
    config: TrainingConfig | None = None,
    loaders: dict[str, Callable[[], TaskData]] | None = None,
    catalogue: Sequence[Setting] = SETTINGS,
) -> None:
    """Train every selected setting and each task's baseline; save results and statements.

    ``config``, ``loaders`` and ``catalogue`` replace the profile, the data loaders and
    :data:`~reproductions.bu2019_gdp.settings.SETTINGS` (tests use tiny ones).
    """
    if config is None:
        if profile not in PROFILES:
            raise InvalidParameterError("profile", f"in {sorted(PROFILES)}", profile)
        config = PROFILES[profile]
    settings = selected_settings(config, catalogue)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    FIGURES.mkdir(parents=True, exist_ok=True)
    for dataset in [d for d in PRIVACY_UNITS if any(s.dataset == d for s in settings)]:
        data = load_task(dataset, config, loaders)
        mine = [s for s in settings if s.dataset == dataset]
        statements: dict[str, Any] = {}
        for setting in mine:
            slug = setting.name.lower().replace(" ", "_")
            checkpoint = CHECKPOINTS / config.profile / slug if config.checkpoint else None
            run_rows, trainer = train_private(setting, data, config, checkpoint)
            rows += run_rows
            # The paper's schedule on the paper's data (comparable with its printed mu), and
            # the paper's epochs on our data (what the full profile spends).
            paper_event = dpsgd_event(
                sampling_probability=setting.sampling_probability,
                noise_multiplier=setting.noise_multiplier,
                steps=setting.steps,
            )
            full_event = dpsgd_event(
                sampling_probability=sampling_probability(setting),
                noise_multiplier=setting.noise_multiplier,
                steps=setting.epochs * trainer.sampler.steps_per_epoch,
            )
            statement = trainer.privacy_statement(
                delta=setting.delta,
                accountants=("rdp", "pld", "gdp_clt"),
                task=dataset,
                setting=setting.name,
                model=f"{setting.model} ({models.parameter_count(trainer.model):,} parameters)",
                optimizer=setting.optimizer,
                learning_rate=setting.learning_rate,
                privacy_unit=PRIVACY_UNITS[dataset],
            )
            final = privacy_at(trainer.ledger.event(), setting.delta, rdp=False, pld=True)
            final["epsilon_rdp"] = finite_or_none(float(statement["epsilon"]["rdp"]["epsilon"]))
            statement["clt_mu"] = final["mu"]
            statement["pld_interval"] = [final["epsilon_pld_lower"], final["epsilon_pld_upper"]]
            statements[setting.name] = statement
            summary[setting.name] = {
                "task": dataset,
                "setting": dataclasses.asdict(setting),
                "epochs_run": run_rows[-1]["epoch"],
                "lot_size_ours": trainer.sampler.expected_lot_size,
                "dataset_size_ours": len(data.x_train),
                "test_size_ours": len(data.x_test),
                "parameters": models.parameter_count(trainer.model),
                "test_metric": run_rows[-1]["test_metric"],
                "privacy_run": final,
                "privacy_paper_schedule": privacy_at(paper_event, setting.delta, rdp=False),
                "privacy_paper_epochs_ours": privacy_at(
                    full_event, setting.delta, rdp=False, pld=True
                ),
            }
            print(f"{STEM} {setting.name}: {run_rows[-1]['test_metric']:.4f}", flush=True)
        path = FIGURES / f"{STEM}_{dataset}_privacy.json"
        path.write_text(json.dumps(statements, indent=2, sort_keys=True, default=str) + "\n")
        if config.baseline:
            epochs = max(epochs_run(config, s) for s in mine)
            checkpoint = CHECKPOINTS / config.profile / f"{dataset}_baseline"
            base = train_baseline(
                dataset, mine[0], data, epochs, config, checkpoint if config.checkpoint else None
            )
            rows += base
            summary[f"{dataset}:non-private"] = {
                "task": dataset,
                "epochs_run": epochs,
                "test_metric": base[-1]["test_metric"],
                "paper_metric": PAPER_NON_PRIVATE.get(dataset),
            }
    save_results(
        STEM,
        config=config,
        rows=rows,
        extra={
            "seed": config.seed,
            "hardware": f"{torch.get_num_threads()} torch threads, CPU",
            "torch": torch.__version__,
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "summary": summary,
        },
    )


def plot() -> None:
    """Figures and README table from the saved JSON (see :mod:`.training_report`)."""
    from reproductions.bu2019_gdp.training_report import plot as draw

    draw()
