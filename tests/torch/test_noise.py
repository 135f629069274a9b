"""Noise sources: N(0, 1) moments (tests reject a correct source w.p. <= 1e-5), seeding rules."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import (
    NoiseSource,
    SecureGaussianNoise,
    SeededGaussianNoise,
    checked_standard_normal,
)
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import ClippedBatch
from dpcore.torch.per_example.vmap import VmapEngine

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


class _ScalarNoise(NoiseSource):
    """Returns one scalar, which would broadcast to the same draw for every coordinate."""

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.tensor(0.0)


class _NaNNoise(NoiseSource):
    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.full(shape, math.nan, dtype=dtype, device=device)


class _InfiniteNoise(NoiseSource):
    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        draws = torch.zeros(shape, dtype=dtype, device=device)
        draws.view(-1)[-1] = math.inf  # one bad coordinate among finite ones
        return draws


class _Float32Noise(NoiseSource):
    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.float32, device=device)


class _TransposedNoise(NoiseSource):
    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.zeros(tuple(reversed(shape)), dtype=dtype, device=device)


class _ListNoise(NoiseSource):
    def standard_normal(  # type: ignore[override]
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> list[float]:
        return [0.0] * math.prod(shape)


class _MetaNoise(NoiseSource):
    """Another device (the meta device stands in for a GPU on a CPU-only machine)."""

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        (_ScalarNoise(), "shape, dtype and device"),
        (_NaNNoise(), "finite draws"),
        (_InfiniteNoise(), "finite draws"),
        (_Float32Noise(), "shape, dtype and device"),
        (_TransposedNoise(), "shape, dtype and device"),
        (_ListNoise(), "to return a torch.Tensor"),
        (_MetaNoise(), "shape, dtype and device"),
    ],
)
def test_bad_noise_source_is_refused_before_any_parameter_moves(
    source: NoiseSource, fragment: str
) -> None:
    # A scalar, NaN, wrong dtype/shape/device from a custom source used to be added as noise.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1)).double()
    before = [p.detach().clone() for p in model.parameters()]
    engine = VmapEngine(model, max_grad_norm=1.0)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=engine,
        noise_multiplier=1.0,
        expected_batch_size=4.0,
        noise=source,
    )
    summed = [torch.ones_like(p) for p in model.parameters()]
    batch = ClippedBatch(summed, torch.zeros(0), torch.zeros(0), torch.zeros(0), None)
    with pytest.raises(InvalidParameterError, match=f"Expected noise .*{fragment}") as info:
        optimizer.step(batch)
    assert info.value.parameter == "noise"
    assert type(source).__name__ in str(info.value)
    for parameter, original in zip(model.parameters(), before, strict=True):
        assert torch.equal(parameter.detach(), original)
        assert parameter.grad is None


def test_built_in_sources_pass_the_check() -> None:
    parameter = torch.zeros(4, 5, dtype=torch.float16)
    for source in (SeededGaussianNoise(3), SecureGaussianNoise()):
        draws = checked_standard_normal(source, parameter)
        assert draws.shape == (4, 5) and draws.dtype == torch.float16


@pytest.mark.parametrize("seed", [2**63, 2**64, 2**64 - 1, -1, 1.5, True])
def test_seeded_source_refuses_seeds_torch_cannot_take(seed: object) -> None:
    # One rule for every seed (the samplers' too): an integer in [0, 2**63).
    with pytest.raises(InvalidParameterError, match="Expected seed"):
        SeededGaussianNoise(seed)  # type: ignore[arg-type]
    assert SeededGaussianNoise(2**63 - 1).seed == 2**63 - 1
