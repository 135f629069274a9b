"""What a private ERM mechanism releases, with the parameters that justify its guarantee."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["PrivateModel"]


@dataclasses.dataclass(frozen=True)
class PrivateModel:
    """A released linear model and its privacy statement.

    Attributes:
        weights: the released w (the only data-dependent output).
        mechanism: e.g. ``"output_perturbation_laplace"``.
        epsilon, delta: the guarantee (delta = 0 for the pure variants).
        regularisation: lambda.
        extra_regularisation: Delta of CMS Alg. 2 (0 for output perturbation).
        noise_epsilon: epsilon' of CMS Alg. 2 (the epsilon the noise is calibrated to).
        noise_scale: 1/beta of the norm-Laplace noise, or sigma of the Gaussian noise.
        sensitivity: L2 sensitivity of the minimiser (output perturbation), else None.
        theorem: where the guarantee is proved.
    """

    weights: np.ndarray
    mechanism: str
    epsilon: float
    delta: float
    regularisation: float
    extra_regularisation: float
    noise_epsilon: float
    noise_scale: float
    sensitivity: float | None
    theorem: str

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Labels in {-1, +1}: sign(w^T x), ties to +1 (post-processing, no privacy cost)."""
        return np.where(np.asarray(features, dtype=float) @ self.weights >= 0, 1.0, -1.0)
