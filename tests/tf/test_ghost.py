"""Ghost-norm internals: the convolution patches equal ``tf.image.extract_patches`` bit for bit
(both ways of copying them, every padding, stride, dilation, Conv1D and Conv2D), and the size
rule that decides when per-example kernels are materialised."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpcore.tf import ghost

#: (rank, filters, kernel, strides, padding, dilation, input shape without the batch)
LAYERS = [
    (2, 4, 3, 2, "same", 1, (9, 8, 3)),
    (2, 4, (4, 2), (2, 3), "valid", 1, (13, 11, 16)),
    (2, 2, 8, 2, "same", 1, (28, 28, 1)),
    (2, 3, 3, 1, "same", 2, (7, 9, 10)),
    (2, 3, (2, 3), 1, "valid", (2, 1), (6, 7, 2)),
    (1, 3, 3, 1, "same", 2, (6, 4)),
    (1, 5, 4, 3, "valid", 1, (17, 9)),
    (1, 2, 2, 2, "same", 1, (5, 12)),
]


def _reference(layer: keras.layers.Layer, x: tf.Tensor) -> np.ndarray:
    if layer.rank == 1:
        x = x[:, tf.newaxis]
        sizes, strides, rates = [
            (1, *v) for v in (layer.kernel_size, layer.strides, layer.dilation_rate)
        ]
    else:
        sizes, strides, rates = layer.kernel_size, layer.strides, layer.dilation_rate
    patches = tf.image.extract_patches(
        x, [1, *sizes, 1], [1, *strides, 1], [1, *rates, 1], layer.padding.upper()
    )
    return tf.reshape(patches, [x.shape[0], -1, patches.shape[-1]]).numpy()


@pytest.mark.parametrize("spec", LAYERS)
@pytest.mark.parametrize("way", ["gather", "depthwise", "unknown size"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_patches_equal_extract_patches_bit_for_bit(
    spec: tuple, way: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank, filters, kernel, strides, padding, dilation, shape = spec
    conv = keras.layers.Conv1D if rank == 1 else keras.layers.Conv2D
    layer = conv(
        filters, kernel, strides=strides, padding=padding, dilation_rate=dilation, dtype=dtype
    )
    x = tf.constant(np.random.default_rng(0).normal(size=(3, *shape)), dtype)
    layer.build(x.shape)
    monkeypatch.setattr(ghost, "GATHER_CHANNELS", 1 if way == "gather" else 10**9)
    if way == "unknown size":  # spatial sizes known only when the graph runs
        spec = tf.TensorSpec([None] * len(shape) + [shape[-1]], dtype)
        got = tf.function(lambda t: ghost._patches(layer, t), input_signature=[spec])(x).numpy()
    else:
        got = ghost._patches(layer, x).numpy()
    expected = _reference(layer, x)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    # the kernel's layout: the patches times the flattened kernel give Keras's own output
    out = tf.reshape(layer.convolution_op(x, layer.kernel), [3, -1, filters]).numpy()
    np.testing.assert_allclose(
        got @ layer.kernel.numpy().reshape(-1, filters), out, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("t", "d", "p", "materialised"),
    [
        (1, 500, 500, False),  # one position: a product of two vector norms
        (196, 64, 16, True),  # first conv of the MNIST CNN: T^2 > d p
        (100, 288, 64, True),  # d p <= T (d + p): no more numbers than A and G
        (25, 256, 32, False),  # Gram matrices 25 x 25 and d p > T (d + p)
        (16, 1152, 128, False),  # a wide late layer: materialising would hold 147k per example
    ],
)
def test_per_example_kernels_are_materialised_only_when_small(
    t: int, d: int, p: int, materialised: bool
) -> None:
    a, g = tf.zeros([2, t, d]), tf.zeros([2, t, p])
    kernel = ghost.per_example_kernel(a, g)
    assert (kernel is not None) == materialised
    if kernel is not None:
        assert kernel.shape == (2, d, p)
