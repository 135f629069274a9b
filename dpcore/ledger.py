"""The privacy ledger: one event per training step, readable by any accountant.

Framework-free: the torch trainer (:mod:`dpcore.torch`) and the TensorFlow one (:mod:`dpcore.tf`)
record into the same ledger and print the same statement.

Each noisy step appends ``PoissonSampled(q, Gaussian(sigma))`` (DP-SGD, Abadi et al. 2016) or
``PoissonSampled(q, JLGaussian(sigma, r))`` (DP-SGD-JL, Bu et al. 2021). Consecutive identical
steps are stored as one run, so a 10^5-step ledger is a few entries. The ledger records *what
ran*, never data-dependent values such as realised lot sizes (those would leak).

The sampler decides what the steps compose to: Poisson lots are the recorded events themselves;
balls-in-bins lots (:class:`~dpcore.torch.samplers.BallsInBinsSampler`) are one
:class:`~dpcore.events.RandomAllocationEvent` per epoch *of the sampler* that the steps touched
(a partial epoch is a prefix of a full one, a post-processing, so it costs at most a full epoch;
the sampler's epochs count from its own first lot, so the ledger records which lots it saw, from
``first_lot``); shuffled fixed-size batches
have no valid upper bound here: their statement gives the Poisson number labelled as such next
to a certified *lower* bound (:mod:`dpcore.accountants.shuffled`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from dpcore.accountants import accountant_class
from dpcore.accountants.shuffled import shuffled_lower_bound
from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError, StateError
from dpcore.events import (
    ComposedEvent,
    DpEvent,
    GaussianEvent,
    JLGaussianEvent,
    PoissonSampledEvent,
    RandomAllocationEvent,
    SelfComposedEvent,
    event_from_dict,
)
from dpcore.provenance import git_commit
from dpcore.validation import check_count, check_delta, check_positive, check_probability

__all__ = ["SAMPLERS", "PrivacyLedger", "write_statement"]

#: The samplers a ledger knows how to account for (see the module docstring).
SAMPLERS = ("poisson", "balls_in_bins", "shuffled_fixed_size")


@dataclasses.dataclass
class _Run:
    event: DpEvent
    count: int


class PrivacyLedger:
    """Records the event of every noisy step of a run.

    Args:
        dataset_size: N, recorded in the statement.
        sampler: ``"poisson"``, ``"balls_in_bins"`` or ``"shuffled_fixed_size"`` (the last has
            no valid upper bound: the statement labels its Poisson epsilon as such and adds a
            certified lower bound).
        steps_per_epoch: lots per epoch; required for ``"balls_in_bins"`` (its analysis goes
            epoch by epoch; shuffled epochs are N // B lots, derived from q = B / N).
        first_lot: the sampler's number of the first lot this ledger records (its ``lots_drawn``
            when the ledger is made). Steps are recorded lot by lot from there, so the ledger
            knows which of the sampler's epochs they fall in: a balls-in-bins sampler starts a
            new allocation at every multiple of ``steps_per_epoch`` of *its own* lot count.

    Example:
        >>> ledger = PrivacyLedger(dataset_size=60_000)
        >>> for _ in range(3):
        ...     _ = ledger.record(sampling_probability=0.01, noise_multiplier=1.0)
        >>> ledger.steps, round(ledger.epsilon(delta=1e-5, accountant="rdp"), 2)
        (3, 0.99)
    """

    def __init__(
        self,
        *,
        dataset_size: int,
        sampler: str = "poisson",
        steps_per_epoch: int | None = None,
        first_lot: int = 0,
    ) -> None:
        self.dataset_size = check_count("dataset_size", dataset_size, minimum=1)
        self.first_lot = check_count("first_lot", first_lot)
        if sampler not in SAMPLERS:
            raise InvalidParameterError("sampler", f"in {SAMPLERS}", sampler)
        if sampler == "balls_in_bins" and steps_per_epoch is None:
            raise InvalidParameterError(
                "steps_per_epoch", f"to be an integer >= 1 for {sampler}", None
            )
        self.sampler = sampler
        self.steps_per_epoch = (
            None
            if steps_per_epoch is None
            else check_count("steps_per_epoch", steps_per_epoch, minimum=1)
        )
        self._runs: list[_Run] = []

    @property
    def matches_poisson_analysis(self) -> bool:
        """Whether the lots were Poisson-sampled, as every DP-SGD accountant assumes."""
        return self.sampler == "poisson"

    @property
    def has_valid_analysis(self) -> bool:
        """Whether :meth:`event` describes what ran (false only for shuffled batches)."""
        return self.sampler != "shuffled_fixed_size"

    def check(
        self,
        *,
        sampling_probability: float,
        noise_multiplier: float,
        jl_dimension: int | None = None,
        lot: int | None = None,
    ) -> DpEvent:
        """The event :meth:`record` would append, or the error it would raise; records nothing.

        Call it before the step runs (before any noise is drawn or parameter moves), so that a
        step that cannot be recorded does not happen.

        Args:
            sampling_probability: q of the step's lot.
            noise_multiplier: sigma of the step's noise.
            jl_dimension: r for a JL step, ``None`` for exact clipping.
            lot: the sampler's number of the step's lot; it must be :attr:`next_lot` (each lot
                once, in order). ``None``: the next lot.

        Returns:
            The step's event.

        Raises:
            InvalidParameterError: q not in [0, 1], sigma <= 0, a lot other than the next, or
                under balls-in-bins sampling an event other than the recorded one.
        """
        q = check_probability("sampling_probability", sampling_probability)
        sigma = check_positive("noise_multiplier", noise_multiplier)
        if lot is not None and lot != self.next_lot:
            raise InvalidParameterError(
                "lot",
                f"= {self.next_lot}, the sampler's lot after the last one recorded (each lot is "
                "recorded once, in order)",
                lot,
            )
        inner: DpEvent = (
            GaussianEvent(sigma) if jl_dimension is None else JLGaussianEvent(sigma, jl_dimension)
        )
        event = PoissonSampledEvent(q, inner)
        if self.sampler == "balls_in_bins" and self._runs and self._runs[-1].event != event:
            raise InvalidParameterError(
                "noise_multiplier",
                f"to stay as recorded under balls-in-bins sampling ({self._runs[-1].event})",
                event,
            )
        return event

    def record(
        self,
        *,
        sampling_probability: float,
        noise_multiplier: float,
        jl_dimension: int | None = None,
        lot: int | None = None,
    ) -> DpEvent:
        """Append one step; returns its event.

        Args and Raises: as :meth:`check` (which this calls first: nothing is recorded on error).
        """
        event = self.check(
            sampling_probability=sampling_probability,
            noise_multiplier=noise_multiplier,
            jl_dimension=jl_dimension,
            lot=lot,
        )
        if self._runs and self._runs[-1].event == event:
            self._runs[-1].count += 1
        else:
            self._runs.append(_Run(event, 1))
        return event

    @property
    def steps(self) -> int:
        """The number of noisy steps recorded."""
        return sum(run.count for run in self._runs)

    @property
    def next_lot(self) -> int:
        """The sampler's number of the lot the next recorded step must be (first_lot + steps)."""
        return self.first_lot + self.steps

    @property
    def epochs(self) -> int:
        """The sampler's epochs that the recorded steps touched (``None`` steps_per_epoch: 0).

        Lot ``n`` lies in the sampler's epoch ``n // steps_per_epoch``; the steps are lots
        ``first_lot .. next_lot - 1``, so a run that starts mid-epoch touches that epoch too.
        """
        if self.steps_per_epoch is None or not self._runs:
            return 0
        last = self.next_lot - 1
        return last // self.steps_per_epoch - self.first_lot // self.steps_per_epoch + 1

    @property
    def uses_jl(self) -> bool:
        """Whether any step clipped by JL-estimated norms."""
        return any(isinstance(run.event.event, JLGaussianEvent) for run in self._runs)  # type: ignore[attr-defined]

    def event(self) -> DpEvent:
        """Everything recorded, as one composed event (see the module docstring per sampler)."""
        if self.sampler == "balls_in_bins" and self._runs:
            assert self.steps_per_epoch is not None  # required by the constructor
            inner = self._runs[0].event.event  # type: ignore[attr-defined]
            allocation = RandomAllocationEvent(self.steps_per_epoch, inner)
            return SelfComposedEvent(allocation, self.epochs)
        return ComposedEvent(SelfComposedEvent(run.event, run.count) for run in self._runs)

    def shuffled_lower_bound(self, delta: float) -> dict[str, Any]:
        """For shuffled batches: a certified lower bound on epsilon, or why there is none.

        The bound (:func:`dpcore.accountants.shuffled.shuffled_lower_bound`) needs one noise
        multiplier and one batch size B = q N throughout, and exact clipping (no JL steps).
        """
        events = {run.event for run in self._runs}
        if self.uses_jl or len(events) != 1:
            why = "JL steps" if self.uses_jl else "no steps or steps of different settings"
            return {
                "epsilon": None,
                "unsupported": f"the bound assumes one setting without JL ({why})",
            }
        (event,) = events
        assert isinstance(event, PoissonSampledEvent) and isinstance(event.event, GaussianEvent)
        batch = round(event.sampling_probability * self.dataset_size)
        bound = shuffled_lower_bound(
            noise_multiplier=event.event.noise_multiplier,
            dataset_size=self.dataset_size,
            batch_size=batch,
            steps=self.steps,
        )
        return {
            "epsilon": bound.epsilon(delta),
            "kind": "lower_bound",
            "analysis": "Chua et al. 2024 (arXiv 2403.17673) pair, max-statistic, composed PLD",
        }

    def epsilon(self, *, delta: float, accountant: str = "pld") -> float:
        """Epsilon at ``delta`` from the named accountant (``rdp``, ``pld``, ``gdp_clt``, ...).

        Raises:
            UnsupportedEventError: the accountant cannot analyse a recorded step (e.g. a JL step
                for an accountant without the JL rule).
        """
        target = check_delta("delta", delta)
        return accountant_class(accountant)().compose(self.event()).get_epsilon(target)

    def statement(
        self, *, delta: float, accountants: tuple[str, ...] = ("rdp", "pld"), **extra: Any
    ) -> dict[str, Any]:
        """A machine-readable privacy statement of the run so far.

        It names the sampler and whether it matches the Poisson analysis, the neighbouring
        relation, delta, each accountant's epsilon and the direction of its answer (an accountant
        that cannot analyse the steps is listed with its reason instead of a number), the JL flag,
        the events and the library commit. Extra keyword arguments (clipping norm, model name,
        ...) are stored under ``"run"``.
        """
        target = check_delta("delta", delta)
        results: dict[str, Any] = {}
        for name in accountants:
            cls = accountant_class(name)
            instance = cls()
            reason = instance.unsupported_reason(self.event())
            if reason is not None:
                results[name] = {"epsilon": None, "unsupported": reason}
                continue
            epsilon = instance.compose(self.event()).get_epsilon(target)
            results[name] = {
                "epsilon": epsilon if math.isfinite(epsilon) else "inf",
                "kind": cls.kind.value,
            }
        key = "epsilon" if self.has_valid_analysis else "epsilon_if_poisson_sampled"
        more: dict[str, Any] = {}
        if self.sampler == "shuffled_fixed_size":
            more["shuffled_epsilon_lower_bound"] = self.shuffled_lower_bound(target)
        return {
            "sampler": self.sampler,
            "matches_poisson_analysis": self.matches_poisson_analysis,
            "neighboring_relation": "add_or_remove_one",
            "dataset_size": self.dataset_size,
            "steps": self.steps,
            "delta": target,
            key: results,
            **more,
            "jl": self.uses_jl,
            "events": self.event().to_dict(),
            "library_commit": git_commit(),
            "run": extra,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state."""
        return {
            "dataset_size": self.dataset_size,
            "sampler": self.sampler,
            "steps_per_epoch": self.steps_per_epoch,
            "first_lot": self.first_lot,
            "runs": [{"event": run.event.to_dict(), "count": run.count} for run in self._runs],
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`state_dict`, checking that it is one :meth:`record` made.

        Every run must be a count >= 1 of ``PoissonSampled(q, Gaussian(sigma))`` or
        ``PoissonSampled(q, JLGaussian(sigma, r))``, and a balls-in-bins ledger must hold one
        event throughout. Entries this version does not know are ignored.

        Raises:
            StateError: a state that is not such a ledger (nothing is built).
        """
        if not isinstance(state, dict):
            raise StateError(f"Malformed ledger state: a {type(state).__name__}, not a dict.")
        try:
            ledger = cls(
                dataset_size=state["dataset_size"],
                sampler=state["sampler"],
                steps_per_epoch=state.get("steps_per_epoch"),
                first_lot=state.get("first_lot", 0),
            )
            ledger._runs = [
                _Run(event_from_dict(run["event"]), check_count("count", run["count"], minimum=1))
                for run in state["runs"]
            ]
            _check_recorded_runs(ledger.sampler, [run.event for run in ledger._runs])
        except (KeyError, TypeError, InvalidParameterError) as error:
            raise StateError(f"Malformed ledger state: {error!r}.") from error
        return ledger

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrivacyLedger) and self.state_dict() == other.state_dict()

    __hash__ = None  # type: ignore[assignment]


def _check_recorded_runs(sampler: str, events: list[DpEvent]) -> None:
    """Raise :class:`StateError` unless ``events`` could have been appended by ``record``."""
    for event in events:
        if not (
            isinstance(event, PoissonSampledEvent)
            and isinstance(event.event, GaussianEvent | JLGaussianEvent)
        ):
            raise StateError(
                f"Malformed ledger state: a step must be PoissonSampled(Gaussian) or "
                f"PoissonSampled(JLGaussian), got {event}."
            )
    if sampler == "balls_in_bins" and len(set(events)) > 1:
        raise StateError(
            "Malformed ledger state: a balls-in-bins ledger holds one event throughout, got "
            f"{len(set(events))}."
        )


def write_statement(path: str | Path, statement: dict[str, Any]) -> dict[str, Any]:
    """Write a statement as JSON to ``path`` atomically (:mod:`dpcore.atomic`); returns it.

    A reader (or a process killed mid-write) sees the previous statement or this one, never a
    truncated file.
    """
    atomic_write_text(path, json.dumps(statement, indent=2, sort_keys=True) + "\n")
    return statement
