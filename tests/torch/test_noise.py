"""Noise sources: N(0, 1) moments (tests reject a correct source w.p. <= 1e-5), seeding rules."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import NoiseSource, SecureGaussianNoise, SeededGaussianNoise

FALSE_REJECTION = 1e-5


def _check_standard_normal(draws: torch.Tensor) -> None:
    """Mean (z-test) and variance (chi-square on the sum of squares), each at 1e-5 / 2."""
    n = draws.numel()
    values = draws.double().flatten()
    z = float(values.mean()) * math.sqrt(n)
    assert abs(z) < stats.norm.isf(FALSE_REJECTION / 4)
    low, high = stats.chi2.ppf([FALSE_REJECTION / 4, 1 - FALSE_REJECTION / 4], df=n)
    assert low < float(values.square().sum()) < high
    assert stats.kstest(values.numpy(), "norm").pvalue > FALSE_REJECTION


@pytest.mark.parametrize("source", [SeededGaussianNoise(0), SecureGaussianNoise()])
def test_sources_draw_standard_normals(source: NoiseSource) -> None:
    draws = source.standard_normal(
        torch.Size((300, 401)), dtype=torch.float64, device=torch.device("cpu")
    )
    assert draws.shape == (300, 401)
    _check_standard_normal(draws)


def test_seeded_source_is_reproducible_and_resumable() -> None:
    cpu = torch.device("cpu")
    a, b = SeededGaussianNoise(11), SeededGaussianNoise(11)
    assert torch.equal(
        a.standard_normal(torch.Size((5,)), dtype=torch.float32, device=cpu),
        b.standard_normal(torch.Size((5,)), dtype=torch.float32, device=cpu),
    )
    state = a.state_dict()
    expected = a.standard_normal(torch.Size((7,)), dtype=torch.float64, device=cpu)
    c = SeededGaussianNoise(0)
    c.load_state_dict(state)
    assert torch.equal(
        c.standard_normal(torch.Size((7,)), dtype=torch.float64, device=cpu), expected
    )


def test_secure_source_refuses_a_seed_and_differs_between_calls() -> None:
    with pytest.raises(InvalidParameterError, match="Expected seed to be None"):
        SecureGaussianNoise(seed=1)
    source = SecureGaussianNoise()
    cpu = torch.device("cpu")
    first = source.standard_normal(torch.Size((64,)), dtype=torch.float64, device=cpu)
    second = source.standard_normal(torch.Size((64,)), dtype=torch.float64, device=cpu)
    assert not torch.equal(first, second)
    odd = source.standard_normal(torch.Size((3, 3)), dtype=torch.float32, device=cpu)
    assert odd.shape == (3, 3) and bool(torch.isfinite(odd).all())
