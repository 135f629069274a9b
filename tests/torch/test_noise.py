"""Noise sources: N(0, 1) moments (tests reject a correct source w.p. <= 1e-5), seeding rules."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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


def _on_24_bit_grid(draws: torch.Tensor) -> tuple[int, float]:
    """Tail pairs of Box–Muller draws, and the share whose radius comes from a 24-bit uniform.

    torch pairs draw j with draw j + 8 in each block of 16 (one uniform gives both their radius
    ``r = sqrt(-2 ln u)``); a 24-bit uniform makes ``2**24 exp(-r^2 / 2)`` an integer.
    """
    pairs = draws.double().view(-1, 2, 8)
    squared = (pairs[:, 0] ** 2 + pairs[:, 1] ** 2).flatten()
    tail = squared[squared > 16.0]  # radius beyond 4: where the grid is coarse
    scaled = torch.exp(-tail / 2) * 2.0**24
    return tail.numel(), float(((scaled - scaled.round()).abs() < 0.05).double().mean())


def test_float32_parameters_get_float64_draws_rounded_a_block_at_a_time() -> None:
    """The draws equal one float64 draw of the whole tensor, rounded (whatever the block split),
    are standard normal, and their tails are not torch's float32 normals' 24-bit grid (which
    stops at 5.77 sigma: the reason to draw in float64, module docstring of dpcore.torch.noise)."""
    cpu = torch.device("cpu")
    block = SeededGaussianNoise.BLOCK
    for count in (17, 2 * block - 1, 2 * block + 5, 3 * block + 16, 3 * block + 21):
        draws = SeededGaussianNoise(7).standard_normal(
            torch.Size((count,)), dtype=torch.float32, device=cpu
        )
        generator = torch.Generator().manual_seed(7)
        whole = torch.randn(count, generator=generator, dtype=torch.float64)
        assert draws.dtype == torch.float32
        assert torch.equal(draws, whole.to(torch.float32))
    draws = SeededGaussianNoise(0).standard_normal(
        torch.Size((1024, 1024)), dtype=torch.float32, device=cpu
    )
    _check_standard_normal(draws)
    tail_pairs, on_grid = _on_24_bit_grid(draws)
    assert tail_pairs > 100 and on_grid < 0.5  # about 0.1 by chance
    float32 = torch.randn(1024 * 1024, generator=torch.Generator().manual_seed(0))
    assert _on_24_bit_grid(float32)[1] == 1.0


class _Allocations(TorchDispatchMode):
    """Records the dtype and size of every tensor an operation returns while open."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        result = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.Tensor):
                self.seen.append((leaf.dtype, leaf.numel()))
        return result


def test_a_float32_noise_step_allocates_no_float64_tensor_of_a_parameters_size() -> None:
    torch.manual_seed(0)
    model = nn.Linear(512, 512)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=VmapEngine(model, max_grad_norm=1.0),
        noise_multiplier=1.0,
        expected_batch_size=4.0,
        noise=SeededGaussianNoise(0),
    )
    summed = [torch.zeros_like(p) for p in model.parameters()]
    batch = ClippedBatch(summed, torch.zeros(0), torch.zeros(0), torch.zeros(0), None)
    with _Allocations() as allocations:
        optimizer.step(batch)
    assert any(dtype == torch.float64 for dtype, _ in allocations.seen)  # the draws' blocks
    largest = max(size for dtype, size in allocations.seen if dtype == torch.float64)
    assert largest <= SeededGaussianNoise.BLOCK + 16 < model.weight.numel()
