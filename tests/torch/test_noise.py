"""Noise sources: N(0, 1) moments and tails (tests reject a correct source w.p. <= 1e-5),
seeding rules, the ziggurat stream's blocks and states, old checkpoints' torch stream."""

from __future__ import annotations

import copy
import math
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.noise import (
    PCG64_ZIGGURAT,
    STREAMS,
    TORCH_BOX_MULLER,
    NoiseSource,
    SecureGaussianNoise,
    SeededGaussianNoise,
    checked_standard_normal,
)
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import ClippedBatch
from dpcore.torch.per_example.vmap import VmapEngine
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer

FALSE_REJECTION = 1e-5
CPU = torch.device("cpu")


def _check_standard_normal(draws: torch.Tensor) -> None:
    """Mean (z-test) and variance (chi-square on the sum of squares), each at 1e-5 / 2."""
    n = draws.numel()
    values = draws.double().flatten()
    z = float(values.mean()) * math.sqrt(n)
    assert abs(z) < stats.norm.isf(FALSE_REJECTION / 4)
    low, high = stats.chi2.ppf([FALSE_REJECTION / 4, 1 - FALSE_REJECTION / 4], df=n)
    assert low < float(values.square().sum()) < high
    assert stats.kstest(values.numpy(), "norm").pvalue > FALSE_REJECTION


@pytest.mark.parametrize(
    "source",
    [
        SeededGaussianNoise(0),
        SeededGaussianNoise(0, stream=TORCH_BOX_MULLER),
        SecureGaussianNoise(),
    ],
)
def test_sources_draw_standard_normals(source: NoiseSource) -> None:
    draws = source.standard_normal(
        torch.Size((300, 401)), dtype=torch.float64, device=torch.device("cpu")
    )
    assert draws.shape == (300, 401)
    _check_standard_normal(draws)


@pytest.mark.parametrize("stream", STREAMS)
def test_seeded_source_is_reproducible_and_resumable(stream: str) -> None:
    """Same seed, same draws; another seed, other draws; a state taken mid-stream resumes it
    exactly (in another source, of another seed), whatever the dtypes drawn before."""
    a, b = SeededGaussianNoise(11, stream=stream), SeededGaussianNoise(11, stream=stream)
    first = a.standard_normal(torch.Size((5,)), dtype=torch.float32, device=CPU)
    assert torch.equal(first, b.standard_normal(torch.Size((5,)), dtype=torch.float32, device=CPU))
    other = SeededGaussianNoise(12, stream=stream)
    assert not torch.equal(
        first, other.standard_normal(torch.Size((5,)), dtype=torch.float32, device=CPU)
    )
    a.standard_normal(torch.Size((3, 70_000)), dtype=torch.float32, device=CPU)  # blocked draws
    state = a.state_dict()
    expected = a.standard_normal(torch.Size((7,)), dtype=torch.float64, device=CPU)
    c = SeededGaussianNoise(0)  # the default stream: the state selects the stream
    c.load_state_dict(state)
    assert c.stream == stream and c.seed == 11
    assert torch.equal(
        c.standard_normal(torch.Size((7,)), dtype=torch.float64, device=CPU), expected
    )
    assert _same(c.state_dict(), a.state_dict())


