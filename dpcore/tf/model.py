"""``DPModel``: train any Keras model privately with ``model.fit``.

Wrap the model, compile with any Keras optimizer (SGD gives DP-SGD, Adam gives DP-Adam; the
update is post-processing of the noisy gradient) and fit on :class:`~dpcore.tf.lots.PoissonLots`.
Each step (Abadi et al. 2016, Alg. 1; Bu et al. 2021, Alg. 2 with ``jl_dimension=r``):

1. clip every example's gradient to C (:class:`~dpcore.tf.clipping.Clipper`: ghost norms,
   per-example Jacobian, or JL-estimated norms) and sum;
2. add N(0, sigma^2 C^2 I) (:mod:`dpcore.tf.noise`) and divide by the *expected* lot size q N,
   so the realised lot size stays private; an empty lot gets noise too;
3. let the optimizer step, and count the step in a model variable.

The count is taken inside the compiled step, so every noisy step is in :attr:`DPModel.ledger`
(the framework-free :class:`~dpcore.ledger.PrivacyLedger`, the same events and statement as the
torch trainer), however the step was reached. Keras's progress bar shows epsilon
(:class:`EpsilonCallback`). ``train_on_batch`` and ``fit`` on anything but Poisson lots are
refused: Keras's own batches are shuffled fixed-size batches, which the accountants do not
analyse.

Example:
    >>> import keras, numpy as np
    >>> from dpcore.tf import DPModel, PoissonLots
    >>> x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    >>> y = (x[:, 0] > 0).astype("int32")
    >>> net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model = DPModel(net, max_grad_norm=1.0, noise_multiplier=1.1, seed=0)
    >>> model.compile(optimizer=keras.optimizers.SGD(0.5),
    ...               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    ...               metrics=["accuracy"])
    >>> history = model.fit(PoissonLots((x, y), expected_lot_size=32, seed=0), epochs=2,
    ...                     delta=1e-5, verbose=0)
    >>> model.ledger.steps, round(model.epsilon(delta=1e-5), 2) > 0
    (16, True)
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from dpcore.errors import InvalidParameterError, StateError, UnsupportedEventError
from dpcore.ledger import PrivacyLedger
from dpcore.tf.clipping import Clipper
from dpcore.tf.losses import per_example_loss, resolve_loss
from dpcore.tf.lots import PoissonLots
from dpcore.tf.noise import NormalSource, normal_source
from dpcore.validation import check_count, check_delta, check_positive

__all__ = ["DPModel", "EpsilonCallback"]

#: fit() arguments that would replace the Poisson lots by Keras's own batching.
_REFUSED_FIT_ARGUMENTS = (
    "batch_size",
    "shuffle",
    "validation_split",
    "sample_weight",
    "class_weight",
)


class DPModel(keras.Model):
    """A Keras model trained with DP-SGD / DP-Adam (or their JL variants) by ``fit``.

    Args:
        model: the network (any ``keras.Model`` without BatchNormalization).
        max_grad_norm: the clipping norm C > 0.
        noise_multiplier: sigma > 0; the noise standard deviation is sigma C.
        jl_dimension: r >= 1 for DP-SGD-JL / DP-Adam-JL (norms from r jvp projections).
        clipping: ``"auto"`` (ghost norms when every layer has one, else per-example
            Jacobians), ``"ghost"`` or ``"jacobian"``; ignored with ``jl_dimension``.
        noise: ``"seeded"`` (default), ``"secure"`` (OS randomness, no seed) or a
            :class:`~dpcore.tf.noise.NormalSource`; it also draws the JL directions.
        seed: seed of the seeded source (``None``: drawn from the OS).
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        max_grad_norm: float,
        noise_multiplier: float,
        jl_dimension: int | None = None,
        clipping: str = "auto",
        noise: NormalSource | str | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(model, keras.Model):
            raise InvalidParameterError("model", "to be a keras.Model", model)
        self.network = model
        self._noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self._max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        self._jl_dimension = (
            None if jl_dimension is None else check_count("jl_dimension", jl_dimension, minimum=1)
        )
        self._clipping = clipping
        self.noise_source = normal_source(noise, seed)
        self._clipper: Clipper | None = None
        self._dp_steps = self.add_weight(
            name="dp_steps", shape=(), dtype="int64", initializer="zeros", trainable=False
        )
        self._divisor = self.add_weight(
            name="expected_lot_size", shape=(), dtype="float64", initializer="ones", trainable=False
        )
        self._ledger: PrivacyLedger | None = None
        self._lots: PoissonLots | None = None

    # -- what ran ---------------------------------------------------------------------------
    @property
    def noise_multiplier(self) -> float:
        """sigma (fixed for the model's life: the ledger records it per step)."""
        return self._noise_multiplier

    @property
    def max_grad_norm(self) -> float:
        """C."""
        return self._max_grad_norm

    @property
    def jl_dimension(self) -> int | None:
        """r for the JL variants, else None."""
        return self._jl_dimension

    @property
    def clipping_method(self) -> str:
        """``ghost``, ``jacobian`` or ``jl`` (known once the model is compiled and built)."""
        return self._clipper_for().resolved_method()

    @property
    def ledger(self) -> PrivacyLedger:
        """Every noisy step taken so far (synchronised with the step counter on each read)."""
        taken = int(self._dp_steps.numpy())
        if self._ledger is None:
            if taken == 0:
                raise StateError("No lots yet: the ledger starts with the first fit().")
            raise StateError(f"{taken} steps ran without Poisson lots from fit(); no ledger.")
        pending = taken - self._ledger.steps
        if pending < 0:
            raise StateError(
                f"The step counter ({taken}) is behind the ledger ({self._ledger.steps}): "
                "weights from an earlier point were loaded; load the ledger saved with them."
            )
        assert self._lots is not None
        for _ in range(pending):
            self._ledger.record(
                sampling_probability=self._lots.sampling_probability,
                noise_multiplier=self._noise_multiplier,
                jl_dimension=self._jl_dimension,
            )
        return self._ledger

    def epsilon(self, *, delta: float, accountant: str | None = None) -> float:
        """Epsilon spent so far (default accountant: ``rdp``, or ``jl`` for JL steps)."""
        name = accountant or ("jl" if self._jl_dimension is not None else "rdp")
        return self.ledger.epsilon(delta=delta, accountant=name)

    def privacy_statement(
        self, *, delta: float, accountants: tuple[str, ...] | None = None, **extra: Any
    ) -> dict[str, Any]:
        """The ledger's statement (as the torch trainer's) with C, sigma, q N, r and clipping."""
        names = accountants or (("jl",) if self._jl_dimension is not None else ("rdp", "pld"))
        assert self._lots is not None or self._ledger is None
        return self.ledger.statement(
            delta=delta,
            accountants=names,
            framework="tensorflow",
            engine=self.clipping_method,
            max_grad_norm=self._max_grad_norm,
            noise_multiplier=self._noise_multiplier,
            noise_source=self.noise_source.name,
            expected_lot_size=self._lots.expected_lot_size if self._lots else None,
            sampling_probability=self._lots.sampling_probability if self._lots else None,
            jl_dimension=self._jl_dimension,
            **extra,
        )

    # -- Keras ------------------------------------------------------------------------------
    def call(self, inputs: Any, training: Any = None) -> Any:
        return self.network(inputs, training=training)

    def compile(self, optimizer: Any = "sgd", loss: Any = None, **kwargs: Any) -> None:
        """As ``keras.Model.compile``; ``loss`` must give one value per example unreduced."""
        self._per_example_loss = resolve_loss(loss)
        self._clipper = None
        super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def _clipper_for(self) -> Clipper:
        if self._clipper is None:
            if not hasattr(self, "_per_example_loss"):
                raise StateError("Compile the model (with a loss) before training it.")
            jl = self._jl_dimension is not None
            self._clipper = Clipper(
                self.network,
                self._per_example_loss,
                self._max_grad_norm,
                method="jl" if jl else self._clipping,
                jl_dimension=self._jl_dimension,
                directions=self.noise_source,
            )
        return self._clipper

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            raise InvalidParameterError("sample_weight", "to be None in DP training", "weights")
        clipper = self._clipper_for()
        weights = list(self.network.trainable_weights)

        def clip() -> tuple[list[tf.Tensor], tf.Tensor, Any]:
            lot = clipper(x, y, training=True)
            return lot.summed, lot.losses, lot.predictions

        def empty() -> tuple[list[tf.Tensor], tf.Tensor, Any]:
            # nothing to clip (a per-example Jacobian of zero examples fails); the noise stays
            predictions = self.network(x, training=True)
            losses = per_example_loss(clipper.loss, y, predictions)
            return [tf.zeros_like(w) for w in weights], losses, predictions

        size = tf.shape(tf.nest.flatten(x)[0])[0]
        summed, losses, predictions = tf.cond(size > 0, clip, empty)
        noise_std = self._noise_multiplier * self._max_grad_norm
        noisy = []
        for total in summed:
            draw = self.noise_source.standard_normal(tf.shape(total), total.dtype)
            divisor = tf.cast(self._divisor, total.dtype)
            noisy.append((total + noise_std * draw) / divisor)
        self.optimizer.apply_gradients(zip(noisy, weights, strict=True))
        self._dp_steps.assign_add(1)
        mean = tf.math.divide_no_nan(tf.reduce_sum(losses), tf.cast(size, losses.dtype))
        self._loss_tracker.update_state(mean, sample_weight=size)
        logs: dict[str, Any] = self.compute_metrics(x, y, predictions, sample_weight=None)
        return logs

    def train_on_batch(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: a batch chosen by the caller is not a Poisson lot."""
        raise InvalidParameterError(
            "train_on_batch", "not to be used with DPModel (use fit on PoissonLots)", "a call"
        )

    def fit(
        self,
        x: PoissonLots | None = None,
        y: Any = None,
        *,
        epochs: int = 1,
        delta: float | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        steps_per_epoch: int | None = None,
        **kwargs: Any,
    ) -> keras.callbacks.History:
        """``keras.Model.fit`` over Poisson lots; ``delta`` shows epsilon in the progress bar.

        One epoch is ``lots.steps_per_epoch`` = round(1/q) lots unless ``steps_per_epoch`` says
        otherwise. Validation data, verbosity and callbacks pass through.

        Raises:
            InvalidParameterError: ``x`` is not :class:`PoissonLots`, ``y`` is given, a
                batching argument is given, or the lots' dataset differs from an earlier fit's.
        """
        if not isinstance(x, PoissonLots):
            raise InvalidParameterError(
                "x",
                "to be dpcore.tf.PoissonLots (Keras's own batching is shuffled fixed-size "
                "batches, which the privacy analysis does not cover)",
                type(x).__name__,
            )
        if y is not None:
            raise InvalidParameterError("y", "to be None (the labels travel in the lots)", "arrays")
        refused = sorted(set(kwargs) & set(_REFUSED_FIT_ARGUMENTS))
        if refused:
            raise InvalidParameterError(
                refused[0], "not to be given to DPModel.fit", kwargs[refused[0]]
            )
        self.use_lots(x)
        extra = [] if delta is None else [EpsilonCallback(check_delta("delta", delta))]
        return super().fit(
            x.dataset(),
            epochs=check_count("epochs", epochs, minimum=1),
            steps_per_epoch=steps_per_epoch or x.steps_per_epoch,
            shuffle=False,  # the lots are already random; Keras must not reorder them
            callbacks=[*extra, *(callbacks or [])],
            **kwargs,
        )

    def use_lots(self, lots: PoissonLots) -> None:
        """Take the following steps on ``lots``: their rate q goes to the ledger, q N divides.

        ``fit`` calls it; call it yourself only to drive ``train_step`` directly (e.g. to time
        a step on a given lot): the ledger then records q of ``lots`` for every step taken.
        """
        if self._ledger is None:
            taken = int(self._dp_steps.numpy())
            if taken:
                raise StateError(f"{taken} steps ran before the first fit(); no ledger for them.")
            self._ledger = PrivacyLedger(dataset_size=lots.dataset_size, sampler="poisson")
        else:
            _ = self.ledger  # record the steps of the previous lots at their rate
            if lots.dataset_size != self._ledger.dataset_size:
                raise InvalidParameterError(
                    "x",
                    f"to be lots over the same {self._ledger.dataset_size} examples",
                    lots.dataset_size,
                )
        self._lots = lots
        self._divisor.assign(lots.expected_lot_size)


class EpsilonCallback(keras.callbacks.Callback):
    """Puts the epsilon spent so far into Keras's logs (so the progress bar shows it).

    Every ``every`` steps and at each epoch's end, from the model's default accountant (RDP:
    milliseconds; JL steps: the ``jl`` PLD accountant, seconds — so only at epoch ends).
    """

    def __init__(self, delta: float, *, every: int = 20) -> None:
        super().__init__()
        self.delta = check_delta("delta", delta)
        self.every = check_count("every", every, minimum=1)
        self._value = math.nan
        self._at = -1

    def _epsilon(self) -> float:
        model: DPModel = self.model
        steps = model.ledger.steps
        if steps != self._at:
            try:
                self._value = model.epsilon(delta=self.delta)
            except UnsupportedEventError:
                self._value = math.nan
            self._at = steps
        return self._value

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        model: DPModel = self.model
        if logs is None:
            return
        if model.jl_dimension is None and (batch + 1) % self.every == 0:
            self._epsilon()
        if not math.isnan(self._value):
            logs["epsilon"] = self._value

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        value = self._epsilon()
        if logs is not None:
            logs["epsilon"] = value
