"""The privacy ledger: events per step, any accountant, statements, state round trip."""

from __future__ import annotations

import json

import pytest

from dpcore.accountants import PldAccountant, RdpAccountant
from dpcore.errors import InvalidParameterError, StateError, UnsupportedEventError
from dpcore.events import (
    GaussianEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
    dpsgd_event,
)
from dpcore.torch.ledger import PrivacyLedger


def test_ledger_equals_the_dpsgd_event() -> None:
    ledger = PrivacyLedger(dataset_size=60_000)
    for _ in range(500):
        ledger.record(sampling_probability=0.01, noise_multiplier=1.1)
    assert ledger.steps == 500
    assert len(ledger.state_dict()["runs"]) == 1  # consecutive identical steps form one run
    event = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.1, steps=500)
    expected = RdpAccountant().compose(event).get_epsilon(1e-5)
    assert ledger.epsilon(delta=1e-5, accountant="rdp") == pytest.approx(expected, rel=1e-12)
    pld = PldAccountant().compose(event).get_epsilon(1e-5)
    assert ledger.epsilon(delta=1e-5) == pytest.approx(pld, rel=1e-12)


def test_changing_noise_starts_a_new_run_and_round_trips() -> None:
    ledger = PrivacyLedger(dataset_size=100)
    for sigma in (1.0, 1.0, 2.0, 1.0):
        ledger.record(sampling_probability=0.1, noise_multiplier=sigma)
    ledger.record(sampling_probability=0.1, noise_multiplier=1.0, jl_dimension=8)
    assert [run["count"] for run in ledger.state_dict()["runs"]] == [2, 1, 1, 1]
    copy = PrivacyLedger.from_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert copy == ledger and copy.uses_jl


def test_jl_steps_are_refused_by_gaussian_accountants() -> None:
    ledger = PrivacyLedger(dataset_size=100)
    ledger.record(sampling_probability=0.1, noise_multiplier=1.0, jl_dimension=4)
    with pytest.raises(UnsupportedEventError, match="JLGaussianEvent"):
        ledger.epsilon(delta=1e-5, accountant="rdp")
    statement = ledger.statement(delta=1e-5)
    assert statement["epsilon"]["pld"]["epsilon"] is None


def test_statement_labels_shuffled_sampling_and_approximations() -> None:
    ledger = PrivacyLedger(dataset_size=100, sampler="shuffled_fixed_size")
    ledger.record(sampling_probability=0.1, noise_multiplier=1.0)
    statement = ledger.statement(delta=1e-5, accountants=("rdp", "gdp_clt"))
    assert statement["matches_poisson_analysis"] is False
    assert set(statement["epsilon_if_poisson_sampled"]) == {"rdp", "gdp_clt"}
    assert statement["epsilon_if_poisson_sampled"]["gdp_clt"]["kind"] == "approximate"
    assert statement["neighboring_relation"] == "add_or_remove_one"


def test_empty_ledger_spends_nothing() -> None:
    assert PrivacyLedger(dataset_size=5).epsilon(delta=1e-5, accountant="rdp") == 0.0


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"sampling_probability": 0.1, "noise_multiplier": 0.0}, "noise_multiplier"),
        ({"sampling_probability": 1.2, "noise_multiplier": 1.0}, "sampling_probability"),
        ({"sampling_probability": 0.1, "noise_multiplier": 1.0, "jl_dimension": 0}, "jl_dimension"),
    ],
)
def test_bad_records(kwargs: dict[str, float], parameter: str) -> None:
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
        PrivacyLedger(dataset_size=5).record(**kwargs)  # type: ignore[arg-type]


def test_bad_construction_and_state() -> None:
    with pytest.raises(InvalidParameterError, match="Expected sampler in"):
        PrivacyLedger(dataset_size=5, sampler="random")
    with pytest.raises(StateError, match="Malformed ledger state"):
        PrivacyLedger.from_state_dict({"dataset_size": 5, "sampler": "poisson", "runs": [{}]})


