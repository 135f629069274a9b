"""The TensorFlow engine agrees with the torch engine: same architecture, copied weights, same
lot -> per-example norms, clip factors and clipped sums equal to 1e-5 relative in float32.

Models: an MLP, the TF Privacy tutorial CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`)
and the JL paper's IMDb model, Embedding + bidirectional LSTM (:func:`dpcore.torch.models.imdb_lstm`
with ``DPLSTM``: one bias per gate, as Keras), each at a small size. Torch's layouts are mapped to
Keras's: Linear weights transposed, Conv2d ``(out, in, kh, kw) -> (kh, kw, in, out)`` with NHWC
images (so the first Dense after ``Flatten`` is re-indexed from (C, H, W) to (H, W, C)), LSTM
``(4H, in) -> (in, 4H)`` with the same gate order (i, f, g/c, o).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
import torch
from torch import nn

from dpcore.tf.clipping import Clipper
from dpcore.torch.engines import make_engine
from dpcore.torch.models import imdb_lstm, tf_privacy_mnist_cnn
from tests.tf.models import tf_privacy_cnn

RTOL = 1e-5


def _t(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy()


def _mlp() -> tuple[nn.Module, keras.Model, list[Callable[[np.ndarray], np.ndarray]], dict]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(4)]
    )
    model.set_weights([_t(net[0].weight).T, _t(net[0].bias), _t(net[2].weight).T, _t(net[2].bias)])
    to_keras = [np.transpose, lambda b: b, np.transpose, lambda b: b]
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(9, 6)).astype("float32"), "y": rng.integers(0, 4, 9)}
    return net, model, to_keras, data


def _cnn() -> tuple[nn.Module, keras.Model, list[Callable[[np.ndarray], np.ndarray]], dict]:
    torch.manual_seed(0)
    net = tf_privacy_mnist_cnn(hidden=8)
    model = tf_privacy_cnn(hidden=8)

    def conv(w: np.ndarray) -> np.ndarray:
        return np.transpose(w, (2, 3, 1, 0))

    def flat_dense(w: np.ndarray) -> np.ndarray:  # (hidden, C*H*W) -> (H*W*C, hidden)
        return np.transpose(w.reshape(-1, 32, 4, 4), (2, 3, 1, 0)).reshape(-1, w.shape[0])

    to_keras = [conv, lambda b: b, conv, lambda b: b, flat_dense, lambda b: b, np.transpose]
    to_keras.append(lambda b: b)
    params = [p for p in net.parameters()]
    model.set_weights([f(_t(p)) for f, p in zip(to_keras, params, strict=True)])
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(7, 28, 28, 1)).astype("float32")
    return net, model, to_keras, {"x": images, "y": rng.integers(0, 10, 7), "nchw": True}


def _lstm() -> tuple[nn.Module, keras.Model, list[Callable[[np.ndarray], np.ndarray]], dict]:
    torch.manual_seed(0)
    net = imdb_lstm(vocab_size=50, embedding_dim=6, hidden_size=5)
    model = keras.Sequential(
        [
            keras.Input((12,), dtype="int32"),
            keras.layers.Embedding(50, 6),
            keras.layers.Bidirectional(keras.layers.LSTM(5)),
            keras.layers.Dense(5, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    trainable = [p for p in net.parameters() if p.requires_grad]
    # torch order: embedding, (input projection W, b, recurrent W_hh) x 2 directions, dense, out
    same = lambda w: w  # noqa: E731
    to_keras = [same, np.transpose, same, np.transpose, np.transpose, same, np.transpose]
    to_keras += [np.transpose, same, np.transpose, same]
    mapped = [f(_t(p)) for f, p in zip(to_keras, trainable, strict=True)]
    # keras order per direction: kernel, recurrent_kernel, bias
    order = [0, 1, 3, 2, 4, 6, 5, 7, 8, 9, 10]
    model.set_weights([mapped[i] for i in order])
    rng = np.random.default_rng(0)
    data = {"x": rng.integers(0, 50, (6, 12)), "y": rng.integers(0, 2, 6), "order": order}
    return net, model, to_keras, data


def _torch_lot(net: nn.Module, data: dict, clip: float) -> object:
    x = torch.from_numpy(np.asarray(data["x"]))
    if data.get("nchw"):
        x = x.permute(0, 3, 1, 2).contiguous()
    binary = isinstance(net, type(imdb_lstm(vocab_size=2, embedding_dim=1, hidden_size=1)))
    y = torch.from_numpy(np.asarray(data["y"]))
    loss = (
        nn.BCEWithLogitsLoss(reduction="none") if binary else nn.CrossEntropyLoss(reduction="none")
    )
    engine = make_engine(net, engine="auto", max_grad_norm=clip)
    return engine.clipped_sum(x, y.float() if binary else y, loss), binary


@pytest.mark.parametrize("build", [_mlp, _cnn, _lstm], ids=["mlp", "cnn", "bilstm"])
def test_norms_factors_and_clipped_sums_agree_with_torch(build: Callable) -> None:
    net, model, to_keras, data = build()
    unclipped, _ = _torch_lot(net, data, 1e9)
    clip = float(np.median(_t(unclipped.norms)))  # half the examples clipped, half not
    theirs, binary = _torch_lot(net, data, clip)
    if binary:
        loss = keras.losses.BinaryCrossentropy(from_logits=True)
        y = tf.constant(np.asarray(data["y"], "float32")[:, None])
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        y = tf.constant(data["y"])
    ours = Clipper(model, loss, clip)(tf.constant(data["x"]), y, training=False)
    norms = _t(theirs.norms)
    assert (norms > clip * 1.001).any() and (norms < clip * 0.999).any()
    np.testing.assert_allclose(ours.norms.numpy(), norms, rtol=RTOL)
    np.testing.assert_allclose(ours.clip_factors.numpy(), _t(theirs.clip_factors), rtol=RTOL)
    mapped = [f(_t(s)) for f, s in zip(to_keras, theirs.summed, strict=True)]
    if "order" in data:
        mapped = [mapped[i] for i in data["order"]]
    for got, expected in zip(ours.summed, mapped, strict=True):
        scale = np.max(np.abs(expected))
        np.testing.assert_allclose(got.numpy(), expected, rtol=RTOL, atol=RTOL * scale)
