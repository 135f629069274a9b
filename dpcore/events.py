"""Privacy events: immutable descriptions of *what ran*, holding no mathematics.

An event says which mechanism was applied (and how it was sampled or repeated); an accountant
turns events into privacy guarantees. Events are validated on construction, so an invalid
mechanism can never reach an accountant. Noise multipliers are relative to the sensitivity under
the accountant's neighbouring relation (add/remove one example by default).

Example:
    >>> event = dpsgd_event(sampling_probability=0.01, noise_multiplier=4.0, steps=10_000)
    >>> event.count, event.event.sampling_probability
    (10000, 0.01)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from dpcore.errors import InvalidParameterError, StateError
from dpcore.validation import (
    check_count,
    check_delta_closed,
    check_non_negative,
    check_probability,
)

__all__ = [
    "MAX_EVENT_DEPTH",
    "ComposedEvent",
    "DpEvent",
    "EpsilonDeltaEvent",
    "ExponentialMechanismEvent",
    "GaussianEvent",
    "JLGaussianEvent",
    "LaplaceEvent",
    "MixtureOfGaussiansEvent",
    "PoissonSampledEvent",
    "RandomAllocationEvent",
    "RandomizedResponseEvent",
    "SampledWithoutReplacementEvent",
    "SelfComposedEvent",
    "dpsgd_event",
    "event_from_dict",
]

_EVENT_TYPES: dict[str, type[DpEvent]] = {}

#: Most levels of nesting an event may have (a mechanism is 1 level; each sampled, composed or
#: repeated wrapper adds one). Hashing, equality, ``repr``, :meth:`DpEvent.to_dict`,
#: :func:`event_from_dict` and the accountants all recurse once per level, so deeper events are
#: refused on construction (and on loading) with a typed error instead of a ``RecursionError``
#: somewhere later. Real events are a few levels deep; put long sequences side by side in one
#: :class:`ComposedEvent` (any width) or repeat them with :class:`SelfComposedEvent`.
MAX_EVENT_DEPTH = 100


@dataclasses.dataclass(frozen=True)
class DpEvent:
    """Base class of all events. Subclasses are frozen dataclasses with a unique ``kind`` tag."""

    kind: ClassVar[str] = ""
    #: Levels of nesting (1 for a mechanism); wrappers set their own on construction.
    _depth: ClassVar[int] = 1

    @property
    def depth(self) -> int:
        """Levels of nesting: 1 for a mechanism, 1 + the deepest inner event for a wrapper."""
        return self._depth

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        """Register the kind for :func:`event_from_dict`; ``register=False`` keeps an event
        type (one defined for a test, say) out of the registry."""
        super().__init_subclass__(**kwargs)
        if cls.kind and register:
            _EVENT_TYPES[cls.kind] = cls

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description from which :func:`event_from_dict` rebuilds the event."""
        out: dict[str, Any] = {"type": self.kind}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, DpEvent):
                out[field.name] = value.to_dict()
            elif isinstance(value, tuple):
                out[field.name] = [
                    item.to_dict() if isinstance(item, DpEvent) else item for item in value
                ]
            else:
                out[field.name] = value
        return out


@dataclasses.dataclass(frozen=True)
class GaussianEvent(DpEvent):
    """Gaussian mechanism with noise standard deviation ``noise_multiplier`` x L2 sensitivity.

    ``noise_multiplier = 0`` is allowed and means no noise: every accountant answers epsilon = inf.
    """

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float

    def __post_init__(self) -> None:
        value = check_non_negative("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", value)


@dataclasses.dataclass(frozen=True)
class JLGaussianEvent(DpEvent):
    """One DP-SGD-JL step (Bu et al. 2021, Alg. 1): Gaussian noise, clipping by estimated norms.

    Each example's gradient is clipped with a norm *estimated* from ``jl_dimension`` (r) random
    projections, so its contribution has the random norm ``min(||g||, C sqrt(r / X))`` with
    ``X ~ chi^2_r`` (Lemma 4.1), which can exceed C. This is therefore not a
    :class:`GaussianEvent` with sensitivity C, and only an accountant that models the random
    sensitivity (Thm 4.1) may analyse it; the others raise ``UnsupportedEventError``.
    """

    kind: ClassVar[str] = "jl_gaussian"
    noise_multiplier: float
    jl_dimension: int

    def __post_init__(self) -> None:
        value = check_non_negative("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", value)
        dimension = check_count("jl_dimension", self.jl_dimension, minimum=1)
        object.__setattr__(self, "jl_dimension", dimension)


