"""Bu et al. 2019, MNIST sigma = 1.3 / 15 epochs: how much of our gap is the initialisation?

The paper trains in TensorFlow/Keras, whose layers start from Glorot-uniform weights and zero
biases (Keras' defaults for ``Dense`` and ``Conv2D``); torch's ``nn.Linear`` and ``nn.Conv2d``
start from Kaiming-uniform weights (``a = sqrt(5)``) and small uniform biases. Everything else
being equal (the setting of :mod:`~reproductions.bu2019_gdp.settings`, the same Poisson lots,
noise and clipping through :func:`~reproductions.bu2019_gdp.training_runs.make_trainer`), this
trains the setting with both initialisations for a few seeds and saves the test accuracy after
every epoch, so the scoreboard's explanation of the gap reads a measured number, not a guess.

Profiles: ``quick`` (1 epoch, seed 0, a check that it runs) and ``full`` (the paper's 15
epochs, seeds 0-2), saved as ``figures/bu2019_initialisation[_full].json``; the full runs resume
from the run store. With an ``executor`` (``--executor processes:6``) the runs (each
initialisation and seed, independent) train at once through :func:`dpcore.runs.run_many` into
the run store, and are read back from it.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from reproductions.bu2019_gdp.data import LOADERS, TaskData
from reproductions.bu2019_gdp.settings import by_name
from reproductions.bu2019_gdp.training_runs import make_trainer
from reproductions.common import profile_config
from reproductions.harness import (
    Executor,
    Output,
    RunState,
    cpu_settings,
    evaluate,
    fanning_out,
    hardware_label,
    spread,
)
from reproductions.harness import run_training as train

__all__ = [
    "INITS",
    "PROFILES",
    "STEM",
    "InitConfig",
    "InitJob",
    "compute",
    "execute_job",
    "fan_out",
    "keras_init",
    "plot",
]

STEM = "bu2019_initialisation"
#: torch's default initialisation, and Keras' (the paper's framework).
INITS = ("torch", "keras")
CODE_MODULES = (
    "dpcore.torch",
    "reproductions.harness",
    "reproductions.bu2019_gdp.models",
    "reproductions.bu2019_gdp.data",
    "reproductions.bu2019_gdp.training_runs",
    "reproductions.bu2019_gdp.initialisation",
)


@dataclasses.dataclass(frozen=True)
class InitConfig:
    """One profile: the setting, epochs and seeds trained with each initialisation."""

    profile: str = "quick"
    setting: str = "mnist_sigma1.3_e15"
    epochs: int = 1
    seeds: tuple[int, ...] = (0,)
    threads: int | None = 1


PROFILES = {
    "quick": InitConfig(),
    "full": InitConfig(profile="full", epochs=15, seeds=(0, 1, 2)),
}


def keras_init(model: nn.Module, seed: int) -> None:
    """Glorot-uniform weights and zero biases on every ``Linear`` and ``Conv2d`` (Keras' default).

    Glorot & Bengio 2010, Eq. 16: U(-a, a) with a = sqrt(6 / (fan_in + fan_out)); for a
    convolution the fans include the kernel's area, as in Keras.

    Example:
        >>> layer = nn.Linear(4, 2)
        >>> keras_init(layer, seed=0)
        >>> bool(layer.bias.eq(0).all()), bool(layer.weight.abs().max() <= (6 / 6) ** 0.5)
        (True, True)
    """
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            with torch.no_grad():
                fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(module.weight)
                bound = (6.0 / (fan_in + fan_out)) ** 0.5
                module.weight.copy_(
                    torch.rand(module.weight.shape, generator=generator) * 2 * bound - bound
                )
                if module.bias is not None:
                    module.bias.zero_()


def results_stem(profile: str) -> str:
    """``bu2019_initialisation`` (quick, tests) or ``bu2019_initialisation_full``."""
    return f"{STEM}_full" if profile == "full" else STEM


def _execute(
    config: InitConfig, init: str, seed: int, data: TaskData, store: Path | None,
    fingerprint: str, deadline: float | None,
) -> RunState:  # fmt: skip
    """Train one initialisation and seed (resuming from ``store`` when it holds the run)."""
    setting = by_name(config.setting)
    trainer = make_trainer(setting, data, seed)
    if init == "keras":
        keras_init(trainer.model, seed)  # before any step: the optimizer holds the same tensors
    spec = {"check": STEM, "setting": setting.name, "init": init, "seed": seed}
    spec["epochs"] = config.epochs
    state = RunState.open(store, spec, fingerprint)
    per_epoch = trainer.sampler.steps_per_epoch
    train(
        trainer,
        state,
        steps=config.epochs * per_epoch,
        eval_every=per_epoch,
        per_epoch=per_epoch,
        measure=lambda current: {
            "test_accuracy": evaluate(current.model, data.x_test, data.y_test)
        },
        row={"init": init, "seed": seed},
        deadline=deadline,
        label=f"{STEM} {init} seed {seed}",
    )
    return state


@dataclasses.dataclass(frozen=True)
class InitJob:
    """One initialisation and seed as a picklable job for a worker (see :func:`fan_out`)."""

    config: InitConfig
    init: str
    seed: int
    store: str
    fingerprint: str
    deadline: float | None
    #: Module-level (picklable) replacement of the task's loader, e.g. small data in tests.
    loader: Callable[[], TaskData] | None = None


def execute_job(job: InitJob) -> dict[str, Any]:
    """Train one run in this process (the profile's torch threads), resuming from and committing
    to the run store, until it is done or ``job.deadline``: what it is and whether it is done."""
    data = (job.loader or LOADERS[by_name(job.config.setting).dataset])()
    with cpu_settings(job.config.threads):
        state = _execute(
            job.config, job.init, job.seed, data, Path(job.store), job.fingerprint, job.deadline
        )
    return {"init": job.init, "seed": job.seed, "done": state.done}


def fan_out(
    config: InitConfig,
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    loader: Callable[[], TaskData] | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train every (initialisation, seed) at once through ``executor`` into ``store``.

    Each run is independent (its own seeds), so where it trains does not change its rows.
    ``loader`` must be picklable for an executor that pickles (spawned processes, Dask, Ray,
    Slurm).

    Raises:
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    jobs = [
        InitJob(config, init, seed, str(store), fingerprint, deadline, loader)
        for init in INITS
        for seed in config.seeds
    ]
    results: list[dict[str, Any]] = run_many(execute_job, jobs, executor=executor, progress=False)
    return results


def compute(
    profile: str = "quick",
    *,
    config: InitConfig | None = None,
    loader: Callable[[], TaskData] | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: Executor = None,
) -> None:
    """Train the setting with each initialisation and seed; save rows and a per-init summary.

    ``executor`` (None or ``"local"``: here, one run after another) trains the runs at once
    through :func:`dpcore.runs.run_many` (:func:`fan_out`) into the run store (used then
    whatever the profile), and they are read back from it: the same rows.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: fanned-out runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    setting = by_name(config.setting)
    data = (loader or LOADERS[setting.dataset])()
    fingerprint = output.code(*CODE_MODULES)
    stem = results_stem(config.profile)
    store = output.store(stem) if config.profile == "full" or fanned is not None else None
    if fanned is not None:
        assert store is not None
        fan_out(
            config, fanned, store=store, fingerprint=fingerprint, loader=loader, deadline=deadline
        )
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    with cpu_settings(config.threads):
        for init in INITS:
            finals: dict[str, float] = {}
            unfinished: dict[str, float] = {}
            for seed in config.seeds:
                state = _execute(config, init, seed, data, store, fingerprint, deadline)
                rows += state.rows
                if state.done:
                    finals[str(seed)] = state.rows[-1]["test_accuracy"]
                else:
                    unfinished[str(seed)] = state.rows[-1]["epoch"] if state.rows else 0.0
            summary[init] = {
                "final_accuracy": finals,
                "mean": statistics.fmean(finals.values()) if finals else None,
                "unfinished": unfinished,
            }
        hardware = hardware_label("cpu")
    output.save_results(
        results_stem(config.profile),
        config=config,
        rows=rows,
        extra={
            "setting": dataclasses.asdict(setting),
            "paper_accuracy": setting.paper_metric,
            "hardware": hardware,
            "runs_spread": spread(fanned),
            "torch": torch.__version__,
            **output.provenance_of_runs(*CODE_MODULES),
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "summary": summary,
        },
    )


def plot() -> None:
    """Nothing to draw: the numbers feed the training table's notes and the scoreboard."""
