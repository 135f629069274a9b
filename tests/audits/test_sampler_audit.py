"""The sampler audit flags shuffled fixed-size batches reported as Poisson, not PoissonSampler."""

from __future__ import annotations

import dataclasses

from audits import sampler_audit
from audits.sampler_audit import SamplerAuditConfig

CHEAP = SamplerAuditConfig(epochs=100)


def test_shuffled_is_flagged_and_poisson_is_not() -> None:
    for seed in range(3):
        assert sampler_audit.audit_one("shuffled", CHEAP, seed)["flagged"]
        assert not sampler_audit.audit_one("poisson", CHEAP, seed)["flagged"]


def test_poisson_false_flag_rate_is_at_most_the_stated_rate() -> None:
    # Each test flags a correct Poisson sampler with probability <= 5%: of 40 seeds, 2 are
    # expected; P[Bin(40, 0.05) >= 7] = 0.0034.
    config = dataclasses.replace(CHEAP, epochs=50)
    flags = 0
    for seed in range(40):
        counts = sampler_audit.inclusion_counts(
            sampler_audit.make_sampler("poisson", config, seed), config
        )
        p_value, _ = sampler_audit.poisson_test(counts, config.sampling_probability)
        flags += p_value < 1 - config.confidence
    assert flags <= 6