@dataclasses.dataclass(frozen=True)
class LaplaceEvent(DpEvent):
    """Laplace mechanism with scale ``noise_multiplier`` x L1 sensitivity (0 means no noise)."""

    kind: ClassVar[str] = "laplace"
    noise_multiplier: float

    def __post_init__(self) -> None:
        value = check_non_negative("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", value)


@dataclasses.dataclass(frozen=True)
class EpsilonDeltaEvent(DpEvent):
    """A mechanism known only to be (epsilon, delta)-DP; ``delta = 0`` is pure DP."""

    kind: ClassVar[str] = "epsilon_delta"
    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_non_negative("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check_delta_closed("delta", self.delta))


@dataclasses.dataclass(frozen=True)
class RandomizedResponseEvent(DpEvent):
    """Randomized response over ``num_buckets`` values with noise parameter p.

    With probability ``1 - p`` the true value is reported, otherwise a value drawn uniformly from
    all ``num_buckets`` (so the true one with probability ``1 - p + p / k``, each other one with
    ``p / k``). Neighbouring inputs differ in the one value the mechanism reports, so the event
    is analysed by the pair of output distributions of two different values; it is
    ``log(1 + k (1 - p) / p)``-DP (Warner 1965; the k-ary form as in dp_accounting's
    ``RandomizedResponseDpEvent``). ``p = 0`` reports the value itself (epsilon = inf).
    """

    kind: ClassVar[str] = "randomized_response"
    noise_parameter: float
    num_buckets: int

    def __post_init__(self) -> None:
        p = check_probability("noise_parameter", self.noise_parameter)
        object.__setattr__(self, "noise_parameter", p)
        object.__setattr__(
            self, "num_buckets", check_count("num_buckets", self.num_buckets, minimum=2)
        )


@dataclasses.dataclass(frozen=True)
class ExponentialMechanismEvent(DpEvent):
    """The exponential mechanism (McSherry & Talwar 2007) at privacy parameter epsilon.

    It outputs r with probability proportional to ``exp(epsilon u(D, r) / (2 Delta))`` for a
    utility of sensitivity Delta. This is epsilon-DP and, more sharply, epsilon-bounded-range
    (Durfee & Rogers 2019, Def. 3.1 and Lemma 3.2), which composes more tightly than pure DP
    (Dong, Durfee & Rogers 2020; Cesar & Rogers 2021). ``epsilon = 0`` ignores the data.
    """

    kind: ClassVar[str] = "exponential_mechanism"
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_non_negative("epsilon", self.epsilon))


