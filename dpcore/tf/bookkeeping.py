"""The clipped sum from the same captured tensors as the ghost norms, without a second backward.

Book-keeping (Bu, Wang, Zha, Karypis 2022, "Differentially private optimization on large model
at small cost", §3): once the clip factors c_i are known, each covered layer's clipped gradient
sum is ``sum_i c_i A_i^T G_i = A^T (c * G)`` from the inputs A and output gradients G that the
norms already used, so the weights' gradients need no second pass through the network:

- Dense: kernel ``A^T (c G)`` over all positions (or ``sum_i c_i A_i^T G_i`` where the norm
  already materialised the per-example kernels), bias ``sum c G``;
- Conv1D/2D: the same with A = the input patches, reshaped to the kernel's shape;
- Embedding: the rows of ``c G`` summed by token id;
- LayerNormalization: gamma ``sum c G x_hat``, beta ``sum c G`` over everything but the
  normalised axes;
- LSTM cell: kernel ``sum_t x_t^T (c delta_t)``, recurrent kernel with ``h_{t-1}``, bias.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

__all__ = ["layer_sums", "lstm_sums"]


def _scaled(g: tf.Tensor, factors: tf.Tensor) -> tf.Tensor:
    shape = tf.concat([tf.shape(factors), tf.ones([g.shape.rank - 1], tf.int32)], axis=0)
    return g * tf.reshape(tf.cast(factors, g.dtype), shape)


def _flat(tensor: tf.Tensor) -> tf.Tensor:
    return tf.reshape(tensor, [-1, tf.shape(tensor)[-1]])


def _kernel_sum(
    a: tf.Tensor, cg: tf.Tensor, factors: tf.Tensor, per_example: tf.Tensor | None
) -> tf.Tensor:
    """``sum_i c_i A_i^T G_i``: from the materialised (B, d, p) kernels if the norm made them."""
    if per_example is not None:
        return tf.tensordot(tf.cast(factors, per_example.dtype), per_example, axes=1)
    return tf.matmul(_flat(a), _flat(cg), transpose_a=True)


def layer_sums(
    kind: str,
    layer: keras.layers.Layer,
    a: tf.Tensor,
    g: tf.Tensor,
    factors: tf.Tensor,
    per_example: tf.Tensor | None = None,
) -> dict[int, tf.Tensor]:
    """``{id(weight): clipped sum}`` for one non-recurrent layer.

    ``a`` is what the norm used as the layer's input: (B, T, d) for Dense, the patches for
    Conv, the token ids for Embedding, ``x_hat`` for LayerNormalization; ``per_example``: the
    per-example kernel gradients if the norm materialised them.
    """
    cg = _scaled(g, factors)
    if kind in ("dense", "conv"):
        kernel = _kernel_sum(a, cg, factors, per_example)
        sums = {id(layer.kernel): tf.reshape(kernel, layer.kernel.shape)}
        if getattr(layer, "bias", None) is not None:
            sums[id(layer.bias)] = tf.reduce_sum(_flat(cg), axis=0)
        return sums
    if kind == "embedding":
        ids = tf.reshape(tf.cast(a, tf.int64), [-1])
        rows = tf.math.unsorted_segment_sum(_flat(cg), ids, layer.input_dim)
        return {id(layer.embeddings): rows}
    # layer normalisation: sum over every axis but the normalised ones
    axes = layer.axis if isinstance(layer.axis, list | tuple) else [layer.axis]
    axes = [axis % g.shape.rank for axis in axes]
    others = [axis for axis in range(g.shape.rank) if axis not in axes]
    sums = {}
    if layer.scale:
        sums[id(layer.gamma)] = tf.reshape(tf.reduce_sum(cg * a, axis=others), layer.gamma.shape)
    if layer.center:
        sums[id(layer.beta)] = tf.reshape(tf.reduce_sum(cg, axis=others), layer.beta.shape)
    return sums


def lstm_sums(
    cell: keras.layers.Layer,
    x: tf.Tensor,
    h: tf.Tensor,
    g: tf.Tensor,
    factors: tf.Tensor,
    per_example: tuple[tf.Tensor | None, ...] = (None, None),
) -> dict[int, tf.Tensor]:
    """``{id(weight): clipped sum}`` of an LSTM cell from (B, T, .) inputs, states and deltas
    (``per_example``: the kernel's and the recurrent kernel's, if the norm materialised them)."""
    cg = _scaled(g, factors)
    sums = {
        id(cell.kernel): _kernel_sum(x, cg, factors, per_example[0]),
        id(cell.recurrent_kernel): _kernel_sum(h, cg, factors, per_example[1]),
    }
    if cell.use_bias:
        sums[id(cell.bias)] = tf.reduce_sum(_flat(cg), axis=0)
    return sums


def ordered(sums: dict[int, tf.Tensor], weights: list[Any]) -> list[tf.Tensor]:
    """The sums in the order of ``weights`` (cast to each weight's dtype)."""
    return [tf.cast(sums[id(w)], w.dtype) for w in weights]
