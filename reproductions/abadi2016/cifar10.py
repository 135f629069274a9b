"""Abadi et al. 2016, §5.3 / Fig. 6: DP-SGD on CIFAR-10 with the TensorFlow-tutorial network.

Paper (arXiv v2, §5.3 and the Fig. 6 caption): 32x32 images cropped to 24x24; two 5x5
convolutions (stride 1, 64 channels) each followed by ReLU and 2x2 max-pooling (12x12x64, then
6x6x64), two fully connected layers of 384 units and a softmax layer; training images are
augmented (random 24x24 crop, left-right flip, random brightness and contrast, redrawn every
epoch); sigma = 6, clipping 3, delta = 1e-5; lot 2,000 for epsilon = 2 and lot 4,000 for
epsilon = 4 and 8, reaching 67 %, 70 % and 73 % test accuracy. The epochs (about 56, 125 and
665) are read off Fig. 6, where each curve ends as delta reaches its limit.

Deviations (see the README): the paper's convolutions were pretrained on CIFAR-100 as public
data and frozen, with the dense layers initialised from that network; CIFAR-100 is not available
here either, so every layer is trained from a random initialisation under DP-SGD. The paper's
learning rate for CIFAR-10 is not stated; ``learning_rate`` is our assumption. The clipping is
one flat bound on the whole per-example gradient (the paper clipped per layer).

Data: :func:`dpcore.data.load_cifar10` on ``config.directory``, else ``$DPCORE_CIFAR10_DIR``,
else ``<data cache>/cifar-10-batches-py``. When the batches are missing :func:`compute` saves a
results file saying "not run: data unavailable" with the loader's message and no accuracy; the
accounting for the paper's settings (which needs no data) is saved either way.

The training of one setting (network, augmentation, DP-SGD on the reproduction harness) is in
:mod:`reproductions.abadi2016.cifar10_training` (re-exported here). The full profile keeps its
runs in the run store (``reproductions/checkpoints/abadi2016_cifar10/``, a commit every epoch);
a ``deadline`` stops them early, saved with the epochs reached and a ``status`` saying so. With
an ``executor`` (``--executor processes:3``) the settings (independent runs) train at once
through :func:`dpcore.runs.run_many` into the run store, and are read back from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpcore.atomic import atomic_write_text
from dpcore.data import DataUnavailableError, cache_dir, load_cifar10
from dpcore.events import dpsgd_event
from dpcore.runs import ExecutorChoice, SupportsSubmit, run_many
from dpcore.runs.markers import write_between_markers
from reproductions.abadi2016.cifar10_inputs import augment, evaluation_inputs
from reproductions.abadi2016.cifar10_training import (
    PAPER_SETTINGS,
    AugmentedTrainer,
    CifarConfig,
    CifarData,
    CifarSetting,
    code,
    make_model,
    train_setting,
)
from reproductions.abadi2016.mnist_core import epochs_reached, epsilon_columns, run_status
from reproductions.common import profile_config
from reproductions.harness import ROOT, Executor, Output, fanning_out, hardware_label, spread

__all__ = [
    "PAPER_SETTINGS",
    "PROFILES",
    "AugmentedTrainer",
    "CifarConfig",
    "CifarSetting",
    "SettingJob",
    "augment",
    "compute",
    "data_directory",
    "evaluation_inputs",
    "fan_out",
    "load_cifar10",
    "load_data",
    "make_model",
    "paper_accounting",
    "plot",
    "readme_table",
    "train_job",
    "train_setting",
]

STEM = "abadi2016_cifar10"
ENVIRONMENT = "DPCORE_CIFAR10_DIR"
NOT_RUN = "not run: data unavailable"
README = Path(__file__).with_name("README.md")
TABLE_START, TABLE_END = "<!-- cifar10-table:start -->", "<!-- cifar10-table:end -->"

PROFILES = {
    # Runs only if the data is present: the first setting for 2 epochs (a smoke-size run).
    "quick": CifarConfig(settings=(dataclasses.replace(PAPER_SETTINGS[0], epochs=2),)),
    "full": CifarConfig(profile="full", checkpoint=True),
}


def data_directory(config: CifarConfig) -> Path:
    """Where the ``cifar-10-batches-py`` files are looked for."""
    if config.directory is not None:
        return Path(config.directory)
    if os.environ.get(ENVIRONMENT):
        return Path(os.environ[ENVIRONMENT])
    return cache_dir() / "cifar-10-batches-py"


def reported_settings(config: CifarConfig) -> list[CifarSetting]:
    """Fig. 6's three settings, then any other setting the profile runs."""
    names = {setting.name for setting in PAPER_SETTINGS}
    return [*PAPER_SETTINGS, *(s for s in config.settings if s.name not in names)]


