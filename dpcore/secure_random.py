"""Cryptographically secure uniforms and normals from the operating system (``os.urandom``).

Framework-free; the noise sources of :mod:`dpcore.torch` and :mod:`dpcore.tf` draw from here.
Normals come from the Box–Muller transform (Box and Muller 1958) in float64. The floating-point
attacks on textbook samplers (Mironov 2012; Jin et al. 2022) concern the low-order bits of each
draw, which these functions do not claim to protect.
"""

from __future__ import annotations

import os

import numpy as np

from dpcore.validation import check_count

__all__ = ["secure_standard_normals", "secure_uniforms"]


def secure_uniforms(count: int) -> np.ndarray:
    """``count`` uniforms in (0, 1]: ``u = (k + 1) / 2**53`` with k from 8 random bytes each.

    Never 0, so ``log u`` is finite.
    """
    count = check_count("count", count)
    words = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)
    return (words.astype(np.float64) + 1.0) * 2.0**-53


def secure_standard_normals(count: int) -> np.ndarray:
    """``count`` i.i.d. N(0, 1) draws (float64) by Box–Muller over :func:`secure_uniforms`."""
    count = check_count("count", count)
    pairs = (count + 1) // 2
    radius = np.sqrt(-2.0 * np.log(secure_uniforms(pairs)))
    angle = 2.0 * np.pi * secure_uniforms(pairs)
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
