"""The interface every accountant implements, and the event dispatch they share.

An accountant is built empty, ``compose``-d with events, and asked for epsilon(delta) or
delta(epsilon). Composite events (:class:`SelfComposedEvent`, :class:`ComposedEvent`) are flattened
here; each accountant registers one handler per *leaf signature* -- the event type, or for a
sampled event the pair (sampling type, inner mechanism type) -- with :func:`handles`. An event with
no handler raises :class:`UnsupportedEventError` naming it: nothing is ever skipped silently.
"""

from __future__ import annotations

import abc
import enum
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError, StateError, UnsupportedEventError
from dpcore.events import (
    ComposedEvent,
    DpEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    event_from_dict,
)
from dpcore.validation import check_count, check_delta_closed, check_epsilon

__all__ = [
    "Approximate",
    "EstimateKind",
    "NeighboringRelation",
    "PrivacyAccountant",
    "handles",
    "leaf_signature",
]

Signature = tuple[type[DpEvent], ...]
_A = TypeVar("_A", bound="PrivacyAccountant")
_STATE_FORMAT = 1


class NeighboringRelation(enum.Enum):
    """Which datasets count as neighbours."""

    ADD_OR_REMOVE_ONE = "add_or_remove_one"
    REPLACE_ONE = "replace_one"


class EstimateKind(enum.Enum):
    """The direction of an accountant's answer."""

    UPPER_BOUND = "upper_bound"
    APPROXIMATE = "approximate"


class Approximate(float):
    """A float that is an approximation, *not* a guarantee (e.g. the GDP central limit theorem).

    It behaves as a float; its ``repr`` and :attr:`label` say what it is.

    >>> Approximate(0.83)
    Approximate(0.83, 'approximate, not a guarantee')
    """

    label: ClassVar[str] = "approximate, not a guarantee"

    def __repr__(self) -> str:
        return f"Approximate({float(self)!r}, {self.label!r})"

    __str__ = __repr__


def leaf_signature(event: DpEvent) -> Signature:
    """The registry key of a non-composite event."""
    if isinstance(
        event, (PoissonSampledEvent, SampledWithoutReplacementEvent, RandomAllocationEvent)
    ):
        return (type(event), type(event.event))
    return (type(event),)


