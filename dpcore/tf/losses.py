"""One loss value per example from a Keras loss, as every per-example clipping method needs."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from dpcore.errors import InvalidParameterError

__all__ = ["per_example_loss", "resolve_loss"]


def resolve_loss(loss: Any) -> Any:
    """A Keras loss object or function from what ``compile`` accepts (a name, object, callable).

    Raises:
        InvalidParameterError: ``loss`` is missing or not a loss.
    """
    if loss is None:
        raise InvalidParameterError("loss", "to be a Keras loss (name, object or function)", loss)
    if isinstance(loss, str):
        try:
            return keras.losses.get(loss)
        except ValueError as error:
            raise InvalidParameterError("loss", "to name a Keras loss", loss) from error
    if not callable(loss):
        raise InvalidParameterError("loss", "to be a Keras loss (name, object or function)", loss)
    return loss


def per_example_loss(loss: Any, y_true: Any, y_pred: Any) -> tf.Tensor:
    """The loss of each example, shape ``(B,)``: unreduced, averaged over any other axes.

    A ``keras.losses.Loss`` object is called through its unreduced ``call``; a function is called
    as is. Averaging over the non-batch axes (e.g. time steps) matches what Keras's own reduction
    does within one example.
    """
    values = (
        loss.call(y_true, y_pred) if isinstance(loss, keras.losses.Loss) else loss(y_true, y_pred)
    )
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0:
        raise InvalidParameterError(
            "loss", "to return one value per example (an unreduced loss), not a scalar", loss
        )
    if values.shape.rank > 1:
        values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
    return values
