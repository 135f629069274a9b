"""The DP optimizer: noise law, division by the expected lot size, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import ClippedBatch
from dpcore.torch.per_example.vmap import VmapEngine

FALSE_REJECTION = 1e-5


def _optimizer(model: nn.Module, **kwargs: float) -> DPOptimizer:
    engine = VmapEngine(model, max_grad_norm=kwargs.pop("clip", 2.0))
    options = {"noise_multiplier": 1.5, "expected_batch_size": 40.0} | kwargs
    return DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=engine,
        noise=SeededGaussianNoise(0),
        **options,  # type: ignore[arg-type]
    )


def test_noisy_gradient_has_mean_sum_over_q_n_and_sd_sigma_c_over_q_n() -> None:
    """(S + N(0, s^2 C^2)) / (qN) per coordinate; z-test of the mean and chi-square of the
    variance over 300 x 200 coordinates, 1e-5 in total."""
    model = nn.Linear(200, 300, bias=False).double()
    optimizer = _optimizer(model)
    summed = torch.full((300, 200), 4.0, dtype=torch.float64)
    batch = ClippedBatch([summed], torch.zeros(0), torch.zeros(0), torch.zeros(0), None)
    (noisy,) = optimizer.privatise(batch)
    standardised = (noisy * 40.0 - 4.0) / (1.5 * 2.0)
    n = standardised.numel()
    assert abs(float(standardised.mean()) * math.sqrt(n)) < stats.norm.isf(FALSE_REJECTION / 4)
    low, high = stats.chi2.ppf([FALSE_REJECTION / 4, 1 - FALSE_REJECTION / 4], df=n)
    assert low < float(standardised.square().sum()) < high


def test_step_sets_gradients_and_steps_the_wrapped_optimizer() -> None:
    model = nn.Linear(3, 1, bias=False).double()
    before = model.weight.detach().clone()
    optimizer = _optimizer(model)
    summed = torch.ones(1, 3, dtype=torch.float64)
    batch = ClippedBatch([summed], torch.zeros(0), torch.zeros(0), torch.zeros(0), None)
    optimizer.step(batch)
    assert model.weight.grad is not None
    torch.testing.assert_close(model.weight.detach(), before - 0.1 * model.weight.grad)


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"expected_batch_size": 0.0}, "expected_batch_size"),
        ({"clip": 0.0}, "max_grad_norm"),
        ({"clip": -2.0}, "max_grad_norm"),
    ],
)
def test_bad_privacy_parameters_are_rejected(kwargs: dict[str, float], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        _optimizer(nn.Linear(2, 2), **kwargs)


def test_optimizer_over_other_parameters_is_rejected() -> None:
    model, other = nn.Linear(2, 2), nn.Linear(2, 2)
    engine = VmapEngine(model, max_grad_norm=1.0)
    with pytest.raises(InvalidParameterError, match="Expected optimizer to hold exactly the model"):
        DPOptimizer(
            torch.optim.SGD(other.parameters(), lr=0.1),
            engine=engine,
            noise_multiplier=1.0,
            expected_batch_size=10.0,
        )
    with pytest.raises(InvalidParameterError, match="Expected optimizer to hold exactly"):
        DPOptimizer(
            torch.optim.SGD([model.weight], lr=0.1),  # the bias is missing
            engine=engine,
            noise_multiplier=1.0,
            expected_batch_size=10.0,
        )
    with pytest.raises(InvalidParameterError, match=r"Expected optimizer to be a torch\.optim"):
        DPOptimizer(
            "sgd",  # type: ignore[arg-type]
            engine=engine,
            noise_multiplier=1.0,
            expected_batch_size=10.0,
        )


def test_frozen_parameters_in_the_optimizer_are_ignored() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0].requires_grad_(False)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=VmapEngine(model, max_grad_norm=1.0),
        noise_multiplier=1.0,
        expected_batch_size=10.0,
    )
    assert len(optimizer.engine.parameters) == 2