def handles(*signatures: Signature) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a method ``(self, event, count)`` as the handler for the given leaf signatures."""

    def mark(method: Callable[..., None]) -> Callable[..., None]:
        method._dpcore_signatures = signatures  # type: ignore[attr-defined]
        return method

    return mark


class PrivacyAccountant(abc.ABC):
    """Common interface: ``compose``, ``supports``, ``get_epsilon``, ``get_delta``, save/load.

    Subclasses set :attr:`name` (the CLI/JSON name) and :attr:`kind`, register leaf handlers with
    :func:`handles`, implement :meth:`_epsilon` / :meth:`_delta`, and return their constructor
    arguments from :meth:`config` so that saved state rebuilds an identical accountant.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[EstimateKind] = EstimateKind.UPPER_BOUND
    _registry: ClassVar[dict[Signature, str]] = {}
    _accountants: ClassVar[dict[str, type[PrivacyAccountant]]] = {}

    def __init_subclass__(cls, register: bool = True, **kwargs: Any) -> None:
        """Collect the handlers; ``register=False`` keeps the class out of the name registry
        (:func:`accountant_class`, ``load``), e.g. an accountant defined for a test."""
        super().__init_subclass__(**kwargs)
        registry: dict[Signature, str] = {}
        for klass in reversed(cls.__mro__):
            for attribute, member in vars(klass).items():
                for signature in getattr(member, "_dpcore_signatures", ()):
                    registry[signature] = attribute
        cls._registry = registry
        if cls.name and register:
            PrivacyAccountant._accountants[cls.name] = cls

    def __init__(self) -> None:
        self._history: list[tuple[DpEvent, int]] = []

    # ----------------------------------------------------------------- composition
    def _leaves(self, event: DpEvent, count: int) -> list[tuple[DpEvent, int]]:
        if isinstance(event, SelfComposedEvent):
            return self._leaves(event.event, count * event.count)
        if isinstance(event, ComposedEvent):
            return [leaf for item in event.events for leaf in self._leaves(item, count)]
        if not isinstance(event, DpEvent):
            raise InvalidParameterError("event", "to be a DpEvent", event)
        return [(event, count)]

    def unsupported_reason(self, event: DpEvent) -> str | None:
        """Why ``event`` cannot be composed (``None`` when it can)."""
        for leaf, _ in self._leaves(event, 1):
            if leaf_signature(leaf) not in self._registry:
                return f"no rule for {type(leaf).__name__}" + (
                    f" of {type(leaf.event).__name__}" if hasattr(leaf, "event") else ""
                )
            reason = self._leaf_reason(leaf)
            if reason is not None:
                return reason
        return None

    def _leaf_reason(self, event: DpEvent) -> str | None:
        """Hook for parameter-dependent refusals (e.g. a neighbouring relation)."""
        return None

    def supports(self, event: DpEvent) -> bool:
        """Whether :meth:`compose` accepts ``event``."""
        return self.unsupported_reason(event) is None

    def compose(self: _A, event: DpEvent, count: int = 1) -> _A:
        """Record that ``event`` ran ``count`` more times; returns ``self`` for chaining.

        Raises:
            UnsupportedEventError: the accountant has no rule for (part of) ``event``;
                nothing is recorded in that case.
            InvalidParameterError: ``count`` is not an integer >= 0.
        """
        count = check_count("count", count)
        reason = self.unsupported_reason(event)
        if reason is not None:
            raise UnsupportedEventError(type(self).__name__, event, reason)
        for leaf, leaf_count in self._leaves(event, count):
            if leaf_count:
                getattr(self, self._registry[leaf_signature(leaf)])(leaf, leaf_count)
        if count:
            self._history.append((event, count))
        return self

    @property
    def history(self) -> tuple[tuple[DpEvent, int], ...]:
        """Every ``(event, count)`` composed so far, in order."""
        return tuple(self._history)

    # ----------------------------------------------------------------- queries
    def get_epsilon(self, target_delta: float) -> float:
        """Epsilon such that everything composed so far is (epsilon, target_delta)-DP.

        ``target_delta`` is in [0, 1): at 0 the answer is a pure-DP epsilon, finite only where
        the accountant certifies one (e.g. a composition of pure-DP steps), ``math.inf``
        otherwise. Returns ``math.inf`` when no finite epsilon is certified (e.g. a noiseless
        mechanism), and 0 when nothing private has run.

        Raises:
            InvalidParameterError: ``target_delta`` outside [0, 1) or not a real number.
        """
        delta = check_delta_closed("target_delta", target_delta)
        epsilon = self._epsilon(delta)
        return self._wrap(max(0.0, epsilon))

    def get_delta(self, target_epsilon: float) -> float:
        """Delta such that everything composed so far is (target_epsilon, delta)-DP."""
        epsilon = check_epsilon("target_epsilon", target_epsilon)
        delta = self._delta(epsilon)
        return self._wrap(min(1.0, max(0.0, delta)))

    def _wrap(self, value: float) -> float:
        if math.isnan(value):  # pragma: no cover - a defect, never an answer
            raise ArithmeticError(f"{type(self).__name__} produced NaN; please report this.")
        return Approximate(value) if self.kind is EstimateKind.APPROXIMATE else float(value)

    @abc.abstractmethod
    def _epsilon(self, delta: float) -> float: ...

    @abc.abstractmethod
    def _delta(self, epsilon: float) -> float: ...

    # ----------------------------------------------------------------- state
    def config(self) -> dict[str, Any]:
        """Constructor keyword arguments, JSON-serialisable."""
        return {}

    def state(self) -> dict[str, Any]:
        """JSON-serialisable state; :meth:`from_state` rebuilds an identical accountant."""
        state: dict[str, Any] = {
            "accountant": self.name,
            "format": _STATE_FORMAT,
            "config": self.config(),
            "history": [{"event": e.to_dict(), "count": n} for e, n in self._history],
        }
        if self.kind is EstimateKind.APPROXIMATE:
            state["label"] = Approximate.label
        return state

    def to_json(self) -> str:
        """The state as a JSON string (floats written with full precision)."""
        return json.dumps(self.state(), sort_keys=True)

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` atomically (the old state or the new, never half)."""
        atomic_write_text(path, self.to_json() + "\n")

    @classmethod
    def from_state(cls: type[_A], state: Mapping[str, Any]) -> _A:
        """Rebuild an accountant from :meth:`state`; raises :class:`StateError` if malformed."""
        if not isinstance(state, Mapping):
            raise StateError(f"Expected a JSON object as accountant state, got {state!r}.")
        name = state.get("accountant")
        target: type[PrivacyAccountant] | None = (
            cls if cls.name else PrivacyAccountant._accountants.get(str(name))
        )
        if target is None or name != target.name:
            expected = cls.name or sorted(PrivacyAccountant._accountants)
            raise StateError(f"Expected state of accountant {expected}, got {name!r}.")
        if state.get("format") != _STATE_FORMAT:
            raise StateError(f"Expected state format {_STATE_FORMAT}, got {state.get('format')!r}.")
        config, history = state.get("config"), state.get("history")
        if not isinstance(config, Mapping) or not isinstance(history, list):
            raise StateError("Expected 'config' to be an object and 'history' a list.")
        try:
            accountant = target(**config)
        except (TypeError, InvalidParameterError) as error:
            raise StateError(f"Saved config of {name} is invalid: {error}") from error
        for entry in history:
            if not isinstance(entry, Mapping) or set(entry) != {"event", "count"}:
                raise StateError(f"Expected history entries {{event, count}}, got {entry!r}.")
            try:
                accountant.compose(event_from_dict(entry["event"]), entry["count"])
            except (InvalidParameterError, UnsupportedEventError) as error:
                raise StateError(f"Saved history of {name} is invalid: {error}") from error
        return accountant  # type: ignore[return-value]

    @classmethod
    def from_json(cls: type[_A], text: str) -> _A:
        """Rebuild an accountant from :meth:`to_json` output."""
        try:
            state = json.loads(text)
        except (json.JSONDecodeError, TypeError) as error:
            raise StateError(f"Accountant state is not valid JSON: {error}") from error
        return cls.from_state(state)

    @classmethod
    def load(cls: type[_A], path: str | Path) -> _A:
        """Read state written by :meth:`save`."""
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def accountant_class(name: str) -> type[PrivacyAccountant]:
    """The accountant class registered under ``name`` (``basic``, ``rdp``, ``pld``, ...)."""
    try:
        return PrivacyAccountant._accountants[name]
    except KeyError:
        known = ", ".join(sorted(PrivacyAccountant._accountants))
        raise InvalidParameterError("accountant", f"in {{{known}}}", name) from None