def _same(a: Any, b: Any) -> bool:
    """Deep equality of states: tensors bit for bit, dicts, values of the same type."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_ziggurat_blocks_equal_one_whole_float64_draw_rounded(dtype: torch.dtype) -> None:
    """numpy draws one normal after another, so the blocks (of any size, a short last one
    included) equal one float64 ``standard_normal`` of the whole tensor, rounded to ``dtype``."""
    default = SeededGaussianNoise.BLOCK
    for block in (16, 1000, default):
        for shape in (
            (0,),
            (1,),
            (block - 1,),
            (block,),
            (block + 1,),
            (3, block + 7),
            (default + 5,),
            (2, default + 3),
        ):
            source = SeededGaussianNoise(7)
            source.BLOCK = block
            draws = source.standard_normal(torch.Size(shape), dtype=dtype, device=CPU)
            whole = np.random.Generator(np.random.PCG64(7)).standard_normal(math.prod(shape))
            assert draws.dtype == dtype and draws.shape == shape
            assert torch.equal(draws, torch.from_numpy(whole).to(dtype).view(shape)), (block, shape)


def test_ziggurat_float32_draws_are_standard_normal() -> None:
    draws = SeededGaussianNoise(0).standard_normal(
        torch.Size((1024, 1024)), dtype=torch.float32, device=CPU
    )
    assert draws.dtype == torch.float32
    _check_standard_normal(draws)


def test_ziggurat_tail_is_gaussian_beyond_its_base_layer() -> None:
    """Over 1e7 draws, the ziggurat's exponential-rejection tail (beyond its base ``r``): the
    counts beyond r, 4.5 and 5 sigma are binomial with the Gaussian's mass (two-sided tests),
    the draws beyond r follow N(0, 1) conditioned on ``|x| > r`` (KS), and the largest |draw|
    exceeds the ``t`` that 1e7 Gaussian draws all stay below with chance ``alpha`` (t = 4.84;
    torch's float32 normals stop at 5.77). Five tests at ``alpha = 1e-5 / 5`` each."""
    alpha = FALSE_REJECTION / 5
    n = 10_000_000
    draws = SeededGaussianNoise(2).standard_normal(
        torch.Size((n,)), dtype=torch.float64, device=CPU
    )
    magnitudes = draws.abs().numpy()
    r = 3.6541528853610088  # numpy's ziggurat_nor_r: where the base layer's tail starts
    for threshold in (r, 4.5, 5.0):
        beyond = int((magnitudes > threshold).sum())
        assert stats.binomtest(beyond, n, 2 * stats.norm.sf(threshold)).pvalue > alpha, threshold
    tail = magnitudes[magnitudes > r]
    conditioned = stats.truncnorm(a=r, b=math.inf)
    assert stats.kstest(tail, conditioned.cdf).pvalue > alpha
    # P(max |x| < t) = (1 - 2 sf(t))**n <= exp(-2 n sf(t)) = alpha
    t = stats.norm.isf(-math.log(alpha) / (2 * n))
    assert float(magnitudes.max()) > t


def test_torch_stream_blocks_equal_one_whole_draw_and_leave_the_24_bit_grid() -> None:
    """The torch stream (old checkpoints'): the draws equal one float64 ``torch.randn`` of the
    whole tensor, rounded (whatever the block split), are standard normal, and their tails are
    not torch's float32 normals' 24-bit grid (which stops at 5.77 sigma: the reason to draw in
    float64, module docstring of dpcore.torch.noise)."""
    block = SeededGaussianNoise.BLOCK
    for count in (17, 2 * block - 1, 2 * block + 5, 3 * block + 16, 3 * block + 21):
        draws = SeededGaussianNoise(7, stream=TORCH_BOX_MULLER).standard_normal(
            torch.Size((count,)), dtype=torch.float32, device=CPU
        )
        generator = torch.Generator().manual_seed(7)
        whole = torch.randn(count, generator=generator, dtype=torch.float64)
        assert draws.dtype == torch.float32
        assert torch.equal(draws, whole.to(torch.float32))
    draws = SeededGaussianNoise(0, stream=TORCH_BOX_MULLER).standard_normal(
        torch.Size((1024, 1024)), dtype=torch.float32, device=CPU
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


@pytest.mark.parametrize("stream", STREAMS)
def test_a_float32_noise_step_allocates_no_float64_array_of_a_parameters_size(stream: str) -> None:
    """torch's tensors are seen by a dispatch mode, numpy's arrays by tracemalloc (numpy reports
    its data to it; torch does not): neither holds a float64 copy of the 512 x 512 weight."""
    torch.manual_seed(0)
    model = nn.Linear(512, 512)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=VmapEngine(model, max_grad_norm=1.0),
        noise_multiplier=1.0,
        expected_batch_size=4.0,
        noise=SeededGaussianNoise(0, stream=stream),
    )
    summed = [torch.zeros_like(p) for p in model.parameters()]
    batch = ClippedBatch(summed, torch.zeros(0), torch.zeros(0), torch.zeros(0), None)
    tracemalloc.start()
    try:
        with _Allocations() as allocations:
            optimizer.step(batch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    block = SeededGaussianNoise.BLOCK
    float64 = [size for dtype, size in allocations.seen if dtype == torch.float64]
    assert max(float64, default=0) <= block + 16 < model.weight.numel()
    assert peak < 8 * model.weight.numel() // 2
    if stream == PCG64_ZIGGURAT:
        assert peak >= 8 * block  # the float64 block is numpy's, and it was seen
    else:
        assert float64  # the float64 blocks are torch's


def test_ziggurat_state_is_numpys_in_plain_values_and_a_copy() -> None:
    source = SeededGaussianNoise(5)
    source.standard_normal(torch.Size((10,)), dtype=torch.float64, device=CPU)
    state = source.state_dict()
    assert state.keys() == {"name", "seed", "stream", "bit_generator"}
    assert (state["name"], state["seed"], state["stream"]) == ("seeded", 5, PCG64_ZIGGURAT)
    assert source.rng is not None and state["bit_generator"] == source.rng.bit_generator.state
    numpy_state = state["bit_generator"]
    assert type(numpy_state["bit_generator"]) is str
    for value in (
        *numpy_state["state"].values(),
        numpy_state["has_uint32"],
        numpy_state["uinteger"],
    ):
        assert type(value) is int
    kept = copy.deepcopy(state)
    source.standard_normal(torch.Size((10,)), dtype=torch.float64, device=CPU)
    assert _same(state, kept) and not _same(source.state_dict(), kept)


def test_an_old_state_resumes_the_torch_box_muller_stream_exactly() -> None:
    """A state written before the ziggurat (``"generator"``, a ByteTensor, no ``"stream"``)
    loads into a default source, which then continues torch's float64 stream of that seed."""
    reference = torch.Generator().manual_seed(21)
    torch.randn(3 * 70_000, generator=reference, dtype=torch.float64)
    old = {"name": "seeded", "seed": 21, "generator": reference.get_state()}
    legacy = SeededGaussianNoise(21, stream=TORCH_BOX_MULLER)
    legacy.standard_normal(torch.Size((3, 70_000)), dtype=torch.float32, device=CPU)
    assert _same(legacy.state_dict(), old)  # the torch stream still writes the old format
    for state in (old, {**old, "stream": TORCH_BOX_MULLER}):
        source = SeededGaussianNoise(0)
        source.load_state_dict(copy.deepcopy(state))
        assert (source.stream, source.seed) == (TORCH_BOX_MULLER, 21)
        draws = source.standard_normal(torch.Size((4, 50_000)), dtype=torch.float32, device=CPU)
        continued = torch.Generator()
        continued.set_state(reference.get_state())
        expected = torch.randn(200_000, generator=continued, dtype=torch.float64)
        assert torch.equal(draws, expected.to(torch.float32).view(4, 50_000))
    source.load_state_dict(SeededGaussianNoise(4).state_dict())  # and back to the ziggurat
    assert source.stream == PCG64_ZIGGURAT
    assert torch.equal(
        source.standard_normal(torch.Size((9,)), dtype=torch.float64, device=CPU),
        torch.from_numpy(np.random.Generator(np.random.PCG64(4)).standard_normal(9)),
    )


def _edited(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A deep copy of ``state`` with the entry at ``path`` set to ``value`` (deleted if ``...``)."""
    edited = copy.deepcopy(state)
    where = edited
    for key in path[:-1]:
        where = where[key]
    if value is ...:
        del where[path[-1]]
    else:
        where[path[-1]] = value
    return edited


_ZIGGURAT_REFUSALS: list[tuple[tuple[str, ...], Any, str]] = [
    (("name",), "secure", "Expected the state of a 'seeded' noise source"),
    (("seed",), 2**63, "noise seed"),
    (("seed",), True, "noise seed"),
    (("stream",), "pcg64-box-muller", "noise stream to be one of"),
    (("stream",), None, "noise stream to be one of"),
    (("bit_generator",), ..., "must be a dict"),
    (("bit_generator", "bit_generator"), "MT19937", "not 'PCG64'"),
    (("bit_generator", "extra"), 0, "must be a dict with keys"),
    (("bit_generator", "uinteger"), ..., "must be a dict with keys"),
    (("bit_generator", "state"), [1, 3], "must hold 'state'"),
    (("bit_generator", "state", "inc"), ..., "must hold 'state'"),
    (("bit_generator", "state", "state"), 2**128, "'state' to be an integer"),
    (("bit_generator", "state", "state"), -1, "'state' to be an integer"),
    (("bit_generator", "state", "inc"), 1.0, "'inc' to be an integer"),
    (("bit_generator", "state", "inc"), 4, "'inc' must be odd"),
    (("bit_generator", "has_uint32"), 2, "'has_uint32' to be an integer"),
    (("bit_generator", "has_uint32"), True, "'has_uint32' to be an integer"),
    (("bit_generator", "uinteger"), 2**32, "'uinteger' to be an integer"),
]


@pytest.mark.parametrize(("path", "value", "fragment"), _ZIGGURAT_REFUSALS)
def test_a_malformed_ziggurat_state_is_refused_and_nothing_changes(
    path: tuple[str, ...], value: Any, fragment: str
) -> None:
    source, twin = SeededGaussianNoise(3), SeededGaussianNoise(3)
    for each in (source, twin):
        each.standard_normal(torch.Size((5,)), dtype=torch.float64, device=CPU)
    before = source.state_dict()
    edited = _edited(SeededGaussianNoise(8).state_dict(), path, value)
    with pytest.raises(StateError, match=fragment):
        source.check_state_dict(edited)
    with pytest.raises(StateError, match=fragment):
        source.load_state_dict(edited)
    assert _same(source.state_dict(), before)
    shape = torch.Size((6,))
    assert torch.equal(
        source.standard_normal(shape, dtype=torch.float64, device=CPU),
        twin.standard_normal(shape, dtype=torch.float64, device=CPU),
    )


@pytest.mark.parametrize(
    ("path", "value", "fragment"),
    [
        (("generator",), ..., "lacks 'generator'"),
        (("generator",), torch.zeros(3), "generator state is malformed"),
        (("generator",), torch.zeros(2, dtype=torch.uint8), "generator state is malformed"),
        (("seed",), -1, "noise seed"),
    ],
)
def test_a_malformed_old_state_is_refused_and_nothing_changes(
    path: tuple[str, ...], value: Any, fragment: str
) -> None:
    source = SeededGaussianNoise(3)
    before = source.state_dict()
    old = SeededGaussianNoise(8, stream=TORCH_BOX_MULLER).state_dict()
    with pytest.raises(StateError, match=fragment):
        source.load_state_dict(_edited(old, path, value))
    assert _same(source.state_dict(), before)


def test_an_unknown_stream_is_refused_by_the_constructor() -> None:
    with pytest.raises(InvalidParameterError, match="Expected stream to be one of"):
        SeededGaussianNoise(0, stream="mt19937")


def _trainer(noise: SeededGaussianNoise) -> DPTrainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).double()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(32, 4, generator=generator, dtype=torch.float64)
    return DPTrainer.dp_sgd(
        model,
        lr=0.1,
        inputs=inputs,
        targets=(inputs[:, 0] > 0).long(),
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        sampler=PoissonSampler(32, sampling_probability=0.25, seed=3),
        engine="vmap",
        noise=noise,
    )


@pytest.mark.parametrize("stream", STREAMS)
def test_a_checkpoint_resumes_the_noise_stream(stream: str, tmp_path: Path) -> None:
    """A trainer's checkpoint (``torch.load(weights_only=True)``: numpy's 128-bit ints must
    survive it) resumes the stream it was written with, the torch one (an old checkpoint's)
    into a trainer whose source is the ziggurat: the next draws, and the next step, equal."""
    first = _trainer(SeededGaussianNoise(5, stream=stream))
    first.step()
    first.save_checkpoint(tmp_path / "run.pt")
    saved = torch.load(tmp_path / "run.pt", weights_only=True)["optimizer"]["noise"]
    assert _same(saved, first.optimizer.noise.state_dict())
    if stream == PCG64_ZIGGURAT:
        assert max(saved["bit_generator"]["state"].values()) >= 2**64  # a 128-bit int
    resumed = _trainer(SeededGaussianNoise(99))
    resumed.load_checkpoint(tmp_path / "run.pt")
    noise = resumed.optimizer.noise
    assert isinstance(noise, SeededGaussianNoise) and noise.stream == stream
    first.step()
    resumed.step()
    for a, b in zip(resumed.model.parameters(), first.model.parameters(), strict=True):
        assert torch.equal(a, b)
    shape = torch.Size((3, 70_000))
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(
            noise.standard_normal(shape, dtype=dtype, device=CPU),
            first.optimizer.noise.standard_normal(shape, dtype=dtype, device=CPU),
        )