def test_balls_in_bins_ledger_composes_one_random_allocation_per_started_epoch() -> None:
    ledger = PrivacyLedger(dataset_size=100, sampler="balls_in_bins", steps_per_epoch=10)
    for _ in range(25):
        ledger.record(sampling_probability=0.1, noise_multiplier=1.0)
    # 25 steps = 2 full epochs and a prefix of a third, which costs at most a full epoch.
    assert ledger.event() == SelfComposedEvent(RandomAllocationEvent(10, GaussianEvent(1.0)), 3)
    assert ledger.has_valid_analysis and not ledger.matches_poisson_analysis
    again = PrivacyLedger.from_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert again == ledger and again.event() == ledger.event()
    with pytest.raises(
        InvalidParameterError, match="Expected noise_multiplier to stay as recorded"
    ):
        ledger.record(sampling_probability=0.1, noise_multiplier=2.0)
    with pytest.raises(InvalidParameterError, match="Expected steps_per_epoch"):
        PrivacyLedger(dataset_size=100, sampler="balls_in_bins")


def test_shuffled_statement_carries_a_certified_lower_bound() -> None:
    ledger = PrivacyLedger(dataset_size=1000, sampler="shuffled_fixed_size")
    for _ in range(20):
        ledger.record(sampling_probability=0.1, noise_multiplier=1.0)
    statement = ledger.statement(delta=1e-5, accountants=("pld",))
    lower = statement["shuffled_epsilon_lower_bound"]
    assert lower["kind"] == "lower_bound"
    # Shuffled batches leak more than the Poisson analysis admits (Chua et al. 2024).
    assert lower["epsilon"] > statement["epsilon_if_poisson_sampled"]["pld"]["epsilon"]
    ledger.record(sampling_probability=0.1, noise_multiplier=2.0)
    assert (
        ledger.statement(delta=1e-5, accountants=("pld",))["shuffled_epsilon_lower_bound"][
            "epsilon"
        ]
        is None
    )


def test_item1_balls_in_bins_counts_the_epochs_of_the_samplers_lot_numbers() -> None:
    # Lots 1 and 2 of a sampler with T = 2 lie in its epochs 0 and 1: two allocations.
    late = PrivacyLedger(dataset_size=40, sampler="balls_in_bins", steps_per_epoch=2, first_lot=1)
    for lot in (1, 2):
        late.record(sampling_probability=0.5, noise_multiplier=0.5, lot=lot)
    full = PrivacyLedger(dataset_size=40, sampler="balls_in_bins", steps_per_epoch=2)
    for _ in range(4):  # two full epochs from lot 0
        full.record(sampling_probability=0.5, noise_multiplier=0.5)
    assert late.epochs == 2 and late.event() == full.event()
    assert late.epsilon(delta=1e-5, accountant="rdp") == full.epsilon(delta=1e-5, accountant="rdp")
    again = PrivacyLedger.from_state_dict(json.loads(json.dumps(late.state_dict())))
    assert again == late and again.next_lot == 3 and again.event() == full.event()
    aligned = PrivacyLedger(dataset_size=40, sampler="balls_in_bins", steps_per_epoch=2)
    for _ in range(2):
        aligned.record(sampling_probability=0.5, noise_multiplier=0.5)
    assert aligned.epochs == 1  # the same two steps from lot 0 are one epoch


def test_item2_the_ledger_records_each_lot_once_in_order_and_check_records_nothing() -> None:
    ledger = PrivacyLedger(dataset_size=100, first_lot=5)
    ledger.record(sampling_probability=0.1, noise_multiplier=1.0, lot=5)
    before = ledger.state_dict()
    for lot in (5, 7):
        with pytest.raises(InvalidParameterError, match="Expected lot = 6"):
            ledger.record(sampling_probability=0.1, noise_multiplier=1.0, lot=lot)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        ledger.check(sampling_probability=0.1, noise_multiplier=0.0)
    event = ledger.check(sampling_probability=0.1, noise_multiplier=1.0, lot=6)
    assert ledger.state_dict() == before
    assert ledger.record(sampling_probability=0.1, noise_multiplier=1.0) == event
    assert ledger.steps == 2 and ledger.next_lot == 7
    old = {key: value for key, value in before.items() if key != "first_lot"}
    assert PrivacyLedger.from_state_dict(old).first_lot == 0  # states saved before first_lot
