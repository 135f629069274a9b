"""The white-box DP-SGD-JL audit: the canary is clipped as Bu et al.'s Lemma 4.1 says, and the
audit's per-step lower bound never exceeds the JL accountant's per-step epsilon."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from audits import dpsgd_jl
from audits.dpsgd_jl import JlAuditConfig
from audits.dpsgd_whitebox import single_thread

CHEAP = JlAuditConfig(dataset_size=20, sampling_probability=0.1, steps=50, noise_multiplier=0.5)


def test_worst_case_contribution_is_c_sqrt_r_over_chi2() -> None:
    # With sigma = 1e-9 the scores are the canary's clipped contribution min(n, sqrt(r / X)).
    config = dataclasses.replace(CHEAP, steps=300, noise_multiplier=1e-9)
    with single_thread():
        scores = dpsgd_jl.step_scores(config, jl_dimension=4, canary_norm=1e6, seed=0)
        natural = dpsgd_jl.step_scores(config, jl_dimension=4, canary_norm=1.0, seed=0)
        outside = dpsgd_jl.step_scores(config, jl_dimension=4, canary_norm=None, seed=0)
    assert np.all(np.abs(outside) < 1e-6)
    assert np.all(natural <= 1 + 1e-6)  # a canary of norm C never contributes more than C
    # The median of sqrt(4 / X), X ~ chi^2_4 (median 3.357): 1.0916; 300 draws: sd about 0.035.
    assert float(np.median(scores)) == pytest.approx(1.0916, abs=0.12)
    # P[sqrt(4 / X) > 2] = P[X < 1] = 0.0902; 300 draws: sd 0.017, tolerance 3.5 sd.
    assert float(np.mean(scores > 2)) == pytest.approx(0.0902, abs=0.058)


def test_lower_bound_never_exceeds_jl_accountant_over_20_seeds() -> None:
    r, sigma, delta = 16, CHEAP.noise_multiplier, CHEAP.delta
    upper = dpsgd_jl.step_upper_bounds(sigma, r, delta)["jl"]
    lowers = []
    with single_thread():
        for seed in range(20):
            negative = dpsgd_jl.step_scores(CHEAP, jl_dimension=r, canary_norm=None, seed=seed)
            positive = dpsgd_jl.step_scores(CHEAP, jl_dimension=r, canary_norm=1e6, seed=100 + seed)
            bound, _ = dpsgd_jl.distinguish(
                negative,
                positive,
                delta=delta,
                confidence=CHEAP.confidence,
                held_out_fraction=CHEAP.held_out_fraction,
                seed=seed,
            )
            lowers.append(bound)
    assert max(lowers) <= upper
    assert max(lowers) > 0  # the audit is not vacuous
