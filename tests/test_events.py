"""Events: validated on construction, immutable, serialisable; every bad input named."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest

from dpcore.accountants import accountant_class
from dpcore.errors import InvalidParameterError, StateError
from dpcore.events import (
    MAX_EVENT_DEPTH,
    ComposedEvent,
    DpEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    dpsgd_event,
    event_from_dict,
)

BAD_EVENTS = [
    # (factory, parameter named in the message, constraint fragment)
    (lambda: GaussianEvent(-1.0), "noise_multiplier", ">= 0"),
    (lambda: GaussianEvent(math.nan), "noise_multiplier", ">= 0"),
    (lambda: GaussianEvent(math.inf), "noise_multiplier", "finite"),
    (lambda: GaussianEvent("1.0"), "noise_multiplier", "real number"),  # type: ignore[arg-type]
    (lambda: GaussianEvent(True), "noise_multiplier", "real number"),  # type: ignore[arg-type]
    (lambda: LaplaceEvent(-0.5), "noise_multiplier", ">= 0"),
    (lambda: LaplaceEvent(math.nan), "noise_multiplier", ">= 0"),
    (lambda: EpsilonDeltaEvent(-1.0), "epsilon", ">= 0"),
    (lambda: EpsilonDeltaEvent(math.inf), "epsilon", "finite"),
    (lambda: EpsilonDeltaEvent(1.0, 1.0), "delta", "in [0, 1)"),
    (lambda: EpsilonDeltaEvent(1.0, -1e-9), "delta", "in [0, 1)"),
    (lambda: EpsilonDeltaEvent(1.0, math.nan), "delta", "in [0, 1)"),
    (lambda: PoissonSampledEvent(1.5, GaussianEvent(1.0)), "sampling_probability", "in [0, 1]"),
    (lambda: PoissonSampledEvent(-0.1, GaussianEvent(1.0)), "sampling_probability", "in [0, 1]"),
    (
        lambda: PoissonSampledEvent(math.nan, GaussianEvent(1.0)),
        "sampling_probability",
        "in [0, 1]",
    ),
    (lambda: PoissonSampledEvent(0.1, "gaussian"), "event", "DpEvent"),  # type: ignore[arg-type]
    (
        lambda: SampledWithoutReplacementEvent(11, 10, GaussianEvent(1.0)),
        "sample_size",
        "<= dataset_size",
    ),
    (lambda: SampledWithoutReplacementEvent(-1, 10, GaussianEvent(1.0)), "sample_size", ">= 0"),
    (lambda: SampledWithoutReplacementEvent(1, 0, GaussianEvent(1.0)), "dataset_size", ">= 1"),
    (lambda: SampledWithoutReplacementEvent(2.5, 10, GaussianEvent(1.0)), "sample_size", "integer"),  # type: ignore[arg-type]
    (lambda: SelfComposedEvent(GaussianEvent(1.0), -1), "count", ">= 0"),
    (lambda: SelfComposedEvent(GaussianEvent(1.0), 1.5), "count", "integer"),  # type: ignore[arg-type]
    (lambda: SelfComposedEvent(GaussianEvent(1.0), 3.0), "count", "integer"),  # type: ignore[arg-type]
    (lambda: SelfComposedEvent(None, 3), "event", "DpEvent"),  # type: ignore[arg-type]
    (lambda: ComposedEvent([GaussianEvent(1.0), 3]), "events[1]", "DpEvent"),  # type: ignore[list-item]
    (lambda: ComposedEvent(GaussianEvent(1.0)), "events", "iterable"),  # type: ignore[arg-type]
    (
        lambda: dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=-5),
        "count",
        ">= 0",
    ),
    (
        lambda: dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=10.5),
        "count",
        "integer",
    ),  # type: ignore[arg-type]
    (
        lambda: dpsgd_event(sampling_probability=2.0, noise_multiplier=1.0, steps=10),
        "sampling_probability",
        "in [0, 1]",
    ),
    (
        lambda: dpsgd_event(sampling_probability=0.01, noise_multiplier=-4.0, steps=10),
        "noise_multiplier",
        ">= 0",
    ),
]


@pytest.mark.parametrize(("factory", "parameter", "constraint"), BAD_EVENTS)
def test_bad_event_is_rejected_with_a_named_message(
    factory, parameter: str, constraint: str
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidParameterError) as caught:
        factory()
    message = str(caught.value)
    assert f"Expected {parameter} " in message
    assert constraint in message
    assert caught.value.parameter == parameter


def test_events_are_immutable_and_hashable() -> None:
    event = dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.count = 4  # type: ignore[misc]
    assert hash(event) == hash(
        dpsgd_event(sampling_probability=0.01, noise_multiplier=1.0, steps=3)
    )


def test_numbers_are_canonicalised() -> None:
    assert GaussianEvent(2).noise_multiplier == 2.0
    assert isinstance(GaussianEvent(2).noise_multiplier, float)
    assert ComposedEvent(iter([GaussianEvent(1.0)])).events == (GaussianEvent(1.0),)


def test_boundary_values_are_allowed() -> None:
    assert GaussianEvent(0.0).noise_multiplier == 0.0  # no noise: accountants answer inf
    assert PoissonSampledEvent(0.0, GaussianEvent(1.0)).sampling_probability == 0.0
    assert SelfComposedEvent(GaussianEvent(1.0), 0).count == 0
    assert SampledWithoutReplacementEvent(0, 10, GaussianEvent(1.0)).sample_size == 0


@pytest.mark.parametrize(
    "event",
    [
        GaussianEvent(1.5),
        LaplaceEvent(0.25),
        EpsilonDeltaEvent(1.0, 1e-6),
        dpsgd_event(sampling_probability=0.004, noise_multiplier=1.1, steps=1000),
        SampledWithoutReplacementEvent(64, 1000, GaussianEvent(2.0)),
        ComposedEvent([GaussianEvent(1.0), SelfComposedEvent(LaplaceEvent(1.0), 3)]),
    ],
)
def test_dict_round_trip(event) -> None:  # type: ignore[no-untyped-def]
    assert event_from_dict(event.to_dict()) == event


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([], "'type' key"),
        ({"noise_multiplier": 1.0}, "'type' key"),
        ({"type": "quantum"}, "event type in"),
        ({"type": "gaussian"}, "lacks the key"),
        ({"type": "gaussian", "noise_multiplier": 1.0, "extra": 2}, "Unexpected keys"),
        ({"type": "gaussian", "noise_multiplier": -2.0}, "noise_multiplier >= 0"),
        ({"type": "composed", "events": "abc"}, "list"),
    ],
)
def test_malformed_event_dicts(data: object, match: str) -> None:
    with pytest.raises(StateError, match=match):
        event_from_dict(data)  # type: ignore[arg-type]


def _chain(levels: int, wrap: Callable[[DpEvent], DpEvent]) -> DpEvent:
    """``levels`` levels: a Poisson-sampled Gaussian step (2 levels) in ``levels - 2`` wrappers."""
    event: DpEvent = PoissonSampledEvent(0.1, GaussianEvent(1.0))
    for _ in range(levels - 2):
        event = wrap(event)
    return event


WRAPPERS: list[Callable[[DpEvent], DpEvent]] = [
    lambda inner: ComposedEvent([inner]),
    lambda inner: SelfComposedEvent(inner, 1),
    lambda inner: ComposedEvent([GaussianEvent(50.0), inner]),
]
WRAP_ANY: list[Callable[[DpEvent], DpEvent]] = [
    *WRAPPERS,
    lambda inner: PoissonSampledEvent(0.5, inner),
    lambda inner: SampledWithoutReplacementEvent(1, 2, inner),
    lambda inner: RandomAllocationEvent(2, inner),
]


@pytest.mark.parametrize("wrap", WRAP_ANY)
def test_3000_nested_events_are_refused_on_construction(wrap: Callable[[DpEvent], DpEvent]) -> None:
    # 3000 nested events raised RecursionError in hashing, equality, repr, to_dict,
    # event_from_dict and every accountant; nesting stops at MAX_EVENT_DEPTH with a typed error.
    event = _chain(MAX_EVENT_DEPTH, wrap)
    assert event.depth == MAX_EVENT_DEPTH
    with pytest.raises(InvalidParameterError, match="nested at most MAX_EVENT_DEPTH = 100"):
        for _ in range(3000 - MAX_EVENT_DEPTH):
            event = wrap(event)
    assert event.depth == MAX_EVENT_DEPTH  # the refused wrapper was never built


def test_3000_nested_saved_events_are_refused_before_rebuilding() -> None:
    saved: dict[str, object] = {"type": "gaussian", "noise_multiplier": 1.0}
    for index in range(3000):
        saved = (
            {"type": "self_composed", "event": saved, "count": 1}
            if index % 2
            else {"type": "composed", "events": [saved]}
        )
    with pytest.raises(StateError, match="nested at most MAX_EVENT_DEPTH = 100"):
        event_from_dict(saved)
    cyclic: dict[str, object] = {"type": "composed", "events": []}
    cyclic["events"] = [cyclic, cyclic]  # a Python-built cycle: refused, not walked forever
    with pytest.raises(StateError, match="nested at most"):
        event_from_dict(cyclic)


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_deepest_allowed_event_works_everywhere(wrap: Callable[[DpEvent], DpEvent]) -> None:
    # At the limit every recursive path works, even from 200 frames down a caller's stack:
    # hashing, equality, repr, the dict round trip and the rdp and pld accountants.
    def at_depth(frames: int) -> None:
        if frames:
            return at_depth(frames - 1)
        event = _chain(MAX_EVENT_DEPTH, wrap)
        twin = _chain(MAX_EVENT_DEPTH, wrap)
        assert hash(event) == hash(twin) and event == twin and repr(event) == repr(twin)
        rebuilt = event_from_dict(event.to_dict())
        assert rebuilt == event and rebuilt.depth == MAX_EVENT_DEPTH
        flat = 2 if wrap is WRAPPERS[2] else 1  # the extra Gaussian per level, if any
        for name in ("rdp", "pld"):
            deep = accountant_class(name)().compose(event).get_epsilon(1e-5)
            reference = accountant_class(name)().compose(
                PoissonSampledEvent(0.1, GaussianEvent(1.0))
            )
            if flat == 2:
                reference.compose(SelfComposedEvent(GaussianEvent(50.0), MAX_EVENT_DEPTH - 2))
            assert deep == pytest.approx(reference.get_epsilon(1e-5), rel=1e-6)
        return None

    at_depth(200)
