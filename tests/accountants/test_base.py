"""The shared accountant machinery: dispatch, flattening, state, the Approximate label."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dpcore.accountants.base import (
    Approximate,
    EstimateKind,
    PrivacyAccountant,
    accountant_class,
    handles,
    leaf_signature,
)
from dpcore.errors import InvalidParameterError, StateError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_from_dict,
)


class CountingAccountant(PrivacyAccountant, register=False):
    """Adds 1/sigma^2 per Gaussian step: enough to observe dispatch and flattening."""

    name = "counting_for_tests"

    def __init__(self) -> None:
        super().__init__()
        self.total = 0.0
        self.calls: list[tuple[Any, int]] = []

    @handles((GaussianEvent,))
    def _gaussian(self, event: GaussianEvent, count: int) -> None:
        self.calls.append((event, count))
        self.total += count / event.noise_multiplier**2

    def _leaf_reason(self, event: Any) -> str | None:
        if isinstance(event, GaussianEvent) and event.noise_multiplier > 100:
            return "noise above 100 is refused by this test accountant"
        return None

    def _epsilon(self, delta: float) -> float:
        return self.total

    def _delta(self, epsilon: float) -> float:
        return 0.0


def test_nested_events_are_flattened_with_multiplied_counts() -> None:
    accountant = CountingAccountant()
    event = SelfComposedEvent(
        ComposedEvent([GaussianEvent(1.0), SelfComposedEvent(GaussianEvent(2.0), 3)]), 2
    )
    accountant.compose(event, 5)
    assert accountant.calls == [(GaussianEvent(1.0), 10), (GaussianEvent(2.0), 30)]
    assert accountant.get_epsilon(1e-5) == pytest.approx(10 + 30 / 4)


def test_unsupported_leaf_is_named_and_nothing_is_recorded() -> None:
    accountant = CountingAccountant()
    mixed = ComposedEvent([GaussianEvent(1.0), LaplaceEvent(1.0)])
    with pytest.raises(UnsupportedEventError, match="LaplaceEvent") as caught:
        accountant.compose(mixed)
    assert "CountingAccountant" in str(caught.value)
    assert accountant.calls == [] and accountant.history == ()


def test_parameter_dependent_refusal_reports_the_reason() -> None:
    accountant = CountingAccountant()
    assert (
        accountant.unsupported_reason(GaussianEvent(200.0))
        == "noise above 100 is refused by this test accountant"
    )
    with pytest.raises(UnsupportedEventError, match="noise above 100"):
        accountant.compose(GaussianEvent(200.0))


def test_sampled_signatures_include_the_inner_mechanism() -> None:
    assert leaf_signature(PoissonSampledEvent(0.1, GaussianEvent(1.0))) == (
        PoissonSampledEvent,
        GaussianEvent,
    )
    assert not CountingAccountant().supports(PoissonSampledEvent(0.1, GaussianEvent(1.0)))


def test_zero_count_records_nothing() -> None:
    accountant = CountingAccountant().compose(GaussianEvent(1.0), 0)
    assert accountant.history == () and accountant.calls == []


def test_state_round_trip_and_generic_loading() -> None:
    accountant = CountingAccountant().compose(GaussianEvent(2.0), 3)
    state = json.loads(accountant.to_json())
    assert state["accountant"] == "counting_for_tests" and state["format"] == 1
    restored = CountingAccountant.from_state(state)
    assert isinstance(restored, CountingAccountant)
    assert restored.to_json() == accountant.to_json()


def test_test_only_classes_stay_out_of_the_registries() -> None:
    """Accountants and events defined with ``register=False`` (as here, for tests) are not found
    by name, so they cannot leak into the CLI's or loader's lists."""
    state = json.loads(CountingAccountant().to_json())
    with pytest.raises(StateError, match="counting_for_tests"):
        PrivacyAccountant.from_state(state)
    with pytest.raises(InvalidParameterError, match="counting_for_tests"):
        accountant_class("counting_for_tests")

    class Hidden(GaussianEvent, register=False):
        kind = "hidden_for_tests"

    with pytest.raises(StateError, match="hidden_for_tests"):
        event_from_dict({"type": "hidden_for_tests", "noise_multiplier": 1.0})


def test_loading_state_of_another_accountant_fails() -> None:
    state = json.loads(CountingAccountant().to_json())
    state["accountant"] = "rdp"

    class Other(CountingAccountant, register=False):
        name = "other_for_tests"

    with pytest.raises(StateError, match="other_for_tests"):
        Other.from_state(state)


def test_approximate_values_carry_their_label() -> None:
    value = Approximate(0.83)
    assert value == 0.83 and value + 1 == pytest.approx(1.83)
    assert "approximate, not a guarantee" in repr(value)
    assert "approximate, not a guarantee" in str(value)
    assert EstimateKind.APPROXIMATE.value == "approximate"


def test_unknown_accountant_name() -> None:
    with pytest.raises(InvalidParameterError, match="accountant"):
        accountant_class("exact_magic")
