"""Black-box runs: the public divisor, the CNN, and dpcore against Opacus 1.6 on one run."""

from __future__ import annotations

import dataclasses

import pytest

from audits.blackbox import training
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting
from dpcore.torch.optimizers import DPOptimizer

TINY = BlackBoxSetting(
    name="tiny", subset_size=40, pretrain_size=200, pretrain_steps=20, steps=3, lr=1.0
)


def _divisors_dpcore(monkeypatch: pytest.MonkeyPatch, run: BlackBoxRun) -> list[float]:
    seen: list[float] = []
    step = DPOptimizer.step

    def spy(self: DPOptimizer, *args: object, **kwargs: object) -> None:
        seen.append(self.expected_batch_size)
        step(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DPOptimizer, "step", spy)
    training.train(run)
    return seen


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_both_worlds_divide_by_the_same_public_constant(
    q: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The noisy sum is divided by q * subset_size in every step of both worlds (not by q
    times the training set's own size, 40 or 41)."""
    setting = dataclasses.replace(TINY, sampling_probability=q)
    assert training.public_divisor(setting) == q * 40
    for world in ("out", "in"):
        seen = _divisors_dpcore(monkeypatch, BlackBoxRun(setting, 4.0, world, 0))
        assert seen == [q * 40] * setting.steps, world
