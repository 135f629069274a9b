"""A planted bug (no clipping) is flagged by the white-box audit in a cheap setting."""

from __future__ import annotations

from audits import dpsgd_whitebox, planted_bugs
from audits.dpsgd_whitebox import Implementation, WhiteboxConfig
from dpcore.calibration import calibrate_noise

CHEAP = WhiteboxConfig(
    dataset_size=20, sampling_probability=0.2, steps=300, runs=1, learning_rate=0.1
)


def test_no_clipping_is_flagged_and_correct_is_not() -> None:
    claimed = 4.0
    sigma = calibrate_noise(
        target_epsilon=claimed,
        target_delta=CHEAP.delta,
        sampling_probability=CHEAP.sampling_probability,
        steps=CHEAP.steps,
        accountant="pld",
    )
    mutant = next(i for i in planted_bugs.IMPLEMENTATIONS if i.name == "no clipping")
    with dpsgd_whitebox.single_thread():
        buggy = dpsgd_whitebox.audit_one(mutant, CHEAP, noise_multiplier=sigma, seed=0)
        correct = dpsgd_whitebox.audit_one(Implementation(), CHEAP, noise_multiplier=sigma, seed=0)
    # 95% lower bounds: the 4C canary is not clipped, so each step has mu = 4 / sigma.
    assert buggy["epsilon_lower"] > claimed
    assert correct["epsilon_lower"] <= correct["epsilon_upper"]["pld"]
