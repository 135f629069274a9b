"""DP-PCA of the Abadi et al. 2016 reproduction, on generated data (no real data)."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.events import GaussianEvent, PoissonSampledEvent
from reproductions.abadi2016.mnist import MnistConfig, learning_rate
from reproductions.abadi2016.pca import dp_pca_directions, pca_event, unit_rows


def _low_rank(
    rng: np.random.Generator, n: int = 2000, d: int = 20
) -> tuple[np.ndarray, np.ndarray]:
    basis = np.linalg.qr(rng.normal(size=(d, 3)))[0]
    x = rng.normal(size=(n, 3)) * np.array([5.0, 3.0, 2.0]) @ basis.T
    return x + 0.01 * rng.normal(size=(n, d)), basis


def test_exact_pca_recovers_subspace() -> None:
    rng = np.random.default_rng(0)
    x, basis = _low_rank(rng)
    v = dp_pca_directions(x, components=3, noise_std=0.0, sample_rate=1.0, rng=rng)
    assert v.shape == (20, 3)
    np.testing.assert_allclose(v.T @ v, np.eye(3), atol=1e-10)
    # the projection onto the found subspace keeps the true basis
    assert np.linalg.norm(v @ (v.T @ basis) - basis) < 1e-2


def test_noisy_pca_close_with_small_noise_and_far_with_huge_noise() -> None:
    rng = np.random.default_rng(1)
    x, basis = _low_rank(rng)
    small = dp_pca_directions(x, components=3, noise_std=1.0, sample_rate=0.5, rng=rng)
    assert np.linalg.norm(small @ (small.T @ basis) - basis) < 0.2
    huge = dp_pca_directions(x, components=3, noise_std=1e6, sample_rate=0.5, rng=rng)
    assert np.linalg.norm(huge @ (huge.T @ basis) - basis) > 0.5


def test_upper_triangle_sensitivity_at_most_one() -> None:
    rng = np.random.default_rng(2)
    for row in unit_rows(rng.normal(size=(200, 15)) * rng.exponential(size=(200, 15))):
        outer = np.outer(row, row)
        assert np.linalg.norm(outer[np.triu_indices(15)]) <= 1 + 1e-12


def test_event_and_validation() -> None:
    assert pca_event(noise_std=4.0, sample_rate=1.0) == GaussianEvent(4.0)
    assert pca_event(noise_std=4.0, sample_rate=0.1) == PoissonSampledEvent(0.1, GaussianEvent(4.0))
    rng = np.random.default_rng(3)
    with pytest.raises(ValueError):
        dp_pca_directions(np.ones((5, 4)), components=5, noise_std=1.0, sample_rate=1.0, rng=rng)
    with pytest.raises(ValueError):
        dp_pca_directions(np.ones((5, 4)), components=2, noise_std=1.0, sample_rate=0.0, rng=rng)


def test_learning_rate_schedule() -> None:
    config = MnistConfig()
    assert learning_rate(config, 0.0) == pytest.approx(0.1)
    assert learning_rate(config, 5.0) == pytest.approx(0.076)
    assert learning_rate(config, 10.0) == pytest.approx(0.052)
    assert learning_rate(config, 300.0) == pytest.approx(0.052)