@dataclasses.dataclass(frozen=True)
class MixtureOfGaussiansEvent(DpEvent):
    """Gaussian noise around a random shift: the mixture-of-Gaussians mechanism.

    On one of two neighbouring datasets the output is ``N(0, sigma^2)``; on the other it is
    ``sum_i p_i N(c_i, sigma^2)`` with ``sigma = noise_multiplier`` and sensitivities ``c_i``
    drawn with probabilities ``p_i`` (Choquette-Choo et al. 2023, arXiv 2310.15526, Sec. 4;
    dp_accounting's ``MixtureOfGaussiansDpEvent`` with ``standard_deviation = sigma``). The
    Poisson-sampled Gaussian is the case ``c = (0, 1)``, ``p = (1 - q, q)``.
    """

    kind: ClassVar[str] = "mixture_of_gaussians"
    noise_multiplier: float
    sensitivities: tuple[float, ...]
    probabilities: tuple[float, ...]

    def __post_init__(self) -> None:
        sigma = check_non_negative("noise_multiplier", self.noise_multiplier)
        object.__setattr__(self, "noise_multiplier", sigma)
        for name in ("sensitivities", "probabilities"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise InvalidParameterError(name, "to be a sequence of numbers", value)
        shifts = tuple(
            check_non_negative(f"sensitivities[{i}]", c) for i, c in enumerate(self.sensitivities)
        )
        weights = tuple(
            check_probability(f"probabilities[{i}]", p) for i, p in enumerate(self.probabilities)
        )
        if not shifts or len(shifts) != len(weights):
            raise InvalidParameterError(
                "probabilities", f"one per sensitivity ({len(shifts)}, at least one)", len(weights)
            )
        if abs(math.fsum(weights) - 1.0) > 1e-9:
            raise InvalidParameterError(
                "probabilities", "to sum to 1 (within 1e-9)", math.fsum(weights)
            )
        object.__setattr__(self, "sensitivities", shifts)
        object.__setattr__(self, "probabilities", weights)


def _check_event(name: str, value: object) -> DpEvent:
    if not isinstance(value, DpEvent):
        raise InvalidParameterError(name, "to be a DpEvent", value)
    return value


def _set_depth(event: DpEvent, name: str, inner: Iterable[DpEvent]) -> None:
    """Record ``event``'s nesting depth, refusing more than :data:`MAX_EVENT_DEPTH` levels."""
    depth = 1 + max((item.depth for item in inner), default=0)
    if depth > MAX_EVENT_DEPTH:
        raise InvalidParameterError(
            name,
            f"nested at most MAX_EVENT_DEPTH = {MAX_EVENT_DEPTH} levels deep (compose long "
            "sequences side by side in one ComposedEvent instead)",
            f"an event {depth} levels deep",
        )
    object.__setattr__(event, "_depth", depth)


@dataclasses.dataclass(frozen=True)
class PoissonSampledEvent(DpEvent):
    """``event`` applied to a Poisson sample: each record kept independently w.p. q."""

    kind: ClassVar[str] = "poisson_sampled"
    sampling_probability: float
    event: DpEvent

    def __post_init__(self) -> None:
        q = check_probability("sampling_probability", self.sampling_probability)
        object.__setattr__(self, "sampling_probability", q)
        _check_event("event", self.event)
        _set_depth(self, "event", [self.event])


@dataclasses.dataclass(frozen=True)
class SampledWithoutReplacementEvent(DpEvent):
    """``event`` applied to a uniformly random subset of exactly ``sample_size`` records."""

    kind: ClassVar[str] = "sampled_without_replacement"
    sample_size: int
    dataset_size: int
    event: DpEvent

    def __post_init__(self) -> None:
        n = check_count("dataset_size", self.dataset_size, minimum=1)
        m = check_count("sample_size", self.sample_size, minimum=0)
        if m > n:
            raise InvalidParameterError("sample_size", f"<= dataset_size = {n}", self.sample_size)
        object.__setattr__(self, "dataset_size", n)
        object.__setattr__(self, "sample_size", m)
        _check_event("event", self.event)
        _set_depth(self, "event", [self.event])


@dataclasses.dataclass(frozen=True)
class RandomAllocationEvent(DpEvent):
    """One epoch of ``num_steps`` runs of ``event`` under random allocation (balls in bins).

    Every record is assigned to exactly one of the ``num_steps`` steps, uniformly and
    independently of the other records, and each step runs ``event`` on the records assigned
    to it (Chua et al., "Balls-and-Bins Sampling for DP-SGD", AISTATS 2025, arXiv 2412.16802;
    Feldman & Shenfeld, "Privacy Amplification by Random Allocation", arXiv 2502.08202, the
    case k = 1). Several epochs are a :class:`SelfComposedEvent` of this event.
    """

    kind: ClassVar[str] = "random_allocation"
    num_steps: int
    event: DpEvent

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_steps", check_count("num_steps", self.num_steps, minimum=1))
        _check_event("event", self.event)
        _set_depth(self, "event", [self.event])


@dataclasses.dataclass(frozen=True)
class SelfComposedEvent(DpEvent):
    """``event`` run ``count`` times in sequence (``count = 0`` means nothing ran)."""

    kind: ClassVar[str] = "self_composed"
    event: DpEvent
    count: int

    def __post_init__(self) -> None:
        _check_event("event", self.event)
        object.__setattr__(self, "count", check_count("count", self.count))
        _set_depth(self, "event", [self.event])


@dataclasses.dataclass(frozen=True)
class ComposedEvent(DpEvent):
    """The events run in sequence, possibly different from one another."""

    kind: ClassVar[str] = "composed"
    events: tuple[DpEvent, ...]

    def __init__(self, events: Iterable[DpEvent]) -> None:
        if isinstance(events, DpEvent) or not isinstance(events, Iterable):
            raise InvalidParameterError("events", "to be an iterable of DpEvent", events)
        items = tuple(events)
        for index, item in enumerate(items):
            _check_event(f"events[{index}]", item)
        _set_depth(self, "events", items)
        object.__setattr__(self, "events", items)


def dpsgd_event(
    *, sampling_probability: float, noise_multiplier: float, steps: int
) -> SelfComposedEvent:
    """The event of DP-SGD (Abadi et al. 2016, Alg. 1): ``steps`` Poisson-sampled Gaussian steps.

    Args:
        sampling_probability: q, the probability that a record joins a lot.
        noise_multiplier: sigma, noise standard deviation divided by the clipping norm.
        steps: T, the number of noisy steps.
    """
    step = PoissonSampledEvent(sampling_probability, GaussianEvent(noise_multiplier))
    return SelfComposedEvent(step, steps)


def _check_saved_depth(data: object) -> None:
    """Refuse, before rebuilding anything, saved events nested beyond :data:`MAX_EVENT_DEPTH`.

    Walks the saved form level by level (no recursion, so any depth is measured safely).
    """
    level: list[object] = [data]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_EVENT_DEPTH:
            raise StateError(
                f"Expected a saved event nested at most MAX_EVENT_DEPTH = {MAX_EVENT_DEPTH} "
                f"levels deep, got one more than {MAX_EVENT_DEPTH} levels deep."
            )
        inner: dict[int, object] = {}
        for item in level:
            if not isinstance(item, Mapping):
                continue
            single, many = item.get("event"), item.get("events")
            for child in [single, *(many if isinstance(many, list) else [])]:
                if isinstance(child, Mapping):
                    inner[id(child)] = child
        level = list(inner.values())


def event_from_dict(data: Mapping[str, Any]) -> DpEvent:
    """Rebuild an event from :meth:`DpEvent.to_dict`; malformed input raises :class:`StateError`.

    Saved events nested deeper than :data:`MAX_EVENT_DEPTH` are refused (``StateError``) before
    anything is rebuilt.
    """
    _check_saved_depth(data)
    return _event_from_dict(data)


def _event_from_dict(data: Mapping[str, Any]) -> DpEvent:
    if not isinstance(data, Mapping) or "type" not in data:
        raise StateError(f"Expected an event object with a 'type' key, got {data!r}.")
    cls = _EVENT_TYPES.get(data["type"])
    if cls is None:
        known = ", ".join(sorted(_EVENT_TYPES))
        raise StateError(f"Expected event type in {{{known}}}, got {data['type']!r}.")
    kwargs: dict[str, Any] = {}
    names = {field.name for field in dataclasses.fields(cls)}
    extra = set(data) - names - {"type"}
    if extra:
        raise StateError(f"Unexpected keys {sorted(extra)} in saved {cls.kind} event.")
    try:
        for name in names:
            value = data[name]
            if name == "event":
                value = _event_from_dict(value)
            elif name == "events":
                if not isinstance(value, list):
                    raise StateError(f"Expected a list for 'events', got {value!r}.")
                value = [_event_from_dict(item) for item in value]
            kwargs[name] = value
        return cls(**kwargs)
    except KeyError as missing:
        raise StateError(f"Saved {cls.kind} event lacks the key {missing}.") from None
    except InvalidParameterError as error:
        raise StateError(f"Saved {cls.kind} event is invalid: {error}") from error
