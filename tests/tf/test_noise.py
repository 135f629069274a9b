"""Normal sources for TensorFlow steps: N(0, 1) moments (a correct source is rejected w.p. <= 1e-5),
seeding rules, and the noise a DPModel step adds: mean 0, standard deviation sigma C / (q N)."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from dpcore.errors import InvalidParameterError
from dpcore.tf import DPModel, PoissonLots
from dpcore.tf.noise import NormalSource, SecureNormals, SeededNormals, normal_source

FALSE_REJECTION = 1e-5


def _check_standard_normal(values: np.ndarray, scale: float = 1.0) -> None:
    """Mean (z-test) and variance (chi-square on the sum of squares), each at 1e-5 / 4; KS."""
    values = values.astype(np.float64).ravel() / scale
    n = values.size
    assert abs(values.mean() * math.sqrt(n)) < stats.norm.isf(FALSE_REJECTION / 4)
    low, high = stats.chi2.ppf([FALSE_REJECTION / 4, 1 - FALSE_REJECTION / 4], df=n)
    assert low < float(np.sum(values**2)) < high
    assert stats.kstest(values, "norm").pvalue > FALSE_REJECTION


@pytest.mark.parametrize("source", [SeededNormals(0), SecureNormals()], ids=["seeded", "secure"])
def test_sources_draw_standard_normals(source: NormalSource) -> None:
    draws = source.standard_normal((300, 401), tf.float64)
    assert draws.shape == (300, 401)
    _check_standard_normal(draws.numpy())
    in_graph = tf.function(lambda: source.standard_normal(tf.constant([50, 20]), tf.float32))()
    assert in_graph.shape == (50, 20) and in_graph.dtype == tf.float32


def test_seeding_rules() -> None:
    a, b = SeededNormals(11), SeededNormals(11)
    np.testing.assert_array_equal(
        a.standard_normal((5,), tf.float32).numpy(), b.standard_normal((5,), tf.float32).numpy()
    )
    with pytest.raises(InvalidParameterError, match="Expected seed to be None"):
        SecureNormals(seed=1)
    secure = SecureNormals()
    first, second = (secure.standard_normal((64,), tf.float64).numpy() for _ in range(2))
    assert not np.array_equal(first, second)
    with pytest.raises(InvalidParameterError, match="Expected seed < 2\\*\\*63"):
        SeededNormals(2**63)
    with pytest.raises(InvalidParameterError, match="Expected noise in"):
        normal_source("urandom", None)


@pytest.mark.parametrize("noise", ["seeded", "secure"])
def test_a_step_adds_noise_of_std_sigma_c_over_expected_lot_size(noise: str) -> None:
    """A constant loss has zero gradients: one SGD step (lr 1) moves each weight by -noise/(qN)."""
    net = keras.Sequential([keras.Input((1,)), keras.layers.Dense(400)])  # 800 weights
    model = DPModel(
        net,
        max_grad_norm=2.0,
        noise_multiplier=1.5,
        noise=noise,
        seed=4 if noise == "seeded" else None,
    )
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=lambda y, p: 0.0 * p[:, 0])
    before = [w.numpy().copy() for w in net.trainable_weights]
    x = np.zeros((100, 1), "float32")
    lots = PoissonLots((x, x[:, 0]), expected_lot_size=25, seed=0)
    model.fit(lots, epochs=1, steps_per_epoch=5, verbose=0)
    moved = np.concatenate(
        [(b - w.numpy()).ravel() for b, w in zip(before, net.trainable_weights, strict=True)]
    )
    # five steps: the sum of 5 independent N(0, (sigma C / qN)^2) per weight
    _check_standard_normal(moved, scale=1.5 * 2.0 / 25 * math.sqrt(5))
