"""Exact per-example gradient norms without per-example gradients ("ghost" norms).

For a layer whose weight gradient of example i is ``A_i^T G_i`` (A_i: the layer's inputs at
each position, G_i: the loss gradient at its pre-activation outputs), the squared norm is
``<A_i A_i^T, G_i G_i^T>`` (Goodfellow 2015 for one position; Li et al. 2022, "Large language
models can be strong differentially private learners", §4, for sequences), or ``||A_i^T G_i||^2``
from the materialised per-example gradient when that is no larger than A and G (or than the
Gram matrices; :func:`per_example_kernel`), which then also gives the clipped sum. Covered
layers:

- ``Dense`` (inputs of any rank; positions are the middle axes), bias ``sum_t G_it``;
- ``Conv1D`` / ``Conv2D`` (channels last, one group): A = the input patches;
- ``Embedding``: ``||sum_t onehot(id_t) g_t^T||^2``, summing the rows of equal ids per example;
- ``LayerNormalization``: gamma ``sum x_hat * G``, beta ``sum G`` (small, materialised);
- ``LSTM`` cells (also inside ``Bidirectional``; no dropout in the cell): the gate
  pre-activations ``z_t = x_t W + h_{t-1} U + b`` make W and U two Dense layers over the time
  steps, with inputs ``x_t`` and ``h_{t-1}``; capturing unrolls the layer so that every ``z_t``
  is a tensor of the graph.

A model qualifies when every trainable weight belongs to exactly one covered layer, each called
once per forward pass, with no layer mixing examples (``BatchNormalization`` is refused
earlier). Capturing replaces each covered layer's ``call`` for one forward pass by a copy of
Keras's own that also records inputs and pre-activations; Dense, Conv and the LSTM cell run the
same ops as Keras, so the forward pass is unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "GhostCapture",
    "ghost_supported",
    "layers_with_weights",
    "per_example_kernel",
    "recurrent_layers",
    "unrolled",
]

_Record = tuple[str, keras.layers.Layer, tf.Tensor, tf.Tensor]


def layers_with_weights(model: keras.Model) -> list[keras.layers.Layer]:
    """Every layer (nested ones included) that owns a trainable weight of ``model``."""
    found = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        own = {id(w) for w in layer.trainable_weights}
        children = {
            id(w)
            for child in layer._flatten_layers(include_self=False, recursive=True)
            for w in child.trainable_weights
        }
        if own - children:
            found.append(layer)
    return found


def _kind(layer: keras.layers.Layer) -> str | None:
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return None
    if type(layer) is keras.layers.Dense:
        return "dense"
    if type(layer) is keras.layers.Embedding:
        return "embedding"
    if type(layer) in (keras.layers.Conv1D, keras.layers.Conv2D):
        ok = layer.data_format == "channels_last" and layer.groups == 1
        return "conv" if ok and layer.padding in ("valid", "same") else None
    if type(layer) is keras.layers.LayerNormalization and not layer.rms_scaling:
        return "layer_norm"
    if (
        type(layer) is keras.layers.LSTMCell
        and layer.implementation == 2
        and layer.dropout == 0
        and layer.recurrent_dropout == 0
    ):
        return "lstm"
    return None


def _rnn_parents(model: keras.Model) -> dict[int, list[keras.layers.Layer]]:
    parents: dict[int, list[keras.layers.Layer]] = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        cell = getattr(layer, "cell", None)
        if isinstance(layer, keras.layers.RNN) and cell is not None:
            parents.setdefault(id(cell), []).append(layer)
    return parents


def ghost_supported(model: keras.Model) -> bool:
    """Whether every trainable weight of ``model`` sits in a layer with a ghost norm."""
    layers = layers_with_weights(model)
    if not layers or any(_kind(layer) is None for layer in layers):
        return False
    parents = _rnn_parents(model)
    for layer in layers:
        if _kind(layer) == "lstm" and len(parents.get(id(layer), ())) != 1:
            return False
    covered = [id(w) for layer in layers for w in layer.trainable_weights]
    return sorted(covered) == sorted(id(w) for w in model.trainable_weights)


def _flat(tensor: tf.Tensor) -> tf.Tensor:
    """(B, positions, features): every middle axis is a position."""
    shape = tf.shape(tensor)
    return tf.reshape(tensor, [shape[0], -1, shape[-1]])


def per_example_kernel(a: tf.Tensor, g: tf.Tensor) -> tf.Tensor | None:
    """``A_i^T G_i`` for every example, (B, d, p), or None where the ghost norm is cheaper.

    Materialised when that holds no more numbers than A and G themselves (``d p <= T (d + p)``)
    or fewer than the Gram matrices (``d p < T^2``): then the norm is one batched matmul instead
    of two (``T^2 (d + p)`` per example) and the clipped sum ``sum_i c_i A_i^T G_i`` is a
    weighted sum of these instead of a third matmul. Never for one position (``T = 1``), where
    the norm is a product of two vector norms.
    """
    t, d, p = a.shape[1], a.shape[2], g.shape[2]
    if t is None or d is None or p is None or t == 1:
        return None
    if t * t > d * p or d * p <= t * (d + p):
        return tf.einsum("btd,btp->bdp", a, g)
    return None


def _outer_norm2(a: tf.Tensor, g: tf.Tensor, kernel: tf.Tensor | None) -> tf.Tensor:
    """``||A_i^T G_i||_F^2`` per example for A (B, T, d), G (B, T, p); ``kernel``: see above."""
    if kernel is not None:
        return _row_sums(tf.square(kernel))
    if a.shape[1] == 1:
        return tf.reduce_sum(a[:, 0] ** 2, axis=1) * tf.reduce_sum(g[:, 0] ** 2, axis=1)
    return _row_sums(tf.einsum("btd,bsd->bts", a, a) * tf.einsum("btp,bsp->bts", g, g))


def _row_sums(tensor: tf.Tensor) -> tf.Tensor:
    """Sum over every axis but the first (flattened first: a faster reduction on CPU)."""
    return tf.reduce_sum(tf.reshape(tensor, [tf.shape(tensor)[0], -1]), axis=1)


def _bias_norm2(g: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(tf.reduce_sum(g, axis=1) ** 2, axis=1)


#: From this many input channels :func:`_patches` gathers whole channel vectors; below it a
#: one-hot depthwise convolution copies them (each is the faster side on CPU, measured for
#: 1, 3, 16 and 32 channels in float32 and float64).
GATHER_CHANNELS = 8


def _patches(layer: keras.layers.Layer, inputs: tf.Tensor) -> tf.Tensor:
    """The input patches of a channels-last convolution, (B, positions, k * C_in), each patch
    in the kernel's layout (window position, then channel) as ``tf.image.extract_patches``.

    Both ways copy every element exactly: a gather of whole channel vectors by precomputed
    indices, or a depthwise convolution with one-hot filters (``x * 1`` plus zeros; equal
    strides only) whose (channel, window) output is then transposed. Either is several times
    faster on CPU than ``extract_patches``, whose inner copy is one channel vector long; that
    remains for images of unknown size.
    """
    if layer.rank == 1:
        inputs = inputs[:, tf.newaxis]
        sizes, strides, rates = (
            (1, *layer.kernel_size),
            (1, *layer.strides),
            (1, *layer.dilation_rate),
        )
    else:
        sizes, strides, rates = layer.kernel_size, layer.strides, layer.dilation_rate
    channels, window = inputs.shape[-1], sizes[0] * sizes[1]
    static = None not in inputs.shape[1:]
    if static and (channels >= GATHER_CHANNELS or strides[0] != strides[1]):
        return _gathered_patches(inputs, sizes, strides, rates, layer.padding)
    if not static or strides[0] != strides[1]:  # the depthwise kernel needs equal strides
        patches = tf.image.extract_patches(
            inputs, [1, *sizes, 1], [1, *strides, 1], [1, *rates, 1], layer.padding.upper()
        )
        return _flat(patches)
    one_hot = tf.reshape(tf.eye(window, dtype=inputs.dtype), [*sizes, 1, window])
    patches = tf.nn.depthwise_conv2d(
        inputs,
        tf.tile(one_hot, [1, 1, channels, 1]),
        strides=[1, *strides, 1],
        padding=layer.padding.upper(),
        dilations=rates,
    )
    batch = tf.shape(inputs)[0]
    patches = tf.transpose(tf.reshape(patches, [batch, -1, channels, window]), [0, 1, 3, 2])
    return tf.reshape(patches, [batch, -1, window * channels])


def _gathered_patches(
    inputs: tf.Tensor,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    rates: tuple[int, ...],
    padding: str,
) -> tf.Tensor:
    """:func:`_patches` by one gather; "same" pads as TensorFlow does (the extra row after)."""
    pads, outputs, padded = [], [], []
    for n, k, s, r in zip(inputs.shape[1:3], sizes, strides, rates, strict=True):
        span = (k - 1) * r + 1
        out = -(-n // s) if padding == "same" else (n - span) // s + 1
        total = max((out - 1) * s + span - n, 0) if padding == "same" else 0
        pads.append([total // 2, total - total // 2])
        outputs.append(out)
        padded.append(n + total)
    rows = np.arange(outputs[0])[:, None, None, None] * strides[0]
    rows = rows + np.arange(sizes[0])[None, None, :, None] * rates[0]
    cols = np.arange(outputs[1])[None, :, None, None] * strides[1]
    cols = cols + np.arange(sizes[1])[None, None, None, :] * rates[1]
    index = (rows * padded[1] + cols).reshape(-1)
    channels = inputs.shape[-1]
    flat = tf.reshape(
        tf.pad(inputs, [[0, 0], *pads, [0, 0]]), [-1, padded[0] * padded[1], channels]
    )
    patches = tf.gather(flat, index, axis=1)
    return tf.reshape(patches, [-1, outputs[0] * outputs[1], sizes[0] * sizes[1] * channels])


def _embedding_norm2(ids: tf.Tensor, g: tf.Tensor, vocabulary: int) -> tf.Tensor:
    """Rows of equal id summed within each example, then squared norms summed per example."""
    g = _flat(g)
    batch = tf.shape(g)[0]
    ids = tf.reshape(tf.cast(ids, tf.int64), [batch, -1])
    keys = ids + tf.range(tf.cast(batch, tf.int64), dtype=tf.int64)[:, None] * vocabulary
    unique, segment = tf.unique(tf.reshape(keys, [-1]))
    sums = tf.math.unsorted_segment_sum(
        tf.reshape(g, [-1, tf.shape(g)[2]]), segment, tf.shape(unique)[0]
    )
    owner = unique // vocabulary
    return tf.math.unsorted_segment_sum(tf.reduce_sum(sums**2, axis=1), owner, batch)


def recurrent_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """Every ``keras.layers.RNN`` (LSTM, GRU, ...) in ``model``, nested ones included."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.RNN)
    ]


