"""Setup of the Sec. 5 training runs of Bu et al. 2019 (:mod:`reproductions.bu2019_gdp.training`).

The profiles (:class:`TrainingConfig`, :data:`PROFILES`), which settings a profile runs and for
how many epochs (:func:`selected_settings`, :func:`epochs_run`), the Poisson rate on our data
(:func:`sampling_probability`), the data of a task (:func:`load_task`), and the task order with
each task's privacy unit and the non-private results the paper prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from dpcore.errors import InvalidParameterError
from reproductions.bu2019_gdp.data import LOADERS, TaskData, subsample
from reproductions.bu2019_gdp.settings import SETTINGS, Setting

STEM = "bu2019_training"


def results_stem(profile: str) -> str:
    """``bu2019_training`` for the quick profile (and tests), ``bu2019_training_full`` for full.

    Example:
        >>> results_stem("quick"), results_stem("full")
        ('bu2019_training', 'bu2019_training_full')
    """
    return f"{STEM}_full" if profile == "full" else STEM


#: Task order in tables and figures, with what one training record is (the privacy unit).
PRIVACY_UNITS = {
    "mnist": "one image",
    "imdb": "one review",
    "adult": "one person's census record",
    "movielens": "one rating (rating-level privacy, as in the paper; a user's ratings together "
    "are not protected as one unit)",
}
#: Non-private results the paper prints: Table 4's "non-private networks", RMSE 0.893 after
#: 20 epochs on ML-1M. No non-private number of the other tasks is transcribed in
#: :mod:`~reproductions.bu2019_gdp.settings`, so they show as n/a.
PAPER_NON_PRIVATE: dict[str, float] = {"movielens": 0.893}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """One profile.

    Attributes:
        profile: ``"quick"`` or ``"full"`` (or a test's name).
        settings: names of the settings to run; ``None``: all (full) or the first per task.
        epochs: epochs run per dataset; a dataset absent here runs each setting's paper epochs.
        train_subset / test_subset: rows kept per dataset (random, fixed seed); absent = all.
        baseline: whether to train the non-private baseline of each task.
        seed: base seed of models, samplers and noise.
        checkpoint: save after every epoch and resume (the full profile).
        eval_batch: rows per evaluation batch.
    """

    profile: str = "quick"
    settings: tuple[str, ...] | None = None
    epochs: dict[str, int] = dataclasses.field(default_factory=dict)
    train_subset: dict[str, int] = dataclasses.field(default_factory=dict)
    test_subset: dict[str, int] = dataclasses.field(default_factory=dict)
    baseline: bool = True
    seed: int = 0
    checkpoint: bool = False
    eval_batch: int = 4096


PROFILES = {
    # The first setting of each task for a few epochs: about 4 minutes on 2 shared CPU cores.
    "quick": TrainingConfig(epochs={"mnist": 2, "imdb": 2, "adult": 3, "movielens": 3}),
    "full": TrainingConfig(profile="full", checkpoint=True),
}


def selected_settings(
    config: TrainingConfig, catalogue: Sequence[Setting] = SETTINGS
) -> list[Setting]:
    """The settings run: the named ones, else all (full) or the first of each task."""
    if config.settings is not None:
        known = {setting.name for setting in catalogue}
        unknown = sorted(set(config.settings) - known)
        if unknown or not config.settings:
            raise InvalidParameterError("settings", f"names among {sorted(known)}", unknown)
        return [setting for setting in catalogue if setting.name in config.settings]
    if config.profile == "full":
        return list(catalogue)
    first: dict[str, Setting] = {}
    for setting in catalogue:
        first.setdefault(setting.dataset, setting)
    return list(first.values())


def epochs_run(config: TrainingConfig, setting: Setting) -> int:
    """Epochs this profile runs for ``setting`` (the paper's unless the profile overrides)."""
    epochs = config.epochs.get(setting.dataset, setting.epochs)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise InvalidParameterError("epochs", "a positive integer per dataset", epochs)
    return epochs


def sampling_probability(setting: Setting) -> float:
    """The Poisson rate on our data, ``local_lot_size / local_n`` (see the module docstring)."""
    return setting.local_sampling_probability


def load_task(
    dataset: str, config: TrainingConfig, loaders: dict[str, Callable[[], TaskData]] | None
) -> TaskData:
    """The dataset (a test may pass its own loaders), subsampled as the profile says."""
    loader = (loaders or LOADERS)[dataset]
    return subsample(
        loader(),
        train=config.train_subset.get(dataset),
        test=config.test_subset.get(dataset),
        seed=config.seed,
    )
