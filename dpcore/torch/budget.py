"""A privacy budget kept beside the ledger: warn, or stop, before a step would exceed the plan.

A run planned for (epsilon, delta) (``make_private(..., target_epsilon=...)``,
``DPTrainer(..., target_epsilon=...)``) keeps that plan in a :class:`PrivacyBudget`. Before every
noisy step (a lot's first micro-batch in your own loop, :meth:`DPTrainer.step`; after a resume
too, since the loaded ledger is what is checked) the budget asks whether the ledger with that step
added would still be within the plan under the default accountant (the PLD accountant's
certified upper bound). If not, it issues a :class:`BudgetExceededWarning` (``budget="warn"``,
the default: once per budget) or raises :class:`BudgetExceededError` (``budget="stop"``) before
anything changes.

Checking a step costs one accountant evaluation; to keep it off the training loop the budget
works out once how many more steps of the same setting stay within the plan (doubling, then
bisection), and re-evaluates only when the setting or the ledger object changes or that
allowance runs out.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

from dpcore.accountants import accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.calibration import DEFAULT_ACCOUNTANT
from dpcore.errors import DPCoreError, InvalidParameterError
from dpcore.events import ComposedEvent, DpEvent, SelfComposedEvent
from dpcore.ledger import PrivacyLedger
from dpcore.validation import check_delta, check_positive

__all__ = ["BUDGET_POLICIES", "BudgetExceededError", "BudgetExceededWarning", "PrivacyBudget"]

#: What to do before a step that would exceed the budget.
BUDGET_POLICIES = ("warn", "stop")
BudgetPolicy = Literal["warn", "stop"]
# The allowance search stops here (steps beyond the current ledger): far beyond any run.
_MAX_ALLOWANCE = 1 << 40


class BudgetExceededWarning(UserWarning):
    """The next step takes the run past its planned epsilon (the ledger still records it)."""


class BudgetExceededError(DPCoreError):
    """The next step would take the run past its planned epsilon; nothing was changed."""


class PrivacyBudget:
    """A planned (epsilon, delta) and what to do before a step would exceed it.

    Args:
        epsilon: the planned epsilon > 0.
        delta: the planned delta in (0, 1).
        policy: ``"warn"`` (a :class:`BudgetExceededWarning`, once) or ``"stop"`` (raise
            :class:`BudgetExceededError` before the step).

    Raises:
        InvalidParameterError: on a bad epsilon, delta or policy.
    """

    def __init__(self, *, epsilon: float, delta: float, policy: str = "warn") -> None:
        self.epsilon = check_positive("target_epsilon", epsilon)
        self.delta = check_delta("target_delta", delta)
        if policy not in BUDGET_POLICIES:
            raise InvalidParameterError("budget", f"in {BUDGET_POLICIES}", policy)
        self.policy: BudgetPolicy = "warn" if policy == "warn" else "stop"
        self.accountant = DEFAULT_ACCOUNTANT
        self.warned = False
        # (ledger, step event, steps the ledger may reach with that event within the plan)
        self._allowance: tuple[PrivacyLedger, DpEvent, int] | None = None

    def __repr__(self) -> str:
        return (
            f"PrivacyBudget(epsilon={self.epsilon!r}, delta={self.delta!r}, "
            f"policy={self.policy!r}, accountant={self.accountant!r})"
        )

    def epsilon_after(self, ledger: PrivacyLedger, event: DpEvent, steps: int) -> float:
        """Epsilon of ``ledger`` followed by ``steps`` more steps of ``event`` (plan's delta).

        The composed event is the one the ledger would hold after recording them (a last run of
        the same event grows), so the answer is the number the ledger will then report.
        """
        recorded = ledger.event()
        assert isinstance(recorded, ComposedEvent)  # balls-in-bins is refused before
        runs = list(recorded.events)
        last = runs[-1] if runs else None
        if isinstance(last, SelfComposedEvent) and last.event == event:
            runs[-1] = SelfComposedEvent(event, last.count + steps)
        else:
            runs.append(SelfComposedEvent(event, steps))
        composed = ComposedEvent(runs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderGridEdgeWarning)  # still an upper bound
            accountant = accountant_class(self.accountant)()
            return float(accountant.compose(composed).get_epsilon(self.delta))

    def check(
        self,
        ledger: PrivacyLedger,
        *,
        sampling_probability: float,
        noise_multiplier: float,
        jl_dimension: int | None = None,
    ) -> None:
        """Before one more step of this setting: within the plan, or warn / raise.

        Raises:
            BudgetExceededError: with ``policy="stop"``, when the step would take the ledger's
                epsilon past the plan (the message gives both numbers and the step).
            InvalidParameterError: the ledger would refuse the step (see
                :meth:`~dpcore.ledger.PrivacyLedger.check`).
        """
        event = ledger.check(
            sampling_probability=sampling_probability,
            noise_multiplier=noise_multiplier,
            jl_dimension=jl_dimension,
        )
        if self.policy == "warn" and self.warned:
            return
        cached = self._allowance
        if (
            cached is not None
            and cached[0] is ledger
            and cached[1] == event
            and ledger.steps + 1 <= cached[2]
        ):
            return
        if ledger.sampler == "balls_in_bins":
            raise InvalidParameterError(
                "target_epsilon",
                "not given for balls-in-bins sampling (its epochs are analysed by RDP only; "
                f"the budget uses the {self.accountant} accountant)",
                self.epsilon,
            )
        spent = self.epsilon_after(ledger, event, 1)
        if spent > self.epsilon:
            self._exceeded(ledger, spent)
            return
        self._allowance = (ledger, event, ledger.steps + self._more_steps(ledger, event))

    def _more_steps(self, ledger: PrivacyLedger, event: DpEvent) -> int:
        """The most steps of ``event`` after ``ledger`` within the plan (at least 1)."""
        good, bad = 1, 2
        while self.epsilon_after(ledger, event, bad) <= self.epsilon:
            good, bad = bad, 2 * bad
            if bad > _MAX_ALLOWANCE:
                return good
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.epsilon_after(ledger, event, middle) <= self.epsilon:
                good = middle
            else:
                bad = middle
        return good

    def _exceeded(self, ledger: PrivacyLedger, spent: float) -> None:
        message = (
            f"Step {ledger.steps + 1} would take epsilon to {spent:.6g} ({self.accountant}, "
            f"delta = {self.delta:g}), past the planned target_epsilon = {self.epsilon:g}"
        )
        if self.policy == "stop":
            raise BudgetExceededError(
                message + ". Nothing was changed; the run has spent its budget "
                f"({self._spent_text(ledger)} after {ledger.steps} steps)."
            )
        self.warned = True
        warnings.warn(
            message + "; the step runs and the ledger records it (budget='stop' refuses it).",
            BudgetExceededWarning,
            stacklevel=4,
        )

    def _spent_text(self, ledger: PrivacyLedger) -> str:
        if not ledger.steps:
            return "epsilon 0"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OrderGridEdgeWarning)
            value = ledger.epsilon(delta=self.delta, accountant=self.accountant)
        return f"epsilon {value:.6g}" if math.isfinite(value) else "epsilon inf"
