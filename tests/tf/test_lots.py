"""Poisson lots for TensorFlow: sizes Binomial(N, q) with empty lots, arrays and tf.data agree for
one seed, resumable streams, and typed errors for what cannot be Poisson-sampled."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from dpcore.errors import InvalidParameterError, StateError
from dpcore.tf.lots import PoissonLots

FALSE_REJECTION = 1e-5


def test_lot_sizes_are_binomial_and_may_be_empty() -> None:
    lots = PoissonLots(np.arange(200), sampling_probability=0.01, seed=0)
    sizes = np.array([len(lots.indices()) for _ in range(3000)])
    assert (sizes == 0).any()
    observed = np.bincount(sizes, minlength=9)[:9]
    expected = stats.binom(200, 0.01).pmf(np.arange(9)) * len(sizes)
    expected[-1] += len(sizes) - expected.sum()
    observed[-1] += len(sizes) - observed.sum()
    assert stats.chisquare(observed, expected).pvalue > FALSE_REJECTION


def test_secure_inclusions_have_rate_q() -> None:
    lots = PoissonLots(np.arange(1000), sampling_probability=0.2, secure=True)
    included = sum(len(lots.indices()) for _ in range(50))
    z = (included - 50 * 200) / np.sqrt(50 * 1000 * 0.2 * 0.8)
    assert abs(z) < stats.norm.isf(FALSE_REJECTION / 2)
    with pytest.raises(StateError):
        lots.state_dict()


def test_arrays_and_tf_data_give_the_same_lots() -> None:
    x = np.arange(40, dtype="float32").reshape(20, 2)
    y = np.arange(20)
    from_arrays = PoissonLots((x, y), expected_lot_size=3, seed=7).dataset()
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    from_data = PoissonLots(dataset, expected_lot_size=3, seed=7).dataset()
    empty = 0
    for (xa, ya), (xd, yd) in zip(from_arrays.take(40), from_data.take(40), strict=True):
        np.testing.assert_array_equal(xa.numpy(), xd.numpy())
        np.testing.assert_array_equal(ya.numpy(), yd.numpy())
        assert xd.shape[1:] == (2,)
        empty += int(ya.shape[0] == 0)
    assert empty > 0  # q = 0.15, N = 20: P(empty) = 0.04 per lot


def test_dict_inputs_and_resuming() -> None:
    data = {"a": np.arange(30), "b": np.arange(30) * 2}
    lots = PoissonLots(data, sampling_probability=0.3, seed=1)
    lots.indices()
    state = lots.state_dict()
    expected = [lots.indices() for _ in range(3)]
    again = PoissonLots(data, sampling_probability=0.3, seed=99)
    again.load_state_dict(state)
    for want in expected:
        np.testing.assert_array_equal(again.indices(), want)
    first = next(iter(PoissonLots(data, sampling_probability=0.3, seed=1).dataset()))
    np.testing.assert_array_equal(first["b"].numpy(), 2 * first["a"].numpy())


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({}, "sampling_probability"),
        ({"sampling_probability": 0.1, "expected_lot_size": 3}, "sampling_probability"),
        ({"sampling_probability": 0.0}, "sampling_probability"),
        ({"sampling_probability": 1.5}, "sampling_probability"),
        ({"expected_lot_size": 11}, "expected_lot_size"),
        ({"expected_lot_size": -1}, "expected_lot_size"),
        ({"expected_lot_size": 2, "secure": True, "seed": 3}, "seed"),
        ({"expected_lot_size": 2, "seed": -3}, "seed"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        PoissonLots(np.arange(10), **kwargs)  # type: ignore[arg-type]


def test_unknown_sizes_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="known finite cardinality"):
        PoissonLots(tf.data.Dataset.range(5).repeat(), expected_lot_size=1)
    with pytest.raises(InvalidParameterError, match="Expected data"):
        PoissonLots((np.arange(3), np.arange(4)), expected_lot_size=1)
    with pytest.raises(InvalidParameterError, match="Expected data"):
        PoissonLots(np.arange(0), sampling_probability=0.5)
