"""Poisson lots for TensorFlow: in-memory arrays or a finite ``tf.data`` dataset.

DP-SGD's analysis (Abadi et al. 2016, Alg. 1 and §3.1; every accountant in
:mod:`dpcore.accountants`) assumes each record joins each lot independently with probability q,
so lots vary in size and may be empty. Keras's own batching (shuffled fixed-size batches) is a
different mechanism, which is why :class:`~dpcore.tf.model.DPModel` trains only on
:class:`PoissonLots`.

Inclusion is decided per record and per lot by a seeded ``numpy`` generator (reproducible and
resumable from :meth:`PoissonLots.state_dict`) or by the OS's secure generator
(:func:`dpcore.secure_random.secure_uniforms`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from dpcore.errors import InvalidParameterError, StateError
from dpcore.secure_random import secure_uniforms
from dpcore.validation import check_count, check_positive, check_probability

__all__ = ["PoissonLots"]


def _as_arrays(data: Any) -> Any:
    arrays = tf.nest.map_structure(np.asarray, data)
    sizes = {len(a) if a.ndim else -1 for a in tf.nest.flatten(arrays)}
    if len(sizes) != 1 or -1 in sizes:
        raise InvalidParameterError(
            "data",
            "to be arrays (or a tuple/dict of arrays) with one common first dimension",
            sizes,
        )
    return arrays


def _dataset_size(dataset: tf.data.Dataset) -> int:
    size = int(dataset.cardinality())
    if size < 0:
        raise InvalidParameterError(
            "data",
            "to be a tf.data.Dataset of known finite cardinality (Poisson sampling needs N; "
            "use dataset.apply(tf.data.experimental.assert_cardinality(N)))",
            "infinite or unknown cardinality",
        )
    return size


class PoissonLots:
    """An endless stream of Poisson lots over ``data``, as a ``tf.data.Dataset`` of lots.

    Args:
        data: a numpy array / tensor, a tuple or dict of them (first dimension N), or a finite
            ``tf.data.Dataset`` of single examples.
        sampling_probability: q in (0, 1]; or give ``expected_lot_size`` (q = size / N).
        expected_lot_size: q N, the divisor of the noisy sum.
        seed: seeds the inclusion draws; ``None`` draws one from the OS.
        secure: draw inclusions from ``os.urandom`` instead (no seed allowed).

    Each lot of an array source costs O(N) draws and a gather; each lot of a ``tf.data`` source
    is one pass over it (every record is visited to decide its inclusion).

    ``lots_drawn`` counts every lot drawn, including lots that Keras prefetched but did not train
    on when ``fit`` stopped; the steps that ran are the ledger's (``DPModel.ledger.steps``). A
    drawn but unused lot changes nothing for privacy: every lot is an independent Poisson
    sample, and only the lots a step used reach the model.

    Example:
        >>> import numpy as np
        >>> lots = PoissonLots(np.arange(1000.0), expected_lot_size=10, seed=0)
        >>> lots.sampling_probability, lots.steps_per_epoch
        (0.01, 100)
        >>> sizes = [int(lot.shape[0]) for lot in lots.dataset().take(3)]
        >>> len(sizes), all(0 <= s <= 1000 for s in sizes)
        (3, True)
    """

    def __init__(
        self,
        data: Any,
        *,
        sampling_probability: float | None = None,
        expected_lot_size: float | None = None,
        seed: int | None = None,
        secure: bool = False,
    ) -> None:
        if isinstance(data, tf.data.Dataset):
            self._source: Any = data
            self.dataset_size = _dataset_size(data)
        else:
            self._source = _as_arrays(data)
            self.dataset_size = len(tf.nest.flatten(self._source)[0])
        if self.dataset_size < 1:
            raise InvalidParameterError("data", "to hold at least one example", self.dataset_size)
        if (sampling_probability is None) == (expected_lot_size is None):
            raise InvalidParameterError(
                "sampling_probability",
                "or expected_lot_size to be given (exactly one of them)",
                (sampling_probability, expected_lot_size),
            )
        if expected_lot_size is not None:
            size = check_positive("expected_lot_size", expected_lot_size)
            if size > self.dataset_size:
                raise InvalidParameterError(
                    "expected_lot_size", f"<= the dataset size {self.dataset_size}", size
                )
            sampling_probability = size / self.dataset_size
        q = check_probability("sampling_probability", sampling_probability)
        if q == 0.0:
            raise InvalidParameterError("sampling_probability", "in (0, 1]", q)
        self.sampling_probability = q
        self.secure = bool(secure)
        if self.secure and seed is not None:
            raise InvalidParameterError("seed", "to be None with secure=True", seed)
        if seed is None and not self.secure:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.seed = None if seed is None else check_count("seed", seed)
        self._rng = None if self.secure else np.random.default_rng(self.seed)
        self.lots_drawn = 0

    @property
    def expected_lot_size(self) -> float:
        """q N."""
        return self.sampling_probability * self.dataset_size

    @property
    def steps_per_epoch(self) -> int:
        """round(1 / q) lots: one epoch in expectation."""
        return max(1, round(1.0 / self.sampling_probability))

    def _mask(self) -> np.ndarray:
        n = self.dataset_size
        uniforms = secure_uniforms(n) if self._rng is None else self._rng.random(n)
        self.lots_drawn += 1
        # secure uniforms lie in (0, 1], numpy's in [0, 1): "u < q" has probability q up to 2^-53
        return uniforms < self.sampling_probability

    def indices(self) -> np.ndarray:
        """The sorted indices of the next lot (possibly empty)."""
        return np.flatnonzero(self._mask())

    def _array_lots(self) -> Iterator[Any]:
        while True:
            index = self.indices()
            yield tf.nest.map_structure(lambda a, i=index: a[i], self._source)

    def _signature(self) -> Any:
        if isinstance(self._source, tf.data.Dataset):
            return tf.nest.map_structure(
                lambda s: tf.TensorSpec([None, *s.shape], s.dtype), self._source.element_spec
            )
        return tf.nest.map_structure(
            lambda a: tf.TensorSpec([None, *a.shape[1:]], tf.as_dtype(a.dtype)), self._source
        )

    def dataset(self) -> tf.data.Dataset:
        """Endless lots (Keras stops after ``epochs * steps_per_epoch`` of them)."""
        signature = self._signature()
        if not isinstance(self._source, tf.data.Dataset):
            return tf.data.Dataset.from_generator(self._array_lots, output_signature=signature)
        source, n = self._source, self.dataset_size
        empty = tf.nest.map_structure(lambda s: tf.zeros([0, *s.shape[1:]], s.dtype), signature)

        def masks() -> Iterator[np.ndarray]:
            while True:
                yield self._mask()

        def lot(mask: tf.Tensor) -> tf.data.Dataset:
            kept = (
                tf.data.Dataset.zip((source, tf.data.Dataset.from_tensor_slices(mask)))
                .filter(lambda _, keep: keep)
                .map(lambda example, _: example)
                .batch(n)
            )
            return kept.concatenate(tf.data.Dataset.from_tensors(empty)).take(1)

        return tf.data.Dataset.from_generator(
            masks, output_signature=tf.TensorSpec([n], tf.bool)
        ).flat_map(lot)

    def state_dict(self) -> dict[str, Any]:
        """The generator state and lot count (secure streams cannot be resumed)."""
        if self._rng is None:
            raise StateError("A secure lot stream cannot be resumed (it has no state to save).")
        return {
            "seed": self.seed,
            "lots_drawn": self.lots_drawn,
            "generator": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream saved by :meth:`state_dict`."""
        if self._rng is None:
            raise StateError("A secure lot stream cannot be resumed.")
        try:
            self.seed = state["seed"]
            self.lots_drawn = int(state["lots_drawn"])
            self._rng.bit_generator.state = state["generator"]
        except (KeyError, TypeError, ValueError) as error:
            raise StateError(f"Malformed lot-stream state: {error!r}.") from error