@contextlib.contextmanager
def unrolled(rnns: list[keras.layers.Layer]) -> Iterator[None]:
    """Within the block the layers unroll their time loop and skip fused (cuDNN) kernels.

    Forward-mode differentiation cannot go through the graph ``while_loop`` of Keras's RNNs, and
    ghost norms need each step's pre-activations as tensors; unrolled, both work. The time
    dimension must be static.
    """
    saved = [(rnn.unroll, getattr(rnn, "use_cudnn", None)) for rnn in rnns]
    for rnn in rnns:
        rnn.unroll = True
        if hasattr(rnn, "use_cudnn"):
            rnn.use_cudnn = False
    try:
        yield
    finally:
        for rnn, (unroll, cudnn) in zip(rnns, saved, strict=True):
            rnn.unroll = unroll
            if cudnn is not None:
                rnn.use_cudnn = cudnn


class GhostCapture:
    """Records each covered layer's inputs and pre-activation outputs during one forward pass."""

    def __init__(self, model: keras.Model) -> None:
        self.layers = layers_with_weights(model)
        parents = _rnn_parents(model)
        self.rnns = [rnn for layer in self.layers for rnn in parents.get(id(layer), ())]
        self.records: list[_Record] = []

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Within the block, covered layers record what they see (each must run once)."""
        self.records = []
        for layer in self.layers:
            layer.call = self._wrapped(layer)
        try:
            with unrolled(self.rnns):  # every time step's pre-activations in the graph
                yield
        finally:
            for layer in self.layers:
                del layer.call

    def _wrapped(self, layer: keras.layers.Layer) -> Callable[..., Any]:
        kind = _kind(layer)
        ops = keras.ops

        def dense(inputs: Any, training: Any = None) -> Any:
            z = ops.matmul(inputs, layer.kernel)
            if layer.bias is not None:
                z = ops.add(z, layer.bias)
            self.records.append(("dense", layer, inputs, z))
            return layer.activation(z) if layer.activation is not None else z

        def conv(inputs: Any) -> Any:
            z = layer.convolution_op(inputs, layer.kernel)
            if layer.use_bias:
                z = ops.add(z, ops.reshape(layer.bias, (1,) * (layer.rank + 1) + (layer.filters,)))
            self.records.append(("conv", layer, inputs, z))
            return layer.activation(z) if layer.activation is not None else z

        def lstm(inputs: Any, states: Any, training: Any = False) -> Any:
            h_tm1, c_tm1 = states[0], states[1]
            z = ops.matmul(inputs, layer.kernel)
            z = ops.add(z, ops.matmul(h_tm1, layer.recurrent_kernel))
            if layer.use_bias:
                z = ops.add(z, layer.bias)
            self.records.append(("lstm", layer, (inputs, h_tm1), z))
            c, o = layer._compute_carry_and_output_fused(ops.split(z, 4, axis=1), c_tm1)
            h = o * layer.activation(c)
            return h, [h, c]

        original = type(layer).call

        def recorded(inputs: Any, *args: Any, **kwargs: Any) -> Any:
            outputs = original(layer, inputs, *args, **kwargs)
            self.records.append((kind, layer, inputs, outputs))  # type: ignore[arg-type]
            return outputs

        wrappers: dict[str | None, Callable[..., Any]] = {
            "dense": dense,
            "conv": conv,
            "lstm": lstm,
        }
        return wrappers.get(kind, recorded)

    def check_complete(self) -> None:
        """Each covered layer ran exactly once (a shared layer needs cross terms: refused)."""
        counts = {id(layer): 0 for layer in self.layers}
        for _, layer, _, _ in self.records:
            counts[id(layer)] += 1
        for layer in self.layers:  # an LSTM cell runs once per time step
            if counts[id(layer)] != 1 and not (_kind(layer) == "lstm" and counts[id(layer)] >= 1):
                raise NotGhostableError

    @property
    def outputs(self) -> list[tf.Tensor]:
        """The tensors whose loss gradients the norms need, in record order."""
        return [record[3] for record in self.records]

    def _prepared(self, output_grads: list[tf.Tensor]) -> list[tuple[str, Any, tuple[Any, ...]]]:
        """Per layer: (kind, layer, the tensors its norm and sums need)."""
        prepared: list[tuple[str, Any, tuple[Any, ...]]] = []
        steps: dict[int, list[tuple[Any, tf.Tensor]]] = {}
        for (kind, layer, inputs, _), g in zip(self.records, output_grads, strict=True):
            if kind == "lstm":
                steps.setdefault(id(layer), []).append((inputs, g))
            else:
                prepared.append((kind, layer, _operands(kind, layer, inputs, g)))
        for layer in self.layers:
            if id(layer) in steps:
                g = tf.stack([delta for _, delta in steps[id(layer)]], axis=1)
                x = tf.stack([inputs for (inputs, _), _ in steps[id(layer)]], axis=1)
                h = tf.stack([h_tm1 for (_, h_tm1), _ in steps[id(layer)]], axis=1)
                prepared.append(("lstm", layer, (tf.cast(x, g.dtype), tf.cast(h, g.dtype), g)))
        return prepared

    def norms_and_sums(
        self, output_grads: list[tf.Tensor], max_grad_norm: float, weights: list[Any]
    ) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
        """Per-example norms, clip factors, and the clipped sums in the order of ``weights``."""
        from dpcore.tf.bookkeeping import layer_sums, lstm_sums, ordered
        from dpcore.tf.clipping import clip_factors

        prepared = self._prepared(output_grads)
        kernels = [_kernels(kind, operands) for kind, _, operands in prepared]
        squared = tf.add_n(
            [
                _squared(kind, layer, operands, kernel)
                for (kind, layer, operands), kernel in zip(prepared, kernels, strict=True)
            ]
        )
        norms = tf.sqrt(tf.maximum(squared, 0.0))
        factors = clip_factors(norms, max_grad_norm)
        sums: dict[int, tf.Tensor] = {}
        for (kind, layer, operands), kernel in zip(prepared, kernels, strict=True):
            if kind == "lstm":
                x, h, g = operands
                sums.update(lstm_sums(layer, x, h, g, factors, kernel))
            else:
                a, g = operands
                sums.update(layer_sums(kind, layer, a, g, factors, kernel[0] if kernel else None))
        return norms, factors, ordered(sums, weights)


class NotGhostableError(Exception):
    """The model's forward pass does not qualify for ghost norms (see the module docstring)."""


