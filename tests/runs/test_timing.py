"""dpcore.runs.timing: an executor handed one run at a time, and the machine a run measured on."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs import OneAtATime, machine, one_at_a_time, run_many


class _Overlap:
    """A run that sleeps a little and records how many runs were in progress at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __call__(self, x: int) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.03)
        with self.lock:
            self.now -= 1
        return 2 * x


def test_runs_on_a_wrapped_pool_never_overlap() -> None:
    alone, together = _Overlap(), _Overlap()
    with ThreadPoolExecutor(4) as pool:
        first = run_many(alone, list(range(6)), executor=OneAtATime(pool), progress=False)
        second = run_many(together, list(range(6)), executor=pool, progress=False)
    assert first == second == [0, 2, 4, 6, 8, 10]
    assert alone.most == 1 and together.most > 1  # the same pool, unwrapped, overlaps them


class _Renewable:
    def __init__(self) -> None:
        self.renewed = 0

    def submit(self, fn: Any, /, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future

    def renew(self) -> None:
        self.renewed += 1


def test_the_wrapper_forwards_submit_and_renew() -> None:
    inner = _Renewable()
    wrapped = OneAtATime(inner)
    assert wrapped.submit(abs, -4).result() == 4 and wrapped.max_in_flight == 1
    wrapped.renew()
    assert inner.renewed == 1
    with ThreadPoolExecutor(1) as pool:
        OneAtATime(pool).renew()  # nothing to renew: nothing happens


def test_one_at_a_time_opens_what_is_named_and_wraps_what_is_given() -> None:
    for here in (None, "local"):
        with one_at_a_time(here) as chosen:
            assert chosen is None
    inner = _Renewable()
    with one_at_a_time(inner) as chosen:
        assert isinstance(chosen, OneAtATime) and chosen.executor is inner
    for bad in ("threads:2", object()):
        with pytest.raises(InvalidParameterError, match="executor"), one_at_a_time(bad):
            pass


def test_machine_describes_this_host() -> None:
    here = machine()
    assert isinstance(here["host"], str) and here["cpus"] >= 1
    assert here["ram_gib"] is None or here["ram_gib"] > 0
