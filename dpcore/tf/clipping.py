"""The sum of clipped per-example gradients of a Keras model: exact (ghost, Jacobian) or JL.

``c_i = min(1, C / ||g_i||)`` (Abadi et al. 2016, Alg. 1), the same factors as the torch
engines (:func:`dpcore.torch.per_example.base.clip_factors`). The sum ``sum_i c_i g_i`` is the
gradient of ``sum_i c_i loss_i`` with the factors held constant, taken on the same forward pass
(ghost) or from the per-example gradients (Jacobian). JL clipping
(:mod:`dpcore.tf.jl`) uses estimated norms and a separate, identically seeded clipped pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from dpcore.errors import IncompatibleModelError, InvalidParameterError
from dpcore.tf.ghost import (
    GhostCapture,
    NotGhostableError,
    ghost_supported,
    recurrent_layers,
    unrolled,
)
from dpcore.tf.jacobian import per_example_gradients
from dpcore.tf.jl import jl_squared_norms, restore_seeds, seed_states
from dpcore.tf.losses import per_example_loss, resolve_loss
from dpcore.tf.noise import NormalSource, SeededNormals
from dpcore.validation import check_count, check_positive

__all__ = ["METHODS", "ClippedLot", "Clipper", "clip_factors"]

#: ``auto`` = ghost when every weight is covered, else the Jacobian; ``jl`` = JL-estimated.
METHODS = ("auto", "ghost", "jacobian", "jl")

#: Layers whose output for one example depends on other examples of the lot.
_MIXING = (keras.layers.BatchNormalization,)


@dataclasses.dataclass
class ClippedLot:
    """What one lot gives: clipped sums (one per trainable weight) and per-example values."""

    summed: list[tf.Tensor]
    norms: tf.Tensor
    clip_factors: tf.Tensor
    losses: tf.Tensor
    predictions: Any


def clip_factors(norms: tf.Tensor, max_grad_norm: float) -> tf.Tensor:
    """``min(1, C / ||g_i||)``; a NaN/inf norm stops the step with an error.

    Unlike the torch engines there is no ``nonfinite="zero"`` here: in a batched TensorFlow
    backward pass one example's NaN input reaches every example's weight gradient (0 * NaN),
    so dropping it would need a second pass that sees different dropout masks.
    """
    tf.debugging.Assert(
        tf.reduce_all(tf.math.is_finite(norms)),
        [
            "NonFiniteGradientError: a per-example gradient is NaN or infinite; clipping "
            "cannot bound it. Fix the inputs or the loss."
        ],
    )
    tiny = np.finfo(norms.dtype.as_numpy_dtype).tiny
    return tf.where(norms > max_grad_norm, max_grad_norm / tf.maximum(norms, tiny), 1.0)


def _check_model(model: keras.Model) -> None:
    if not isinstance(model, keras.Model):
        raise InvalidParameterError("model", "to be a keras.Model", model)
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, _MIXING):
            raise IncompatibleModelError(
                f"Layer {layer.name!r} ({type(layer).__name__}) mixes the examples of a lot, so "
                "no per-example gradient exists; use LayerNormalization or GroupNormalization."
            )


class Clipper:
    """Turns a lot into :class:`ClippedLot` for a Keras model and a per-example loss.

    Args:
        model: a built or buildable ``keras.Model`` without layers that mix examples.
        loss: a Keras loss (name, object, function) giving one value per example.
        max_grad_norm: C > 0.
        method: one of :data:`METHODS`; ``"ghost"`` raises on a model it does not cover.
        jl_dimension: r >= 1 with ``method="jl"`` (then ``directions`` draws the projections).
        directions: source of the JL directions (default: seeded from the OS).

    Raises:
        IncompatibleModelError: a layer mixes examples (BatchNormalization), or ``"ghost"`` was
            asked for a model with an uncovered weight or a layer called twice.
        InvalidParameterError: bad C, method, r or policy.
    """

    def __init__(
        self,
        model: keras.Model,
        loss: Any,
        max_grad_norm: float,
        *,
        method: str = "auto",
        jl_dimension: int | None = None,
        directions: NormalSource | None = None,
    ) -> None:
        _check_model(model)
        self.model = model
        self.loss = resolve_loss(loss)
        self.max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        if method not in METHODS:
            raise InvalidParameterError("method", f"in {METHODS}", method)
        if (method == "jl") != (jl_dimension is not None):
            raise InvalidParameterError(
                "jl_dimension", "to be given exactly when method='jl'", jl_dimension
            )
        self.method = method
        self.jl_dimension = (
            None if jl_dimension is None else check_count("jl_dimension", jl_dimension, minimum=1)
        )
        self.directions = directions if directions is not None else SeededNormals()
        self._resolved: str | None = None

    def resolved_method(self) -> str:
        """``ghost``, ``jacobian`` or ``jl``: what a lot will use (once the model is built)."""
        if self._resolved is None:
            if not self.model.trainable_weights:
                raise IncompatibleModelError(
                    f"Model {self.model.name!r} has no trainable weights (build it first, e.g. "
                    "by calling it on one example)."
                )
            covered = ghost_supported(self.model)
            if self.method == "ghost" and not covered:
                raise IncompatibleModelError(
                    f"Model {self.model.name!r} has weights outside Dense, Embedding, Conv1D/2D "
                    "and LayerNormalization layers: use method='jacobian' (or 'auto')."
                )
            if self.method == "auto":
                self._resolved = "ghost" if covered else "jacobian"
            else:
                self._resolved = self.method
        return self._resolved

    def _losses(self, x: Any, y: Any, training: bool) -> tuple[tf.Tensor, Any]:
        predictions = self.model(x, training=training)
        return per_example_loss(self.loss, y, predictions), predictions

    def __call__(self, x: Any, y: Any, *, training: bool = True) -> ClippedLot:
        """Clip one lot (call inside or outside a ``tf.function``)."""
        method = self.resolved_method()
        weights = list(self.model.trainable_weights)
        if method == "ghost":
            return self._ghost(x, y, weights, training)
        if method == "jacobian":
            return self._jacobian(x, y, weights, training)
        return self._jl(x, y, weights, training)

    def _finish(
        self,
        tape: tf.GradientTape,
        losses: tf.Tensor,
        norms: tf.Tensor,
        weights: list[Any],
        predictions: Any,
    ) -> ClippedLot:
        factors = clip_factors(norms, self.max_grad_norm)
        summed = tape.gradient(
            losses,
            weights,
            output_gradients=tf.cast(factors, losses.dtype),
            unconnected_gradients=tf.UnconnectedGradients.ZERO,
        )
        dense = [tf.convert_to_tensor(g) for g in summed]  # Embedding sums come as slices
        return ClippedLot(dense, norms, factors, losses, predictions)

    def _ghost(self, x: Any, y: Any, weights: list[Any], training: bool) -> ClippedLot:
        capture = GhostCapture(self.model)
        with tf.GradientTape() as tape, capture.capturing():
            losses, predictions = self._losses(x, y, training)
        try:
            capture.check_complete()
        except NotGhostableError:
            raise IncompatibleModelError(
                f"Model {self.model.name!r} calls a layer more than once (shared weights) or "
                "skips one: its ghost norms would miss cross terms; use method='jacobian'."
            ) from None
        # one backward pass to the layers' outputs; norms and clipped sums from the captures
        grads = tape.gradient(losses, capture.outputs)
        norms, factors, summed = capture.norms_and_sums(grads, self.max_grad_norm, weights)
        return ClippedLot(summed, norms, factors, losses, predictions)

    def _jacobian(self, x: Any, y: Any, weights: list[Any], training: bool) -> ClippedLot:
        with tf.GradientTape(persistent=True) as tape:
            losses, predictions = self._losses(x, y, training)
        per_example = per_example_gradients(tape, losses, weights)
        del tape
        squared = tf.add_n(
            [tf.reduce_sum(tf.reshape(g, [tf.shape(g)[0], -1]) ** 2, axis=1) for g in per_example]
        )
        norms = tf.sqrt(squared)
        factors = clip_factors(norms, self.max_grad_norm)
        summed = [tf.tensordot(factors, g, axes=1) for g in per_example]
        return ClippedLot(summed, norms, factors, losses, predictions)

    def _jl(self, x: Any, y: Any, weights: list[Any], training: bool) -> ClippedLot:
        states = seed_states(self.model)
        assert self.jl_dimension is not None

        def losses_of() -> tf.Tensor:
            return self._losses(x, y, training)[0]

        # forward mode cannot enter a while_loop; the clipped pass runs the same unrolled graph
        with unrolled(recurrent_layers(self.model)):
            squared = jl_squared_norms(
                losses_of,
                weights,
                dimension=self.jl_dimension,
                directions=self.directions,
                before_pass=lambda: restore_seeds(self.model, states),
            )
            restore_seeds(self.model, states)
            with tf.GradientTape() as tape:
                losses, predictions = self._losses(x, y, training)
        return self._finish(tape, losses, tf.sqrt(squared), weights, predictions)