def _operands(kind: str, layer: keras.layers.Layer, inputs: Any, g: tf.Tensor) -> tuple[Any, ...]:
    """``(A, G)``: Dense (B, T, d) inputs, Conv patches, Embedding ids, LayerNorm ``x_hat``."""
    dtype = g.dtype
    if kind == "dense":
        return _flat(tf.cast(inputs, dtype)), _flat(g)
    if kind == "conv":
        return _patches(layer, tf.cast(inputs, dtype)), _flat(g)
    if kind == "embedding":
        return inputs, g
    x = tf.cast(inputs, dtype)
    axes = layer.axis if isinstance(layer.axis, list | tuple) else [layer.axis]
    axes = [a % x.shape.rank for a in axes]
    mean, variance = tf.nn.moments(x, axes=axes, keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + layer.epsilon), g


def _kernels(kind: str, operands: tuple[Any, ...]) -> tuple[tf.Tensor | None, ...]:
    """The materialised per-example kernel gradients (:func:`per_example_kernel`), if any:
    one for Dense and Conv, two for an LSTM cell (kernel, recurrent kernel), none otherwise."""
    if kind == "lstm":
        x, h, g = operands
        return per_example_kernel(x, g), per_example_kernel(h, g)
    if kind in ("dense", "conv"):
        return (per_example_kernel(*operands),)
    return ()


