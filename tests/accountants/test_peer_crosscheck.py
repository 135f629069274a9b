"""dpcore against the numbers other accounting libraries hard-code in their own test suites.

Every case in ``peer_values.json`` is one question that a peer's public test answers with a
hard-coded number: the epsilon at a delta, the delta at an epsilon, an RDP value at an order, a
GDP parameter or a true-positive rate. Each case cites the project, the file, the commit that
file was read at and the test, and says how dpcore's answer must relate to the peer's number:

* ``agree``: within the tolerance that the peer's test states (``places`` as in
  ``assertAlmostEqual``, ``rtol``/``atol`` as in ``np.allclose``, ``range`` for an interval,
  ``exact`` for ``assertEqual``). A PLD answer is a certified interval ``[lower, upper]``: the
  peer's number agrees when it lies in that interval widened by the peer's tolerance.
* ``tighter``: dpcore's certified upper bound is at most the peer's value (up to the peer's
  tolerance), which is itself an upper estimate, and at least the case's ``floor``, a valid lower
  bound given in the case (its ``reason`` says why); a PLD interval's lower end must not exceed
  the peer's value either.
* ``differs``: dpcore's answer is on the side ``direction`` (``above`` / ``below``) of the peer's
  value, outside the peer's tolerance, for the documented ``reason``.

In every case a ``floor`` / ``ceiling``, where given, bounds dpcore's answer as well. Where a
peer's question has no direct dpcore form (an RDP value read as a log moment, say) the case's
``note`` says how it was restated. The numbers are recorded data; no peer is imported here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from dpcore.accountants import PldAccountant, accountant_class
from dpcore.accountants.rdp import OrderGridEdgeWarning
from dpcore.events import (
    ComposedEvent,
    DpEvent,
    EpsilonDeltaEvent,
    GaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
    event_from_dict,
)
from dpcore.tradeoff import (
    EpsilonDeltaTradeoff,
    GaussianTradeoff,
    TradeoffFunction,
    compose,
    poisson_subsample,
    self_compose,
)

DATA_PATH = Path(__file__).with_name("peer_values.json")
DATA: dict[str, Any] = json.loads(DATA_PATH.read_text(encoding="utf-8"))
CASES: list[dict[str, Any]] = DATA["cases"]

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_COMPARISONS = {"agree", "tighter", "differs"}


def _number(value: float | str) -> float:
    """A recorded number; infinities are written as the strings "inf" / "-inf"."""
    return float(value)


@dataclasses.dataclass(frozen=True)
class Answer:
    """dpcore's answer: ``value`` (the upper bound for PLD) within ``[lower, upper]``."""

    value: float
    lower: float
    upper: float

    @classmethod
    def point(cls, value: float) -> Answer:
        return cls(float(value), float(value), float(value))


def _orders(spec: Any) -> list[float]:
    """A grid of RDP orders: a list, the name of a grid in the data file, or a scaled range."""
    if isinstance(spec, str):
        spec = DATA["order_grids"][spec]["orders"]
    if isinstance(spec, dict):
        start, stop = spec["range"]
        return [spec["scale"] * i for i in range(start, stop)]
    return [_number(order) for order in spec]


def _accountant(case: dict[str, Any]) -> Any:
    config = dict(case.get("config", {}))
    if "orders" in config:
        config["orders"] = _orders(config["orders"])
    if case["relation"] == "replace_one":
        config["neighboring_relation"] = "replace_one"
    return accountant_class(case["accountant"])(**config)


def _tradeoff(event: DpEvent) -> TradeoffFunction:
    """The f-DP curve of an event (Dong, Roth, Su 2019): exact pieces, pessimistic operations."""
    if isinstance(event, GaussianEvent):
        return GaussianTradeoff(1.0 / event.noise_multiplier)
    if isinstance(event, EpsilonDeltaEvent):
        return EpsilonDeltaTradeoff(event.epsilon, event.delta)
    if isinstance(event, SelfComposedEvent):
        return self_compose(_tradeoff(event.event), event.count)
    if isinstance(event, ComposedEvent):
        curve = _tradeoff(event.events[0])
        for item in event.events[1:]:
            curve = compose(curve, _tradeoff(item))
        return curve
    if isinstance(event, PoissonSampledEvent):
        return poisson_subsample(_tradeoff(event.event), event.sampling_probability)
    raise AssertionError(f"no tradeoff curve for {event!r}")


