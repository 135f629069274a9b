"""Per-example gradient norms estimated by JL projections (Bu et al. 2021, Alg. 2).

For r directions v_j ~ N(0, I) over all trainable weights, forward-mode differentiation
(``tf.autodiff.ForwardAccumulator``, the paper's jvp method) gives every example's ``<g_i, v_j>``
in one forward pass per direction; ``||g_i||^2 ≈ (1/r) sum_j <g_i, v_j>^2``, which is
``||g_i||^2 chi^2_r / r`` exactly in law (Bu et al. 2021, §3). The clip factors use the estimate;
the accountant uses the matching JL event (:class:`~dpcore.events.JLGaussianEvent`).

Dropout and other random layers must see the same masks in every projection and in the clipped
pass: the caller restores the model's seed generators before each pass (:func:`seed_states`).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from dpcore.tf.noise import NormalSource

__all__ = ["jl_projections", "jl_squared_norms", "restore_seeds", "seed_states"]


def _seed_generators(model: keras.Model) -> list[keras.random.SeedGenerator]:
    found: list[keras.random.SeedGenerator] = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        found.extend(getattr(layer, "_seed_generators", ()))
    return found


def seed_states(model: keras.Model) -> list[tf.Tensor]:
    """The current states of every seed generator in ``model`` (dropout and friends)."""
    return [tf.identity(generator.state.value) for generator in _seed_generators(model)]


def restore_seeds(model: keras.Model, states: list[tf.Tensor]) -> None:
    """Put every seed generator back to ``states``, so the next pass draws the same masks."""
    for generator, state in zip(_seed_generators(model), states, strict=True):
        generator.state.assign(state)


def _projection(
    losses_of: Callable[[], tf.Tensor],
    variables: list[tf.Variable],
    directions: NormalSource,
    before_pass: Callable[[], None],
) -> tf.Tensor:
    """One forward-mode pass: ``<g_i, v>`` for every example i, v ~ N(0, I), shape (B,)."""
    tangents = [directions.standard_normal(tf.shape(v), v.dtype) for v in variables]
    before_pass()
    with tf.autodiff.ForwardAccumulator(variables, tangents) as accumulator:
        losses = losses_of()
    return accumulator.jvp(losses, unconnected_gradients=tf.UnconnectedGradients.ZERO)


def jl_projections(
    losses_of: Callable[[], tf.Tensor],
    weights: list[keras.Variable],
    *,
    dimension: int,
    directions: NormalSource,
    before_pass: Callable[[], None],
) -> tf.Tensor:
    """``<g_i, v_j>`` for every direction j and example i, shape ``(r, B)``: one jvp pass each.

    Args:
        losses_of: runs the forward pass and returns the per-example losses, shape (B,).
        weights: the trainable weights (the directions span all of them).
        dimension: r >= 1.
        directions: the source of the N(0, I) directions.
        before_pass: called before each pass (restores the seed generators).
    """
    variables = [w.value for w in weights]
    return tf.stack(
        [_projection(losses_of, variables, directions, before_pass) for _ in range(dimension)]
    )


def jl_squared_norms(
    losses_of: Callable[[], tf.Tensor],
    weights: list[keras.Variable],
    *,
    dimension: int,
    directions: NormalSource,
    before_pass: Callable[[], None],
) -> tf.Tensor:
    """``(1/r) sum_j <g_i, v_j>^2`` per example, shape (B,), from r forward-mode passes.

    The same passes as :func:`jl_projections`, but in a ``tf.while_loop`` after the first one:
    a compiled step holds two copies of the forward pass whatever r is, not r of them.
    """
    variables = [w.value for w in weights]

    def one_pass() -> tf.Tensor:
        return _projection(losses_of, variables, directions, before_pass) ** 2

    first = one_pass()
    _, total = tf.while_loop(
        lambda j, _: j < dimension,
        lambda j, total: (j + 1, total + one_pass()),
        (tf.constant(1), first),
    )
    return total / dimension
