"""The two real datasets, as (n, d) feature rows of norm <= 1 and labels in {-1, +1}.

UCI Adult: numeric attributes standardised (capital gain/loss through log1p first), the
categorical ones one-hot (categories seen in training), fnlwgt dropped, a constant 1 appended.
Fashion-MNIST, T-shirt/top (0) vs shirt (6): a hard two-class image task, 4x4 average pooling
to 7 x 7 pixels plus a constant, so d = 50 (between Adult's d and a raw image's 785, to show the
d^2 cost of the norm-Laplace noise without drowning it). It is already loadable from Debian's
package and unlike MNIST 0-vs-1 it is not linearly separable, so the methods differ visibly.

Every row is then divided by its own norm (a per-row map, no data-dependent constant), so
||x_i|| = 1. The standardisation statistics come from the training split and are treated as
public, as in the preprocessing of CMS 2011 (§6); this is a stated, unaccounted-for leak.
"""

from __future__ import annotations

import numpy as np

from dpcore.data.datasets import load_adult, load_fashion_mnist

NUMERIC = (0, 4, 10, 11, 12)
LOG_SCALED = (10, 11)
CATEGORICAL = (1, 3, 5, 6, 7, 8, 9, 13)

Split = tuple[np.ndarray, np.ndarray]


def _unit_rows(features: np.ndarray) -> np.ndarray:
    return features / np.linalg.norm(features, axis=1, keepdims=True)


def _adult_numeric(rows: list[list[str]]) -> np.ndarray:
    values = np.array([[float(row[i]) for i in NUMERIC] for row in rows])
    for position, column in enumerate(NUMERIC):
        if column in LOG_SCALED:
            values[:, position] = np.log1p(values[:, position])
    return values


def adult() -> tuple[Split, Split]:
    """(train, test) of UCI Adult as unit-norm rows and +-1 labels."""
    train_rows, train_labels = load_adult("train")
    test_rows, test_labels = load_adult("test")
    numeric_train, numeric_test = _adult_numeric(train_rows), _adult_numeric(test_rows)
    mean, scale = numeric_train.mean(axis=0), numeric_train.std(axis=0)
    blocks_train = [(numeric_train - mean) / scale]
    blocks_test = [(numeric_test - mean) / scale]
    for column in CATEGORICAL:
        categories = sorted({row[column] for row in train_rows})
        index = {value: i for i, value in enumerate(categories)}
        for rows, blocks in ((train_rows, blocks_train), (test_rows, blocks_test)):
            onehot = np.zeros((len(rows), len(categories)))
            for r, row in enumerate(rows):
                if row[column] in index:
                    onehot[r, index[row[column]]] = 1.0
            blocks.append(onehot)
    train = np.hstack([*blocks_train, np.ones((len(train_rows), 1))])
    test = np.hstack([*blocks_test, np.ones((len(test_rows), 1))])
    return (
        (_unit_rows(train), np.where(np.asarray(train_labels) == 1, 1.0, -1.0)),
        (_unit_rows(test), np.where(np.asarray(test_labels) == 1, 1.0, -1.0)),
    )


def _fashion_split(split: str) -> Split:
    images, labels = load_fashion_mnist(split)
    keep = (labels == 0) | (labels == 6)
    pooled = images[keep].astype(float).reshape(-1, 7, 4, 7, 4).mean(axis=(2, 4)) / 255.0
    features = np.hstack([pooled.reshape(-1, 49), np.ones((int(keep.sum()), 1))])
    return _unit_rows(features), np.where(labels[keep] == 6, 1.0, -1.0)


def fashion_mnist() -> tuple[Split, Split]:
    """(train, test) of Fashion-MNIST T-shirt/top (-1) vs shirt (+1), 7x7 pooled, unit rows."""
    return _fashion_split("train"), _fashion_split("test")


LOADERS = {"adult": adult, "fashion_mnist_0v6": fashion_mnist}