def paper_accounting(config: CifarConfig, dataset_size: int = 50_000) -> dict[str, Any]:
    """Epsilon of each reported setting at the paper's epochs (accounting only: needs no data)."""
    result = {}
    for setting in reported_settings(config):
        q = setting.lot_size / dataset_size
        steps = round(setting.paper_epochs * dataset_size / setting.lot_size)
        event = dpsgd_event(
            sampling_probability=q, noise_multiplier=config.noise_multiplier, steps=steps
        )
        result[setting.name] = epsilon_columns(event, config.delta)
    return result


def load_data(config: CifarConfig) -> CifarData:
    """The training and test images and labels in :func:`data_directory`.

    Raises:
        DataUnavailableError: the batches are not there.
    """
    directory = data_directory(config)
    x_train, y_train = load_cifar10(directory, "train")
    x_test, y_test = load_cifar10(directory, "test")
    return x_train, torch.as_tensor(y_train), x_test, torch.as_tensor(y_test)


@dataclasses.dataclass(frozen=True)
class SettingJob:
    """One setting's run as a picklable job for a worker (see :func:`fan_out`)."""

    config: CifarConfig
    setting: CifarSetting
    store: str
    fingerprint: str
    deadline: float | None


def train_job(job: SettingJob) -> dict[str, Any]:
    """Train ``job``'s setting into its run store (where a worker runs it, the data in
    :func:`data_directory` there): its name and status."""
    state, _ = train_setting(
        job.config, job.setting, load_data(job.config), store=Path(job.store),
        fingerprint=job.fingerprint, deadline=job.deadline,
    )  # fmt: skip
    return {"setting": job.setting.name, "done": state.done}


def fan_out(
    config: CifarConfig,
    executor: ExecutorChoice | SupportsSubmit,
    *,
    store: Path,
    fingerprint: str,
    deadline: float | None = None,
) -> list[dict[str, Any]]:
    """Train the profile's settings at once through ``executor`` into ``store`` (independent
    runs, each with its own seeds).

    Raises:
        RunsFailedError: runs still failed after one retry (each resumes from the store).
    """
    jobs = [
        SettingJob(config, setting, str(store), fingerprint, deadline)
        for setting in config.settings
    ]
    results: list[dict[str, Any]] = run_many(train_job, jobs, executor=executor, progress=False)
    return results


def compute(
    profile: str = "quick",
    *,
    config: CifarConfig | None = None,
    output: Output | None = None,
    deadline: float | None = None,
    executor: Executor = None,
) -> None:
    """Train the profile's settings if the data is there; otherwise save a "not run" record.

    ``config`` replaces the profile's; ``output`` the folders (the full profile's runs go to its
    run store); ``deadline`` (a ``time.time()`` value) stops the runs early. ``executor`` (None
    or ``"local"``: here, one setting after another) trains the settings at once through
    :func:`dpcore.runs.run_many` (:func:`fan_out`) into the run store (used then whatever the
    profile), and they are read back from it: the same rows.

    Raises:
        InvalidParameterError: the profile or ``executor`` is invalid (before anything runs).
        RunsFailedError: fanned-out runs still failed after one retry.
    """
    config = profile_config(PROFILES, profile, config)
    fanned = fanning_out(executor)
    output = output or Output()
    start = time.perf_counter()
    directory = data_directory(config)
    extra: dict[str, Any] = {
        "seed": config.seed,
        "hardware": hardware_label("cpu"),
        "runs_spread": spread(fanned),
        "torch": torch.__version__,
        "directory": str(directory),
        "reported_settings": [dataclasses.asdict(item) for item in reported_settings(config)],
        "paper_accounting": paper_accounting(config),
    }
    try:
        data = load_data(config)
    except DataUnavailableError as error:
        print(f"{STEM}: {NOT_RUN} ({error})", flush=True)
        output.path(f"{STEM}.csv").unlink(missing_ok=True)
        extra.update(status=NOT_RUN, error=str(error), summary={})
        extra["wall_time_s"] = round(time.perf_counter() - start, 1)
        output.save_results(STEM, config=config, rows=[], extra=extra)
        return
    x_train, x_test = data[0], data[2]
    store = output.store(STEM) if config.checkpoint or fanned is not None else None
    fingerprint = code()
    if fanned is not None:
        assert store is not None
        fan_out(config, fanned, store=store, fingerprint=fingerprint, deadline=deadline)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for setting in config.settings:
        state, statement = train_setting(
            config, setting, data, store=store, fingerprint=fingerprint, deadline=deadline
        )
        rows += state.rows
        name = None
        if statement is not None:
            name = f"{STEM}_{setting.name}_privacy.json"
            text = json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n"
            atomic_write_text(output.path(name), text)
        last = state.rows[-1] if state.rows else {}
        spent = None
        if last:
            event = dpsgd_event(
                sampling_probability=setting.lot_size / len(x_train),
                noise_multiplier=config.noise_multiplier,
                steps=last["step"],
            )
            spent = epsilon_columns(event, config.delta)
        summary[setting.name] = {
            "status": run_status(state, setting.epochs),
            "epochs_planned": setting.epochs,
            "epochs_run": epochs_reached(state),
            "test_accuracy": last.get("test_accuracy"),
            "epsilon": spent,
            "privacy_statement": name,
        }
    extra.update(status="run", n_train=len(x_train), n_test=len(x_test), summary=summary)
    extra["code_fingerprint"] = fingerprint
    extra["wall_time_s"] = round(time.perf_counter() - start, 1)
    output.save_results(STEM, config=config, rows=rows, extra=extra)