def _squared(
    kind: str,
    layer: keras.layers.Layer,
    operands: tuple[Any, ...],
    kernels: tuple[tf.Tensor | None, ...],
) -> tf.Tensor:
    """Per-example squared norm of one layer's weight gradients (the module docstring)."""
    if kind == "lstm":
        x, h, g = operands
        total = _outer_norm2(x, g, kernels[0]) + _outer_norm2(h, g, kernels[1])
        return total + _bias_norm2(g) if layer.use_bias else total
    a, g = operands
    if kind in ("dense", "conv"):
        out = _outer_norm2(a, g, kernels[0])
        has_bias = layer.bias is not None if kind == "dense" else layer.use_bias
        return out + _bias_norm2(g) if has_bias else out
    if kind == "embedding":
        return _embedding_norm2(a, g, layer.input_dim)
    rank = g.shape.rank
    axes = layer.axis if isinstance(layer.axis, list | tuple) else [layer.axis]
    axes = [axis % rank for axis in axes]
    others = [axis for axis in range(1, rank) if axis not in axes]
    batch = tf.shape(g)[0]
    total = tf.zeros([batch], g.dtype)
    if layer.scale:
        gamma = tf.reduce_sum(g * a, axis=others) if others else g * a
        total += tf.reduce_sum(tf.reshape(gamma, [batch, -1]) ** 2, axis=1)
    if layer.center:
        beta = tf.reduce_sum(g, axis=others) if others else g
        total += tf.reduce_sum(tf.reshape(beta, [batch, -1]) ** 2, axis=1)
    return total
