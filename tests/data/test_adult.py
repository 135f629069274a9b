"""UCI Adult featurisation on small generated rows: layout, scaling, guards, malformed input."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from dpcore.data import adult as adult_module
from dpcore.data.adult import (
    CATEGORICAL_COLUMNS,
    COLUMNS,
    NUMERIC_COLUMNS,
    adult_features,
    load_adult_features,
    unit_rows,
)
from dpcore.errors import InvalidParameterError


def _row(age: str = "39", work: str = "Private", gain: str = "0", hours: str = "40") -> list[str]:
    """age, workclass, fnlwgt, education, education-num, marital-status, occupation,
    relationship, race, sex, capital-gain, capital-loss, hours-per-week, native-country."""
    education = ["Bachelors", "13", "Never-married", "Sales", "Husband", "White", "Male"]
    return [age, work, "77516", *education, gain, "0", hours, "United-States"]


def _generated(n: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = _row(
            age=str(rng.integers(17, 90)),
            work=str(rng.choice(["Private", "State-gov", "?"])),
            gain=str(rng.choice([0, 0, int(rng.integers(1, 99_999))])),
            hours=str(rng.integers(1, 99)),
        )
        row[3] = str(rng.choice(["Bachelors", "HS-grad"]))
        rows.append(row)
    return rows


def test_layout_numeric_then_sorted_one_hot_blocks() -> None:
    train = [_row(work="State-gov"), _row(work="Private"), _row(work="?")]
    test = [_row(work="Private"), _row(work="Never-seen")]
    x_train, x_test = adult_features(train, test)
    # 5 numeric columns, then workclass (3 categories) and 7 single-category blocks.
    assert x_train.shape == (3, len(NUMERIC_COLUMNS) + 3 + 7)
    assert x_test.shape == (2, x_train.shape[1])
    workclass = slice(5, 8)  # categories sorted as strings: "?", "Private", "State-gov"
    assert x_train[:, workclass].tolist() == [[0, 0, 1], [0, 1, 0], [1, 0, 0]]
    assert x_test[:, workclass].tolist() == [[0, 1, 0], [0, 0, 0]]  # unseen: all zeros
    assert x_train.dtype == x_test.dtype == np.float64


def test_numeric_columns_standardised_with_training_statistics() -> None:
    train = _generated(200)
    x_train, x_test = adult_features(train, [_row(age="39")])
    numeric = x_train[:, : len(NUMERIC_COLUMNS)]
    np.testing.assert_allclose(numeric.mean(axis=0), 0.0, atol=1e-12)
    # education-num is constant in these rows (only centred); the others have unit variance.
    np.testing.assert_allclose(numeric.std(axis=0), [1.0, 0.0, 1.0, 0.0, 1.0], atol=1e-12)
    ages = np.array([float(row[0]) for row in train])
    assert x_test[0, 0] == pytest.approx((39 - ages.mean()) / ages.std())


def test_capital_gain_goes_through_log1p() -> None:
    train = [_row(gain="0"), _row(gain=str(math.e**2 - 1))]
    x_train, _ = adult_features(train, [])
    gain = NUMERIC_COLUMNS.index(10)
    # log1p gives 0 and 2: mean 1, std 1, so the standardised values are -1 and +1.
    np.testing.assert_allclose(x_train[:, gain], [-1.0, 1.0])


def test_constant_column_is_centred_not_divided_by_zero() -> None:
    train = [_row(age=str(a), hours="40") for a in (20, 30, 40)]  # hours-per-week constant
    test = [_row(hours="40"), _row(hours="60")]
    for options in ({}, {"intercept": True, "unit_norm": True}):
        x_train, x_test = adult_features(train, test, **options)  # a RuntimeWarning would fail
        assert np.all(np.isfinite(x_train)) and np.all(np.isfinite(x_test))
        hours = NUMERIC_COLUMNS.index(12)
        assert np.all(x_train[:, hours] == 0.0)
        assert x_test[0, hours] == 0.0 and x_test[1, hours] > 0  # 60 - 40, divided by 1
    single, _ = adult_features([_row()], [])  # one training row: every column constant
    assert np.all(single[:, : len(NUMERIC_COLUMNS)] == 0.0)


def test_intercept_and_unit_norm() -> None:
    train, test = _generated(50), _generated(20, seed=1)
    plain_train, plain_test = adult_features(train, test)
    x_train, x_test = adult_features(train, test, intercept=True, unit_norm=True)
    assert x_train.shape == (50, plain_train.shape[1] + 1)
    np.testing.assert_allclose(np.linalg.norm(x_train, axis=1), 1.0)
    np.testing.assert_allclose(np.linalg.norm(x_test, axis=1), 1.0)
    with_one = np.hstack([plain_train, np.ones((50, 1))])
    np.testing.assert_array_equal(x_train, unit_rows(with_one))
    intercept_only, _ = adult_features(train, test, intercept=True)
    assert np.all(intercept_only[:, -1] == 1.0)
    np.testing.assert_array_equal(intercept_only[:, :-1], plain_train)
    assert np.array_equal(adult_features(train, test)[1], plain_test)  # deterministic


def test_empty_test_split_is_allowed() -> None:
    x_train, x_test = adult_features(_generated(5), [], intercept=True, unit_norm=True)
    assert x_test.shape == (0, x_train.shape[1])


@pytest.mark.parametrize(
    ("train", "test", "parameter", "fragment"),
    [
        ([], [], "train_rows", "at least one row"),
        ([_row()[:13]], [], "train_rows", "row 0 to have 14 fields"),
        ([_row()], [_row(), [*_row(), ">50K"]], "test_rows", "row 1 to have 14 fields"),
        ([_row(age="?")], [], "train_rows", "row 0 column 0 (age) to be a finite number"),
        ([_row(hours="nan")], [], "train_rows", "column 12 (hours-per-week)"),
        ([_row()], [_row(age="inf")], "test_rows", "to be a finite number"),
        ([_row(gain="-5")], [], "train_rows", "column 10 (capital-gain) to be >= 0"),
        ([[*_row()[:1], 3, *_row()[2:]]], [], "train_rows", "column 1 (workclass) to be a str"),
        (["39, Private, 77516, Bachelors"], [], "train_rows", "row 0 to be a sequence"),
        ("not rows", [], "train_rows", "a sequence of rows"),
    ],
)
def test_malformed_rows_name_the_split(
    train: list[list[str]], test: list[list[str]], parameter: str, fragment: str
) -> None:
    with pytest.raises(InvalidParameterError, match=re.escape(fragment)) as caught:
        adult_features(train, test)
    assert caught.value.parameter == parameter


@pytest.mark.parametrize("flag", ["intercept", "unit_norm"])
def test_flags_must_be_bools(flag: str) -> None:
    with pytest.raises(InvalidParameterError, match=flag):
        adult_features([_row()], [], **{flag: 1})  # type: ignore[arg-type]


def test_unit_norm_without_intercept_rejects_a_zero_row() -> None:
    # A single training row has every numeric column constant (0) and one-hot blocks of one
    # category; a test row of unseen categories at the training values is then all zeros.
    unseen = _row()
    for column in CATEGORICAL_COLUMNS:
        unseen[column] = "unseen"
    with pytest.raises(InvalidParameterError, match="non-zero norm") as caught:
        adult_features([_row()], [unseen], unit_norm=True)
    assert caught.value.parameter == "test_rows"
    assert np.all(
        adult_features([_row()], [unseen], intercept=True, unit_norm=True)[1][0, :-1] == 0
    )


def test_unit_rows() -> None:
    np.testing.assert_allclose(
        unit_rows(np.array([[3.0, 4.0], [0.0, -2.0]])), [[0.6, 0.8], [0, -1]]
    )
    for bad in (np.zeros(3), np.array([[1.0, np.nan]]), np.array([[1.0, 1.0], [0.0, 0.0]])):
        with pytest.raises(InvalidParameterError, match="features"):
            unit_rows(bad)


def test_load_adult_features_keeps_the_labels(monkeypatch: pytest.MonkeyPatch) -> None:
    splits = {
        "train": (_generated(6), np.array([0, 1, 0, 1, 1, 0])),
        "test": (_generated(3, seed=2), np.array([1, 0, 0])),
    }
    monkeypatch.setattr(adult_module, "load_adult", lambda split: splits[split])
    (x_train, y_train), (x_test, y_test) = load_adult_features(intercept=True, unit_norm=True)
    assert y_train.tolist() == [0, 1, 0, 1, 1, 0] and y_test.tolist() == [1, 0, 0]
    expected = adult_features(splits["train"][0], splits["test"][0], intercept=True, unit_norm=True)
    np.testing.assert_array_equal(x_train, expected[0])
    np.testing.assert_array_equal(x_test, expected[1])
    assert len(COLUMNS) == 14
