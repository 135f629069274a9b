"""The two real datasets, as (n, d) feature rows of norm <= 1 and labels in {-1, +1}.

UCI Adult: :func:`dpcore.data.adult_features` (numeric attributes standardised, capital gain/loss
through log1p first, the categorical ones one-hot over the categories seen in training, fnlwgt
dropped) with a constant 1 appended. Label +1 = income > 50K.
Fashion-MNIST, T-shirt/top (0) vs shirt (6): a hard two-class image task, 4x4 average pooling
to 7 x 7 pixels plus a constant, so d = 50 (between Adult's d and a raw image's 785, to show the
d^2 cost of the norm-Laplace noise without drowning it). It is already loadable from Debian's
package and unlike MNIST 0-vs-1 it is not linearly separable, so the methods differ visibly.

Every row is then divided by its own norm (:func:`dpcore.data.unit_rows`, a per-row map, no
data-dependent constant), so ||x_i|| = 1. The standardisation statistics come from the training
split and are treated as public, as in the preprocessing of CMS 2011 (§6); this is a stated,
unaccounted-for leak.
"""

from __future__ import annotations

import numpy as np

from dpcore.data import load_adult_features, load_fashion_mnist, unit_rows

Split = tuple[np.ndarray, np.ndarray]


def _signed(labels: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(labels) == 1, 1.0, -1.0)


def adult() -> tuple[Split, Split]:
    """(train, test) of UCI Adult as unit-norm rows (with an intercept) and +-1 labels."""
    (train, train_labels), (test, test_labels) = load_adult_features(intercept=True, unit_norm=True)
    return (train, _signed(train_labels)), (test, _signed(test_labels))


def _fashion_split(split: str) -> Split:
    images, labels = load_fashion_mnist(split)
    keep = (labels == 0) | (labels == 6)
    pooled = images[keep].astype(float).reshape(-1, 7, 4, 7, 4).mean(axis=(2, 4)) / 255.0
    features = np.hstack([pooled.reshape(-1, 49), np.ones((int(keep.sum()), 1))])
    return unit_rows(features), np.where(labels[keep] == 6, 1.0, -1.0)


def fashion_mnist() -> tuple[Split, Split]:
    """(train, test) of Fashion-MNIST T-shirt/top (-1) vs shirt (+1), 7x7 pooled, unit rows."""
    return _fashion_split("train"), _fashion_split("test")


LOADERS = {"adult": adult, "fashion_mnist_0v6": fashion_mnist}
