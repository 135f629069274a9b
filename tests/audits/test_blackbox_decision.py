"""The black-box audit's decision on synthetic score samples with known separation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from audits.blackbox.decision import ROUTES, decide
from dpcore.errors import InvalidParameterError
from dpcore.mechanisms.gaussian import gdp_epsilon

DELTA = 1e-5


def _gaussian_worlds(mu: float, runs: int, seed: int) -> tuple[dict[str, np.ndarray], ...]:
    rng = np.random.default_rng(seed)
    out = {"loss": rng.normal(0, 1, runs), "logit_margin": rng.normal(0, 2, runs)}
    inside = {"loss": rng.normal(mu, 1, runs), "logit_margin": rng.normal(2 * mu, 2, runs)}
    return out, inside


def test_power_separated_gaussian_scores_give_a_tight_bound() -> None:
    """mu = 3 with 1000 runs per world: the bound is most of the true epsilon of 3-GDP."""
    out, inside = _gaussian_worlds(3.0, 1000, seed=1)
    result = decide(out, inside, delta=DELTA, full_batch=True)
    true = gdp_epsilon(mu=3.0, delta=DELTA)
    assert 0.7 * true < result["epsilon_lower"] <= true
    assert result["tests"] == 2 * len(ROUTES)
    assert result["selection_runs"] == result["test_runs"] == 1000
    assert result["best"][1] == "gaussian"
    for routes in result["scores"].values():
        assert routes["gaussian"]["passed"] and routes["gaussian"]["reported"]
        assert routes["clopper_pearson"]["epsilon_lower"] > 0


def test_level_bound_exceeds_the_true_epsilon_no_more_than_the_level_allows() -> None:
    """mu = 1, 40 seeds: exceedances of the true epsilon stay within the binomial 99.9 % tail
    of 40 trials at 5 %."""
    true = gdp_epsilon(mu=1.0, delta=DELTA)
    seeds = 40
    over = sum(
        decide(*_gaussian_worlds(1.0, 200, seed), delta=DELTA, full_batch=True, seed=seed)[
            "epsilon_lower"
        ]
        > true
        for seed in range(seeds)
    )
    assert over <= stats.binom.ppf(0.999, seeds, 0.05)


def test_identical_worlds_give_zero_mostly() -> None:
    """No separation: the bound is 0 in at least 90 % of 20 seeds."""
    zeros = sum(
        decide(*_gaussian_worlds(0.0, 100, seed), delta=DELTA, full_batch=True)["epsilon_lower"]
        == 0
        for seed in range(20)
    )
    assert zeros >= 18


def test_poisson_lots_run_clopper_pearson_only() -> None:
    out, inside = _gaussian_worlds(3.0, 200, seed=2)
    result = decide(out, inside, delta=DELTA, full_batch=False)
    assert result["tests"] == 2
    for routes in result["scores"].values():
        assert set(routes) == {"clopper_pearson"}


def test_non_gaussian_scores_fail_the_check_and_the_gaussian_route_is_not_reported() -> None:
    rng = np.random.default_rng(3)
    out = {"loss": rng.exponential(1.0, 400)}
    inside = {"loss": rng.exponential(1.0, 400) + 2.0}
    entry = decide(out, inside, delta=DELTA, full_batch=True)["scores"]["loss"]["gaussian"]
    assert entry["passed"] is False and entry["reported"] is False
    assert "epsilon_lower" not in entry


@pytest.mark.parametrize(
    ("out", "inside", "options", "parameter"),
    [
        ({"loss": np.zeros(20)}, {"margin": np.zeros(20)}, {}, "in_scores"),
        ({}, {}, {}, "in_scores"),
        ({"loss": np.zeros(5)}, {"loss": np.zeros(20)}, {}, "out_scores['loss']"),
        ({"loss": np.zeros(20)}, {"loss": [np.nan] * 20}, {}, "in_scores['loss']"),
        ({"loss": np.arange(20.0)}, {"loss": np.arange(20.0)}, {"delta": 0.0}, "delta"),
        ({"loss": np.arange(20.0)}, {"loss": np.arange(20.0)}, {"confidence": 1.0}, "confidence"),
        ({"loss": np.arange(20.0)}, {"loss": np.arange(20.0)}, {"seed": -1}, "seed"),
    ],
)
def test_bad_input_is_refused_with_a_typed_error(
    out: dict[str, object], inside: dict[str, object], options: dict[str, float], parameter: str
) -> None:
    arguments = {"delta": DELTA, "full_batch": True, **options}
    with pytest.raises(InvalidParameterError) as raised:
        decide(out, inside, **arguments)  # type: ignore[arg-type]
    assert raised.value.parameter == parameter
