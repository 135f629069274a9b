"""Sources of the Gaussian draws (noise and JL directions) inside a TensorFlow step.

:class:`SeededNormals` uses a seeded ``tf.random.Generator`` (Philox): reproducible, right for
research and tests, but whoever knows the seed can subtract the noise. :class:`SecureNormals`
draws float64 normals from the operating system (:mod:`dpcore.secure_random`) through
``tf.numpy_function`` and refuses a seed. Both return float64 draws rounded to the requested dtype.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from dpcore.errors import InvalidParameterError
from dpcore.secure_random import secure_standard_normals
from dpcore.validation import check_count

__all__ = ["NormalSource", "SecureNormals", "SeededNormals", "normal_source"]


class NormalSource:
    """Draws i.i.d. N(0, 1) tensors, usable inside a ``tf.function``."""

    name = ""

    def standard_normal(self, shape: Any, dtype: tf.DType) -> tf.Tensor:
        raise NotImplementedError


class SeededNormals(NormalSource):
    """Reproducible normals from ``tf.random.Generator.from_seed(seed)``.

    Args:
        seed: a non-negative integer below 2**63; ``None`` draws one from the OS.
    """

    name = "seeded"

    def __init__(self, seed: int | None = None) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.seed = check_count("seed", seed)
        if self.seed >= 2**63:
            raise InvalidParameterError("seed", "< 2**63", seed)
        self.generator = tf.random.Generator.from_seed(self.seed)

    def standard_normal(self, shape: Any, dtype: tf.DType) -> tf.Tensor:
        return tf.cast(self.generator.normal(shape, dtype=tf.float64), dtype)


def _secure(count: np.ndarray) -> np.ndarray:
    return secure_standard_normals(int(count))


class SecureNormals(NormalSource):
    """Normals from ``os.urandom`` (Box–Muller in float64); a seed is refused."""

    name = "secure"

    def __init__(self, seed: object = None) -> None:
        if seed is not None:
            raise InvalidParameterError(
                "seed", "to be None for the secure source (it cannot be seeded)", seed
            )

    def standard_normal(self, shape: Any, dtype: tf.DType) -> tf.Tensor:
        shape = tf.cast(shape, tf.int64)
        draws = tf.numpy_function(_secure, [tf.reduce_prod(shape)], tf.float64, stateful=True)
        return tf.cast(tf.reshape(draws, shape), dtype)


def normal_source(source: NormalSource | str | None, seed: int | None) -> NormalSource:
    """``source`` itself, or a new ``"seeded"`` (default) / ``"secure"`` source."""
    if isinstance(source, NormalSource):
        if seed is not None:
            raise InvalidParameterError("seed", "to be None when a source object is given", seed)
        return source
    if source in (None, "seeded"):
        return SeededNormals(seed)
    if source == "secure":
        return SecureNormals(seed)
    raise InvalidParameterError("noise", "in ('seeded', 'secure') or a NormalSource", source)
