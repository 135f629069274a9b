"""Lot samplers: Poisson inclusion rates, lot-size law, empty lots, shuffling, resumption.

Statistical tests use fixed seeds; each states its false-rejection rate under a correct sampler.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.samplers import (
    BallsInBinsSampler,
    PoissonMismatchWarning,
    PoissonSampler,
    ShuffledBatchSampler,
)

FALSE_REJECTION = 1e-5


def test_poisson_inclusion_rate_and_lot_size_law() -> None:
    """Counts per record ~ Bin(L, q) and lot sizes ~ Bin(N, q); each test rejects w.p. <= 1e-5."""
    n, q, lots = 2_000, 0.05, 600
    sampler = PoissonSampler(n, sampling_probability=q, seed=1)
    counts = np.zeros(n)
    sizes = []
    for _ in range(lots):
        lot = sampler.sample()
        assert torch.equal(lot, torch.unique(lot))  # sorted, no repeats
        counts[lot.numpy()] += 1
        sizes.append(len(lot))
    # Total inclusions ~ Bin(n * lots, q): two-sided normal test.
    total = counts.sum()
    z = (total - n * lots * q) / math.sqrt(n * lots * q * (1 - q))
    assert abs(z) < stats.norm.isf(FALSE_REJECTION / 2)
    # Per-record counts: dispersion (chi-square) test of Bin(lots, q) across records.
    dispersion = ((counts - lots * q) ** 2).sum() / (lots * q * (1 - q))
    low, high = stats.chi2.ppf([FALSE_REJECTION / 2, 1 - FALSE_REJECTION / 2], df=n)
    assert low < dispersion < high
    # Lot sizes against Bin(n, q): Kolmogorov-Smirnov on the discrete law is conservative.
    result = stats.kstest(sizes, stats.binom(n, q).cdf)
    assert result.pvalue > FALSE_REJECTION


def test_poisson_lots_can_be_empty() -> None:
    """With q N = 0.5, about e^{-0.5} = 61 % of lots are empty; the sampler returns them."""
    sampler = PoissonSampler(5, sampling_probability=0.1, seed=3)
    sizes = [len(sampler.sample()) for _ in range(2_000)]
    empty = sizes.count(0)
    expected = 2_000 * 0.9**5
    assert abs(empty - expected) < stats.norm.isf(FALSE_REJECTION / 2) * math.sqrt(
        2_000 * 0.9**5 * (1 - 0.9**5)
    )
    assert sampler.lots_drawn == 2_000


def test_poisson_epoch_length_and_expected_lot_size() -> None:
    sampler = PoissonSampler(60_000, sampling_probability=256 / 60_000, seed=0)
    assert len(sampler) == round(60_000 / 256)
    assert sampler.expected_lot_size == pytest.approx(256)
    assert len(list(sampler)) == len(sampler)


@pytest.mark.parametrize("make", ["poisson", "shuffled", "balls_in_bins"])
def test_sampler_resumes_mid_epoch(make: str) -> None:
    def build() -> PoissonSampler | ShuffledBatchSampler | BallsInBinsSampler:
        if make == "poisson":
            return PoissonSampler(100, sampling_probability=0.1, seed=7)
        if make == "balls_in_bins":
            return BallsInBinsSampler(100, steps_per_epoch=10, seed=7)
        with pytest.warns(PoissonMismatchWarning):
            return ShuffledBatchSampler(100, batch_size=10, seed=7)

    straight = build()
    expected = [straight.sample() for _ in range(25)]
    first = build()
    head = [first.sample() for _ in range(13)]
    state = first.state_dict()
    resumed = build()
    resumed.load_state_dict(state)
    tail = [resumed.sample() for _ in range(12)]
    for a, b in zip(expected, head + tail, strict=True):
        assert torch.equal(a, b)


def test_shuffled_sampler_warns_and_partitions_each_epoch() -> None:
    with pytest.warns(PoissonMismatchWarning, match="Poisson"):
        sampler = ShuffledBatchSampler(50, batch_size=10, seed=0)
    assert not sampler.matches_poisson_analysis
    assert sampler.sampling_probability == pytest.approx(0.2)
    epoch = torch.cat(list(sampler))
    assert torch.equal(torch.sort(epoch).values, torch.arange(50))


def test_seeds_give_reproducible_lots() -> None:
    a = PoissonSampler(100, sampling_probability=0.3, seed=5)
    b = PoissonSampler(100, sampling_probability=0.3, seed=5)
    assert all(torch.equal(a.sample(), b.sample()) for _ in range(5))


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"dataset_size": 0, "sampling_probability": 0.1}, "dataset_size"),
        ({"dataset_size": 10, "sampling_probability": 0.0}, "sampling_probability"),
        ({"dataset_size": 10, "sampling_probability": -0.1}, "sampling_probability"),
        ({"dataset_size": 10, "sampling_probability": 1.5}, "sampling_probability"),
        ({"dataset_size": 10, "sampling_probability": math.nan}, "sampling_probability"),
        ({"dataset_size": 10, "sampling_probability": 0.1, "seed": -1}, "seed"),
    ],
)
def test_poisson_rejects_bad_input(kwargs: dict[str, float], parameter: str) -> None:
    size = kwargs.pop("dataset_size")
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        PoissonSampler(size, **kwargs)  # type: ignore[arg-type]


def test_shuffled_rejects_batch_larger_than_data() -> None:
    with pytest.raises(InvalidParameterError, match="Expected batch_size <= dataset_size = 5"):
        ShuffledBatchSampler(5, batch_size=6, seed=0)


def test_state_of_another_sampler_kind_is_refused() -> None:
    poisson = PoissonSampler(10, sampling_probability=0.5, seed=0)
    with pytest.warns(PoissonMismatchWarning):
        shuffled = ShuffledBatchSampler(10, batch_size=2, seed=0)
    with pytest.raises(StateError, match="shuffled_fixed_size"):
        poisson.load_state_dict(shuffled.state_dict())


def test_balls_in_bins_uses_every_record_once_per_epoch() -> None:
    sampler = BallsInBinsSampler(500, steps_per_epoch=7, seed=1)
    assert not sampler.matches_poisson_analysis
    assert sampler.expected_lot_size == pytest.approx(500 / 7)
    for _ in range(3):
        epoch = list(sampler)
        assert len(epoch) == 7
        assert torch.equal(torch.sort(torch.cat(epoch)).values, torch.arange(500))


def test_balls_in_bins_assigns_steps_uniformly() -> None:
    # Over 200 epochs, record 0 lands in each of the 5 steps about 40 times: chi-square test of
    # uniformity, rejecting a correct sampler with probability FALSE_REJECTION.
    sampler = BallsInBinsSampler(30, steps_per_epoch=5, seed=3)
    counts = np.zeros(5)
    for _ in range(200):
        for position, lot in enumerate(sampler):
            counts[position] += int((lot == 0).any())
    assert counts.sum() == 200
    assert stats.chisquare(counts).pvalue > FALSE_REJECTION


def test_balls_in_bins_rejects_bad_input() -> None:
    with pytest.raises(InvalidParameterError, match="Expected steps_per_epoch"):
        BallsInBinsSampler(10, steps_per_epoch=0)
