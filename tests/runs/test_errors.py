from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool

from dpcore.runs import RunsFailedError
from dpcore.runs.errors import SHOWN_CHARACTERS, SHOWN_FAILURES


def test_the_message_names_a_few_failures_briefly_and_keeps_them_all() -> None:
    failures = [(("spec", i, "x" * 1000), ValueError(f"bad {i}")) for i in range(12)]
    error = RunsFailedError(failures, attempts=2)
    message = str(error)
    assert error.failures == failures and error.attempts == 2
    assert message.startswith("12 run(s) failed after 2 attempt(s) each")
    assert "ValueError: bad 0" in message and f"bad {SHOWN_FAILURES - 1}" in message
    assert f"bad {SHOWN_FAILURES}" not in message
    assert f"and {12 - SHOWN_FAILURES} more" in message
    assert max(len(line) for line in message.splitlines()) < 2 * SHOWN_CHARACTERS + 10
    assert "worker process died" not in message


def test_a_dead_worker_gets_its_likely_causes() -> None:
    message = str(RunsFailedError([("spec", BrokenProcessPool("terminated abruptly"))], 1))
    assert "BrokenProcessPool: terminated abruptly" in message
    assert "__main__" in message and "out of memory" in message
