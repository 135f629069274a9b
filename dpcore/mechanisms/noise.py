"""Noise for the Gaussian and Laplace mechanisms (the releases the audits examine).

Floating-point samplers: fine for auditing and research, but see Mironov 2012 and Jin et al.
2022 for the attacks that exploit floating-point noise; a cryptographically secure, exact
sampler belongs to the training engine.
"""

from __future__ import annotations

import numpy as np

from dpcore.validation import check_count, check_positive

__all__ = ["gaussian_release", "laplace_release"]


def _scale(noise_multiplier: float, sensitivity: float) -> float:
    return check_positive("noise_multiplier", noise_multiplier) * check_positive(
        "sensitivity", sensitivity
    )


def gaussian_release(
    value: float,
    *,
    noise_multiplier: float,
    sensitivity: float = 1.0,
    size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``size`` independent releases value + N(0, (noise_multiplier * sensitivity)^2)."""
    scale = _scale(noise_multiplier, sensitivity)
    return value + rng.normal(0.0, scale, check_count("size", size))


def laplace_release(
    value: float,
    *,
    noise_multiplier: float,
    sensitivity: float = 1.0,
    size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``size`` releases value + Lap(noise_multiplier * sensitivity): (1/multiplier)-DP."""
    scale = _scale(noise_multiplier, sensitivity)
    return value + rng.laplace(0.0, scale, check_count("size", size))