def answer(case: dict[str, Any]) -> Answer:
    """dpcore's answer to the case's question, through the public API only."""
    event = event_from_dict(case["event"])
    query = case["query"]
    if case["accountant"] == "tradeoff":
        curve = _tradeoff(event)
        if query["kind"] == "tpr":
            return Answer.point(1.0 - float(curve(query["fpr"])))
        if query["kind"] == "delta":
            return Answer.point(curve.delta(query["epsilon"]))
        return Answer.point(curve.epsilon(query["delta"]))
    accountant = _accountant(case)
    accountant.compose(event)
    kind = query["kind"]
    with warnings.catch_warnings():
        # The peers' order grids are part of their questions; an optimum at a grid edge is fine.
        warnings.simplefilter("ignore", OrderGridEdgeWarning)
        if kind == "rdp":
            order = _number(query["order"])
            if case["accountant"] == "moments":
                # The log moment is alpha(lambda) = lambda * RDP(lambda + 1) by its definition
                # (Abadi et al. 2016, Sec. 3.2: the log of E[exp(lambda * privacy loss)]).
                return Answer.point(accountant.log_moments[int(order) - 2] / (order - 1))
            orders = list(accountant.orders)
            return Answer.point(accountant.rdp[orders.index(order)])
        if kind == "gdp_mu":
            return Answer.point(accountant.mu)
        if isinstance(accountant, PldAccountant):
            if kind == "epsilon":
                interval = accountant.get_epsilon_interval(query["delta"])
            else:
                interval = accountant.get_delta_interval(query["epsilon"])
            return Answer(interval.upper, interval.lower, interval.upper)
        if kind == "epsilon":
            if "expected_order" in case:
                value, order = accountant.get_epsilon_and_order(query["delta"])
                assert order == pytest.approx(case["expected_order"]), "optimal order differs"
                return Answer.point(value)
            return Answer.point(accountant.get_epsilon(query["delta"]))
        if kind == "delta":
            return Answer.point(accountant.get_delta(query["epsilon"]))
    raise AssertionError(f"unknown query {query!r}")


def floor(case: dict[str, Any]) -> float:
    """The case's floor: a number, or ``{"pld_lower": config}``, dpcore's certified PLD lower
    bound for the same event and query (a valid lower bound on the true value)."""
    spec = case["floor"]
    if not isinstance(spec, dict):
        return _number(spec)
    pld = PldAccountant(**spec["pld_lower"]).compose(event_from_dict(case["event"]))
    query = case["query"]
    if query["kind"] == "epsilon":
        return pld.get_epsilon_interval(query["delta"]).lower
    return pld.get_delta_interval(query["epsilon"]).lower


def tolerance(case: dict[str, Any], expected: float) -> float:
    """The absolute slack the peer's own assertion allows around ``expected``."""
    spec = case["tolerance"]
    if "places" in spec:  # assertAlmostEqual: round(difference, places) == 0
        return 0.5 * 10.0 ** -spec["places"]
    if spec.get("exact"):
        return 0.0
    if "range" in spec:
        return 0.0
    return spec.get("atol", 0.0) + spec.get("rtol", 0.0) * abs(expected)


def _within(answer_: Answer, expected: float, slack: float) -> bool:
    if math.isinf(expected):
        return answer_.value == expected
    return answer_.lower - slack <= expected <= answer_.upper + slack


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_peer_value(case: dict[str, Any]) -> None:
    got = answer(case)
    expected = _number(case["expected"])
    slack = tolerance(case, expected)
    where = f"{case['project']} {case['file']} {case['test']}: expected {expected!r}, got {got}"
    comparison = case["comparison"]
    if comparison == "agree":
        if "range" in case["tolerance"]:
            low, high = case["tolerance"]["range"]
            assert low <= got.value <= high, where
        else:
            assert _within(got, expected, slack), where
    elif comparison == "tighter":
        assert got.value <= expected + slack, where
        assert got.lower <= expected + slack, where
        assert got.value >= floor(case), f"below the floor: {where}"
    else:
        if case["direction"] == "above":
            assert got.value > expected + slack, where
        else:
            assert got.value < expected - slack, where
    if "floor" in case and comparison != "tighter":
        assert got.value >= floor(case), f"below the floor: {where}"
    if "ceiling" in case:
        assert got.value <= _number(case["ceiling"]), f"above the ceiling: {where}"


def test_data_file_is_complete_and_cited() -> None:
    assert len(CASES) >= 100
    ids = [case["id"] for case in CASES]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    for case in CASES:
        for key in ("project", "file", "test", "event", "accountant", "relation", "query"):
            assert case.get(key), f"{case['id']} lacks {key}"
        assert _COMMIT.match(case["commit"]), f"{case['id']}: commit must be 40 hex digits"
        assert case["comparison"] in _COMPARISONS, case["id"]
        assert "expected" in case and "tolerance" in case, case["id"]
        if case["comparison"] != "agree":
            assert case.get("reason"), f"{case['id']}: a {case['comparison']} case needs a reason"
        if case["comparison"] == "tighter":
            assert "floor" in case, f"{case['id']}: a tighter case needs a floor"
        if case["comparison"] == "differs":
            assert case.get("direction") in {"above", "below"}, case["id"]
        event_from_dict(case["event"])  # every recorded event is well formed