def _fmt(value: float | None) -> str:
    return "inf" if value is None else f"{value:.2f}"


def readme_table(data: dict[str, Any]) -> str:
    """The CIFAR-10 "paper vs ours" table from the saved results (a "not run" row per setting).

    One row per Fig. 6 setting; the accounting columns need no data and are always filled.
    """
    config, summary, ran = data["config"], data["summary"], data["status"] == "run"
    head = (
        f"Profile **{config['profile']}**, seed {data['seed']}, commit `{data['commit'][:12]}`, "
        f"wall time {data['wall_time_s']:.0f} s ({data['hardware']}); sigma = "
        f"{config['noise_multiplier']:g}, C = {config['max_grad_norm']:g}, delta = "
        f"{config['delta']:g}."
    )
    if not ran:
        head += f" **{NOT_RUN}**: {data['error'].replace(str(ROOT) + os.sep, '')}"
    lines = [
        head,
        "",
        "| setting (lot) | epochs run (paper's, Fig. 6) | test acc. ours | paper "
        "| eps run: moments / RDP / PLD upper | eps at paper's epochs: moments / PLD upper "
        "| paper eps |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in data["reported_settings"]:
        paper = data["paper_accounting"][setting["name"]]
        run, accuracy, spent = (NOT_RUN if not ran else "not in this profile"), "-", "-"
        if setting["name"] in summary:
            item = summary[setting["name"]]
            status = item.get("status", "done")  # saved before statuses existed: done
            run = f"{item['epochs_run']:g}" + ("" if status == "done" else f", {status}")
            if item["test_accuracy"] is not None:
                accuracy = f"{item['test_accuracy']:.3f}"
            eps = item["epsilon"]
            if eps is not None:
                spent = " / ".join(_fmt(eps[key]) for key in ("moments", "rdp", "pld_upper"))
        lines.append(
            f"| {setting['name']} ({setting['lot_size']}) | {run} (≈{setting['paper_epochs']}) "
            f"| {accuracy} | {setting['paper_accuracy']:.2f} | {spent} "
            f"| {_fmt(paper['moments'])} / {_fmt(paper['pld_upper'])} "
            f"| {setting['paper_epsilon']:g} |"
        )
    return "\n".join(lines)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``<figures>/abadi2016_cifar10.png`` (accuracy vs epoch) if it ran; the table always."""
    output = output or Output()
    if not output.has_results(STEM):
        return
    data = output.load_results(STEM)
    figure_path = output.path(f"{STEM}.png")
    if data["status"] == "run":
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        settings = data["config"]["settings"]
        figure, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6))
        for axis, setting in zip(np.atleast_1d(axes), settings, strict=True):
            mine = [row for row in data["rows"] if row["setting"] == setting["name"]]
            epochs = [row["epoch"] for row in mine]
            axis.plot(epochs, [row["test_accuracy"] for row in mine], "-o", ms=3, label="test")
            axis.plot(epochs, [row["train_accuracy"] for row in mine], "--", label="train")
            axis.axhline(setting["paper_accuracy"], color="tab:red", ls=":", label="paper")
            axis.set_title(f"{setting['name']} (lot {setting['lot_size']})", fontsize=9)
            axis.set_xlabel("epoch")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
        figure.suptitle(f"Abadi et al. 2016 CIFAR-10 ({data['config']['profile']} profile)")
        figure.tight_layout()
        figure.savefig(figure_path, dpi=150)
        plt.close(figure)
    else:
        figure_path.unlink(missing_ok=True)  # never leave a figure of an earlier run beside it
    write_between_markers(readme or README, TABLE_START, TABLE_END, readme_table(data))
