"""The audited records: a fixed MNIST subset, disjoint pre-training records, and the target.

Images are flattened and scaled to [0, 1]. The subset and the pre-training records are disjoint
parts of one seeded permutation of MNIST's training split; the natural and mislabelled targets
come from the test split, so the target is never one of the other records.
"""

from __future__ import annotations

import functools

import numpy as np

from audits.blackbox.settings import BlackBoxSetting, check_setting
from dpcore.data import load_mnist
from dpcore.errors import InvalidParameterError

__all__ = ["Records", "pretraining_records", "subset", "target"]

Records = tuple[np.ndarray, np.ndarray]


@functools.cache
def _mnist(split: str) -> Records:
    images, labels = load_mnist(split)
    flat = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return flat, labels.astype(np.int64)


def _order(setting: BlackBoxSetting) -> np.ndarray:
    labels = _mnist("train")[1]
    need = setting.subset_size + (setting.pretrain_size if setting.init == "worst_case" else 0)
    if need > len(labels):
        raise InvalidParameterError(
            "subset_size + pretrain_size", f"<= {len(labels)} (MNIST's training split)", need
        )
    return np.random.default_rng(setting.seed).permutation(len(labels))[:need]


def subset(setting: BlackBoxSetting) -> Records:
    """The audited training records other than the target (``subset_size`` of them).

    Raises:
        InvalidParameterError: a bad setting, or more records asked for than MNIST holds.
    """
    x, y = _mnist("train")
    chosen = _order(check_setting(setting))[: setting.subset_size]
    return x[chosen], y[chosen]


def pretraining_records(setting: BlackBoxSetting) -> Records:
    """``pretrain_size`` training records disjoint from :func:`subset`'s (worst-case init only).

    Raises:
        InvalidParameterError: a bad setting, or a setting whose init is not "worst_case".
    """
    if check_setting(setting).init != "worst_case":
        raise InvalidParameterError("init", "'worst_case' to pre-train", setting.init)
    x, y = _mnist("train")
    chosen = _order(setting)[setting.subset_size :]
    return x[chosen], y[chosen]


def target(setting: BlackBoxSetting) -> Records:
    """The target record as a batch of one: (1, 784) float32 image and (1,) int64 label.

    "blank": all zeros; "constant": all ones (both labelled ``target_label``); "mislabelled":
    the first test image (in a seeded order) whose true label is not ``target_label``, labelled
    ``target_label``; "natural": the first test image (same order) with its own label.

    Raises:
        InvalidParameterError: a bad setting.
    """
    kind, label = check_setting(setting).target, setting.target_label
    if kind in ("blank", "constant"):
        fill = 0.0 if kind == "blank" else 1.0
        return np.full((1, 784), fill, np.float32), np.array([label], np.int64)
    x, y = _mnist("test")
    order = np.random.default_rng(setting.seed).permutation(len(y))
    if kind == "natural":
        return x[order[:1]], y[order[:1]]
    first = order[np.flatnonzero(y[order] != label)[0]]
    return x[first : first + 1], np.array([label], np.int64)
