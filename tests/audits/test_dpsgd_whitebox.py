"""Soundness of the white-box DP-SGD audit: its lower bound never exceeds the tight epsilon."""

from __future__ import annotations

import dataclasses

import pytest

from audits import dpsgd_whitebox
from audits.dpsgd_whitebox import Implementation, WhiteboxConfig

CHEAP = WhiteboxConfig(dataset_size=100, sampling_probability=0.1, steps=100, runs=1)


def test_scores_are_the_claimed_gaussians() -> None:
    # A correct implementation: s_t ~ N(1, sigma^2) with the canary, N(0, sigma^2) without.
    config = dataclasses.replace(CHEAP, steps=400)
    with dpsgd_whitebox.single_thread():
        inside = dpsgd_whitebox.step_scores(
            Implementation(), config, noise_multiplier=0.5, insert=True, seed=3
        )
        outside = dpsgd_whitebox.step_scores(
            Implementation(), config, noise_multiplier=0.5, insert=False, seed=4
        )
    # Means of 400 draws of sd 0.5: standard error 0.025, tolerance 0.1 (4 standard errors).
    assert inside.mean() == pytest.approx(1.0, abs=0.1)
    assert outside.mean() == pytest.approx(0.0, abs=0.1)
    assert inside.std() == pytest.approx(0.5, rel=0.15)
    assert outside.std() == pytest.approx(0.5, rel=0.15)


def test_lower_bound_never_exceeds_tight_epsilon_over_20_seeds() -> None:
    sigma = 1.39  # about epsilon = 4 for q = 0.1, T = 100, delta = 1e-5 (PLD)
    q, steps, delta = CHEAP.sampling_probability, CHEAP.steps, CHEAP.delta
    tight = dpsgd_whitebox.upper_bounds(q, sigma, steps, delta)["pld"]
    lowers = []
    with dpsgd_whitebox.single_thread():
        for seed in range(20):
            scores = [
                dpsgd_whitebox.step_scores(
                    Implementation(), CHEAP, noise_multiplier=sigma, insert=insert, seed=seed
                )
                for insert in (False, True)
            ]
            mu_lower, _ = dpsgd_whitebox.distinguish(
                scores[0],
                scores[1],
                delta=delta,
                confidence=CHEAP.confidence,
                held_out_fraction=CHEAP.held_out_fraction,
                seed=seed,
            )
            lowers.append(dpsgd_whitebox.composed_lower_bound(q, mu_lower, steps, delta))
    assert max(lowers) <= tight
    assert max(lowers) > 0  # the audit is not vacuous
