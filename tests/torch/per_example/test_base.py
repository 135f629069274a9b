"""Clip factors: min(1, C / norm), non-finite policy, loss shape check, empty lots."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.errors import IncompatibleModelError, NonFiniteGradientError
from dpcore.torch.per_example.base import ClippedBatch, clip_factors
from dpcore.torch.per_example.fast import FastEngine
from dpcore.torch.per_example.vmap import VmapEngine


def test_clip_factors_bound_every_norm() -> None:
    norms = torch.tensor([0.0, 1e-300, 0.5, 1.0, 2.0, 1e300], dtype=torch.float64)
    factors = clip_factors(norms, max_grad_norm=1.0)
    assert torch.equal(factors[:4], torch.ones(4, dtype=torch.float64))
    assert bool((factors * norms <= 1.0 * (1 + 1e-12)).all())
    assert float(factors[4]) == 0.5


def test_non_finite_norms_raise_or_are_dropped() -> None:
    norms = torch.tensor([1.0, math.nan, math.inf, 3.0])
    with pytest.raises(NonFiniteGradientError, match=r"examples \[1, 2\]"):
        clip_factors(norms, max_grad_norm=1.0)
    factors = clip_factors(norms, max_grad_norm=1.0, nonfinite="zero")
    assert factors.tolist() == pytest.approx([1.0, 0.0, 0.0, 1 / 3])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_engine_rejects_bad_clipping_norm(bad: float) -> None:
    with pytest.raises(InvalidParameterError, match="Expected max_grad_norm"):
        VmapEngine(nn.Linear(2, 2), max_grad_norm=bad)


def test_engine_rejects_bad_policy_and_frozen_models() -> None:
    with pytest.raises(InvalidParameterError, match="Expected nonfinite in"):
        VmapEngine(nn.Linear(2, 2), max_grad_norm=1.0, nonfinite="ignore")  # type: ignore[arg-type]
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(IncompatibleModelError, match="no trainable parameter"):
        VmapEngine(frozen, max_grad_norm=1.0)


def test_loss_must_be_per_example() -> None:
    engine = VmapEngine(nn.Linear(2, 3), max_grad_norm=1.0)
    with pytest.raises(InvalidParameterError, match="reduction='none'"):
        engine.clipped_sum(
            torch.randn(4, 2), torch.zeros(4, dtype=torch.long), nn.CrossEntropyLoss()
        )


def test_empty_lot_gives_zero_sums_without_running_the_model() -> None:
    engine = VmapEngine(nn.Linear(2, 3), max_grad_norm=1.0)
    lot = engine.clipped_sum(
        torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), nn.CrossEntropyLoss(reduction="none")
    )
    assert [s.shape for s in lot.summed] == [(3, 2), (3,)]
    assert all(float(s.abs().sum()) == 0.0 for s in lot.summed)
    assert lot.outputs is None and lot.norms.numel() == 0


def test_mismatched_targets_are_rejected() -> None:
    engine = VmapEngine(nn.Linear(2, 3), max_grad_norm=1.0)
    with pytest.raises(InvalidParameterError, match="Expected targets to have batch size 4"):
        engine.clipped_sum(
            torch.randn(4, 2),
            torch.zeros(3, dtype=torch.long),
            nn.CrossEntropyLoss(reduction="none"),
        )


def test_audit_hooks_see_every_clipped_sum_and_can_be_removed() -> None:
    model = nn.Linear(3, 1).to(torch.float64)
    engine = FastEngine(model, max_grad_norm=1.0)
    seen: list[int] = []

    def shift(_: object, batch: ClippedBatch) -> ClippedBatch:
        seen.append(int(batch.clip_factors.numel()))
        return dataclasses.replace(batch, summed=[s + 1.0 for s in batch.summed])

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (outputs.squeeze(-1) - targets) ** 2

    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    plain = engine.clipped_sum(x, y, loss)
    remove = engine.add_audit_hook(shift)
    hooked = engine.clipped_sum(x, y, loss)
    empty = engine.clipped_sum(x[:0], y[:0], loss)  # an empty lot goes through the hook too
    remove()
    again = engine.clipped_sum(x, y, loss)
    assert seen == [5, 0]
    for a, b, c, d in zip(plain.summed, hooked.summed, empty.summed, again.summed, strict=True):
        assert torch.equal(b, a + 1.0) and torch.equal(c, torch.ones_like(a))
        assert torch.equal(d, a)


def test_a_statement_says_when_audit_hooks_are_installed() -> None:
    from dpcore.torch.ledger import PrivacyLedger, training_statement
    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.samplers import PoissonSampler

    model = nn.Linear(3, 1).to(torch.float64)
    engine = FastEngine(model, max_grad_norm=1.0)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        engine=engine,
        noise_multiplier=1.0,
        expected_batch_size=2.0,
    )
    ledger = PrivacyLedger(dataset_size=10)
    ledger.record(sampling_probability=0.2, noise_multiplier=1.0)
    sampler = PoissonSampler(10, sampling_probability=0.2, seed=0)
    plain = training_statement(ledger, 1e-5, ("rdp",), optimizer, sampler, None)
    assert "audit_hooks_installed" not in str(plain)
    engine.add_audit_hook(lambda _, batch: batch)
    hooked = training_statement(ledger, 1e-5, ("rdp",), optimizer, sampler, None)
    assert "'audit_hooks_installed': 1" in str(hooked)
