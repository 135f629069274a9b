"""JL norms in TensorFlow: each projection is <g_i, v> exactly (forward mode against the
per-example Jacobian), so r M^2 / ||g||^2 follows chi^2_r (Bu et al. 2021, Lemma 4.1); dropout sees
the same masks in every projection and in the clipped pass; JL steps tend to exact steps."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from dpcore.tf.clipping import Clipper
from dpcore.tf.jl import jl_projections, restore_seeds, seed_states
from dpcore.tf.losses import per_example_loss
from dpcore.tf.noise import NormalSource, SeededNormals
from tests.tf.models import build, loop_reference, lot, sparse_loss

FALSE_REJECTION = 1e-5


class _Fixed(NormalSource):
    """Hands out given tangents in order (to check the jvp against dot products)."""

    def __init__(self, draws: list[np.ndarray]) -> None:
        self.draws = list(draws)

    def standard_normal(self, shape: object, dtype: tf.DType) -> tf.Tensor:
        return tf.constant(self.draws.pop(0), dtype)


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_each_projection_is_the_dot_product_with_the_direction(name: str) -> None:
    model = build(name)
    x, y = lot(name, 5)
    weights = model.trainable_weights
    rng = np.random.default_rng(3)
    directions = [rng.normal(size=w.shape) for w in weights]
    with tf.GradientTape(persistent=True) as tape:
        losses = per_example_loss(sparse_loss(), y, model(x, training=False))
    jacobian = tape.jacobian(losses, weights, experimental_use_pfor=False)
    expected = sum(
        np.tensordot(j.numpy(), v, axes=v.ndim) for j, v in zip(jacobian, directions, strict=True)
    )
    projections = jl_projections(
        lambda: per_example_loss(sparse_loss(), y, model(x, training=False)),
        weights,
        dimension=1,
        directions=_Fixed(directions),
        before_pass=lambda: None,
    )
    np.testing.assert_allclose(projections.numpy()[0], expected, rtol=1e-10)


def test_estimates_follow_scaled_chi_square() -> None:
    """300 projections of a small MLP: groups of r give r M^2/||g||^2 ~ chi^2_r (KS per example)."""
    model = build("mlp")
    x, y = lot("mlp", 3)
    exact, _ = loop_reference(model, sparse_loss(), x, y, 1.0)
    directions = SeededNormals(5)  # its generator moves on at every call: fresh directions
    one = tf.function(
        lambda: jl_projections(
            lambda: per_example_loss(sparse_loss(), y, model(x, training=False)),
            model.trainable_weights,
            dimension=1,
            directions=directions,
            before_pass=lambda: None,
        )
    )
    projections = np.concatenate([one().numpy() for _ in range(300)])
    level = FALSE_REJECTION / 9
    for r in (1, 3, 5):
        groups = (projections**2).reshape(300 // r, r, -1).mean(axis=1)
        for i in range(3):
            scaled = groups[:, i] * r / exact[i] ** 2
            assert stats.kstest(scaled, stats.chi2(r).cdf).pvalue > level


def test_jl_step_converges_to_exact_step() -> None:
    model = build("mlp")
    x, y = lot("mlp", 4)
    exact = Clipper(model, sparse_loss(), 0.5)(x, y, training=False)
    wide = Clipper(
        model, sparse_loss(), 0.5, method="jl", jl_dimension=200, directions=SeededNormals(1)
    )
    norms, factors, summed = tf.function(
        lambda: (lambda lot: (lot.norms, lot.clip_factors, lot.summed))(wide(x, y, training=False))
    )()
    # ||g||^2 chi^2_200 / 200 has relative sd sqrt(2/200) = 0.1, the norm about 0.05: 0.35 is 7 sd
    np.testing.assert_allclose(norms.numpy(), exact.norms.numpy(), rtol=0.35)
    np.testing.assert_allclose(factors.numpy(), np.minimum(1.0, 0.5 / norms.numpy()), rtol=1e-12)
    # the clipped sum uses the estimated factors: sum_i c_i g_i with the exact g_i
    per_example = [
        loop_reference(model, sparse_loss(), x[i : i + 1], y[i : i + 1], 1e9)[1] for i in range(4)
    ]
    for k, ours in enumerate(summed):
        expected = sum(c * grads[k] for c, grads in zip(factors.numpy(), per_example, strict=True))
        np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-10, atol=1e-13)


def test_dropout_sees_the_same_mask_in_projections_and_clipped_pass() -> None:
    """With dropout, r = 1 projection reproduces <g, v> of the *same* masked network."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((5,), dtype="float64"),
            keras.layers.Dense(16, activation="relu", dtype="float64"),
            keras.layers.Dropout(0.5, seed=3, dtype="float64"),
            keras.layers.Dense(3, dtype="float64"),
        ]
    )
    x, y = lot("mlp", 4)
    weights = model.trainable_weights
    states = seed_states(model)
    rng = np.random.default_rng(0)
    directions = [rng.normal(size=w.shape) for w in weights]
    projections = jl_projections(
        lambda: per_example_loss(sparse_loss(), y, model(x, training=True)),
        weights,
        dimension=2,
        directions=_Fixed(directions + directions),
        before_pass=lambda: restore_seeds(model, states),
    ).numpy()
    np.testing.assert_array_equal(projections[0], projections[1])  # same mask twice
    restore_seeds(model, states)
    with tf.GradientTape(persistent=True) as tape:
        losses = per_example_loss(sparse_loss(), y, model(x, training=True))
    jacobian = tape.jacobian(losses, weights, experimental_use_pfor=False)
    expected = sum(
        np.tensordot(j.numpy(), v, axes=v.ndim) for j, v in zip(jacobian, directions, strict=True)
    )
    np.testing.assert_allclose(projections[0], expected, rtol=1e-10)
    # and a pass without restoring draws a different mask
    other = per_example_loss(sparse_loss(), y, model(x, training=True))
    assert not np.allclose(other.numpy(), losses.numpy())


def test_jl_clipping_of_an_lstm_in_graph_mode_equals_eager_mode() -> None:
    """Forward mode through Keras's recurrent layers needs them unrolled (done while clipping);
    that each LSTM projection is exactly <g, v> is checked above."""
    model = build("lstm")
    x, y = lot("lstm", 5)
    eager, graph = (
        Clipper(model, sparse_loss(), 0.5, method="jl", jl_dimension=2, directions=SeededNormals(4))
        for _ in range(2)
    )
    expected = eager(x, y, training=False)
    norms, summed = tf.function(
        lambda: (lambda lot: (lot.norms, lot.summed))(graph(x, y, training=False))
    )()
    np.testing.assert_allclose(norms.numpy(), expected.norms.numpy(), rtol=1e-10)
    for a, b in zip(summed, expected.summed, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-13)
