"""Differentially private PCA projection at the input layer (Abadi et al. 2016, §4 "DP PCA").

The paper: take a random sample of the training examples, normalise each to unit L2 norm
(rows of A), add Gaussian noise to the covariance A^T A, and project every input onto the top
principal directions of the noisy covariance.

Privacy of one run (add/remove one example): with ||x|| = 1 the change of A^T A is x x^T. The
noise is drawn on the upper triangle (diagonal included) and mirrored, so the released object is
the upper triangle, whose change has squared L2 norm sum_i x_i^4 + sum_{i<j} x_i^2 x_j^2
<= (sum_i x_i^2)^2 = 1. The step is therefore a Gaussian mechanism with L2 sensitivity 1 and noise
multiplier ``noise_std``; on a Poisson sample with rate p it is
``PoissonSampledEvent(p, GaussianEvent(noise_std))`` (:func:`pca_event`), composed once with the
training steps.
"""

from __future__ import annotations

import numpy as np

from dpcore.errors import InvalidParameterError
from dpcore.events import DpEvent, GaussianEvent, PoissonSampledEvent


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their L2 norm (all-zero rows stay zero)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def dp_pca_directions(
    x: np.ndarray,
    *,
    components: int,
    noise_std: float,
    sample_rate: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """The top ``components`` eigenvectors (columns, d x k) of a noisy A^T A.

    ``noise_std = 0`` and ``sample_rate = 1`` give exact (non-private) uncentred PCA.

    Args:
        x: the training examples, one per row (n x d); rows are normalised here.
        components: k, the number of directions kept.
        noise_std: standard deviation of the Gaussian noise per upper-triangle entry (sensitivity
            is 1, so this is also the noise multiplier).
        sample_rate: Poisson rate with which each example joins A.
        rng: the randomness for the sample and the noise.
    """
    if not 0 < sample_rate <= 1:
        raise InvalidParameterError("sample_rate", "in (0, 1]", sample_rate)
    if noise_std < 0:
        raise InvalidParameterError("noise_std", ">= 0", noise_std)
    d = x.shape[1]
    if not 1 <= components <= d:
        raise InvalidParameterError("components", f"in [1, {d}]", components)
    keep = rng.random(x.shape[0]) < sample_rate if sample_rate < 1 else np.ones(len(x), bool)
    a = unit_rows(np.asarray(x, dtype=np.float64)[keep])
    covariance = a.T @ a
    if noise_std > 0:
        upper = np.triu(rng.normal(0.0, noise_std, size=(d, d)))
        covariance = covariance + upper + np.triu(upper, 1).T
    eigenvalues, eigenvectors = np.linalg.eigh(covariance)
    order = np.argsort(eigenvalues)[::-1][:components]
    return np.ascontiguousarray(eigenvectors[:, order])


def pca_event(*, noise_std: float, sample_rate: float) -> DpEvent:
    """The privacy event of :func:`dp_pca_directions` (sensitivity 1, see the module text)."""
    gaussian = GaussianEvent(noise_std)
    return gaussian if sample_rate >= 1 else PoissonSampledEvent(sample_rate, gaussian)


def random_directions(dimension: int, components: int, rng: np.random.Generator) -> np.ndarray:
    """``components`` orthonormal directions (columns, d x k) drawn uniformly at random.

    The data-independent baseline of Abadi et al. 2016, §5.2 ("random projection", Fig. 5(1)):
    it uses no data, so it costs no privacy.
    """
    if not 1 <= components <= dimension:
        raise InvalidParameterError("components", f"in [1, {dimension}]", components)
    gaussian = rng.normal(size=(dimension, components))
    return np.ascontiguousarray(np.linalg.qr(gaussian)[0])
