"""Exact per-example gradients of any Keras model: the Jacobian of the per-example losses.

``tape.jacobian(losses, weights)`` gives ``d loss_i / d w`` for every example i, vectorised
over examples by TensorFlow's ``pfor`` (the same machinery as ``tf.vectorized_map``). When no
layer mixes examples this equals each example's own gradient. It materialises B copies of the
weights' size, so it is the path for models :mod:`dpcore.tf.ghost` does not cover (e.g. LSTMs).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["per_example_gradients"]


def per_example_gradients(
    tape: tf.GradientTape, losses: tf.Tensor, weights: list[tf.Variable]
) -> list[tf.Tensor]:
    """``[d losses / d w]`` for each weight, each of shape ``(B, *w.shape)``."""
    if losses.shape.rank == 1 and losses.shape[0] == 0:  # an empty lot (eager jacobian fails)
        return [tf.zeros((0, *w.shape), w.dtype) for w in weights]
    gradients: list[tf.Tensor] = tape.jacobian(
        losses,
        weights,
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
        experimental_use_pfor=True,
    )
    return gradients
