"""Exact clipping in TensorFlow: ghost norms and per-example Jacobians equal, in float64, a
one-example-at-a-time ``GradientTape`` loop, on every model kind and at lot sizes that equal the
models' own dimensions; models that mix examples or that a method cannot cover are refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpcore.errors import IncompatibleModelError, InvalidParameterError
from dpcore.tf import ghost
from dpcore.tf.clipping import Clipper
from tests.tf.models import MODELS, build, loop_reference, lot, sparse_loss

RTOL = 1e-10

#: 1, sizes equal to feature/unit/time dimensions of the models (3: classes and LSTM units,
#: 4: embedding width, 5: MLP inputs, 6: sequence length, 7: MLP units, 8: image side), and more.
LOT_SIZES = (1, 3, 4, 5, 6, 7, 8, 13)


def _check(name: str, method: str, size: int) -> None:
    model = build(name)
    x, y = lot(name, size)
    norms, summed = loop_reference(model, sparse_loss(), x, y, max_grad_norm=0.5)
    clipper = Clipper(model, sparse_loss(), 0.5, method=method)
    got = clipper(x, y, training=False)
    np.testing.assert_allclose(got.norms.numpy(), norms, rtol=RTOL)
    np.testing.assert_allclose(got.clip_factors.numpy(), np.minimum(1.0, 0.5 / norms), rtol=RTOL)
    for ours, reference in zip(got.summed, summed, strict=True):
        np.testing.assert_allclose(ours.numpy(), reference, rtol=RTOL, atol=1e-13)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("size", LOT_SIZES)
def test_auto_clipping_equals_the_one_example_loop(name: str, size: int) -> None:
    _check(name, "auto", size)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_jacobian_clipping_equals_the_one_example_loop(name: str) -> None:
    _check(name, "jacobian", 5)


@pytest.mark.parametrize("name", [name for name in sorted(MODELS) if MODELS[name][3]])
@pytest.mark.parametrize("policy", ["gram", "materialised"])
def test_both_ghost_norm_forms_equal_the_one_example_loop(
    name: str, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each layer's norm and sum, from Gram matrices or from materialised per-example kernels
    (the size rule picks one per layer; here every layer is forced to one form)."""

    def forced(a: tf.Tensor, g: tf.Tensor) -> tf.Tensor | None:
        return None if policy == "gram" else tf.einsum("btd,btp->bdp", a, g)

    monkeypatch.setattr(ghost, "per_example_kernel", forced)
    _check(name, "ghost", 6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_auto_picks_ghost_exactly_for_covered_models(name: str) -> None:
    method = Clipper(build(name), sparse_loss(), 1.0).resolved_method()
    assert method == ("ghost" if MODELS[name][3] else "jacobian")


def test_graph_mode_equals_eager_mode() -> None:
    model = build("lstm")
    x, y = lot("lstm", 6)
    clipper = Clipper(model, sparse_loss(), 0.5)
    eager = clipper(x, y, training=False)
    graph = tf.function(lambda a, b: clipper(a, b, training=False).summed)(x, y)
    for a, b in zip(eager.summed, graph, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)


@pytest.mark.parametrize("method", ["ghost", "jacobian"])
def test_an_empty_lot_gives_zero_sums(method: str) -> None:
    model = build("mlp")
    x, y = lot("mlp", 0)
    got = Clipper(model, sparse_loss(), 1.0, method=method)(x, y, training=False)
    assert got.norms.shape == (0,)
    assert all(float(tf.reduce_sum(tf.abs(s))) == 0.0 for s in got.summed)


def test_batch_normalization_is_refused() -> None:
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2),
        ]
    )
    with pytest.raises(IncompatibleModelError, match="BatchNormalization"):
        Clipper(model, sparse_loss(), 1.0)


def test_ghost_refuses_uncovered_and_shared_layers() -> None:
    with pytest.raises(IncompatibleModelError, match="jacobian"):
        Clipper(build("gru"), sparse_loss(), 1.0, method="ghost").resolved_method()
    inputs = keras.Input((3,), dtype="float64")
    shared = keras.layers.Dense(3, dtype="float64")
    model = keras.Model(inputs, keras.layers.Dense(2, dtype="float64")(shared(shared(inputs))))
    clipper = Clipper(model, sparse_loss(), 1.0, method="ghost")
    x = tf.constant(np.ones((2, 3)))
    with pytest.raises(IncompatibleModelError, match="more than once"):
        clipper(x, tf.constant([0, 1]))
    # the Jacobian path is exact for the shared layer
    norms, _ = loop_reference(model, sparse_loss(), x, tf.constant([0, 1]), 1.0)
    got = Clipper(model, sparse_loss(), 1.0, method="jacobian")(x, tf.constant([0, 1]))
    np.testing.assert_allclose(got.norms.numpy(), norms, rtol=RTOL)


def test_nonfinite_gradients_stop_the_step() -> None:
    model = build("mlp")
    x, y = lot("mlp", 4)
    x = tf.tensor_scatter_nd_update(x, [[2, 0]], [np.nan])
    for method in ("ghost", "jacobian"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="NonFiniteGradientError"):
            Clipper(model, sparse_loss(), 1.0, method=method)(x, y, training=False)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"max_grad_norm": float("nan")}, "max_grad_norm"),
        ({"method": "fast"}, "method"),
        ({"method": "jl"}, "jl_dimension"),
        ({"jl_dimension": 3}, "jl_dimension"),
        ({"method": "jl", "jl_dimension": 0}, "jl_dimension"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, object], parameter: str) -> None:
    arguments = {"max_grad_norm": 1.0, **kwargs}
    max_grad_norm = arguments.pop("max_grad_norm")
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        Clipper(build("mlp"), sparse_loss(), max_grad_norm, **arguments)  # type: ignore[arg-type]


def test_a_scalar_loss_is_refused() -> None:
    model = build("mlp")
    x, y = lot("mlp", 3)
    mean_loss = keras.losses.get("sparse_categorical_crossentropy")
    clipper = Clipper(model, lambda t, p: tf.reduce_mean(mean_loss(t, p)), 1.0)
    with pytest.raises(InvalidParameterError, match="one value per example"):
        clipper(x, y)
