"""One run layer for every experiment: specs, a run store, and executors to fan runs out on.

A *run* is a pure function of a frozen, hashable spec (a dataclass holding everything that
determines its result, seed included). ``execute(spec)`` is a module-level function, so any
worker can call it; :class:`RunStore` keeps each result atomically in a folder named by the spec
and the code fingerprint, so a finished run is never redone and a killed one leaves nothing
half-written. :func:`run_many` runs many specs in this process (the default), in spawned
processes, on Dask, on Ray or on Slurm through submitit, and returns their results from the
store; measurements that must run alone (timings) go through :func:`one_at_a_time`, which
hands any executor one run at a time. Only the standard library is imported here; an engine is
imported when it is asked for.

Example:
    >>> import tempfile
    >>> from dpcore.runs.example import ExampleSpec, example_run
    >>> store = RunStore(tempfile.mkdtemp(), code="example")
    >>> specs = [ExampleSpec(seed=seed, steps=100) for seed in range(3)]
    >>> first = run_many(example_run, specs, store=store, progress=False)
    >>> first == run_many(example_run, specs, store=store, executor="local", progress=False)
    True
"""

from __future__ import annotations

from dpcore.runs.bundle import Imported, export_runs, import_runs, read_bundle
from dpcore.runs.errors import EngineMissingError, RunNotFoundError, RunsFailedError
from dpcore.runs.executors import (
    EXECUTOR_FORMS,
    ExecutorChoice,
    RayExecutor,
    SpawnPool,
    SubmititExecutor,
    open_executor,
    parse_executor,
)
from dpcore.runs.fanout import SupportsSubmit, run_many
from dpcore.runs.spec import check_spec, code_fingerprint, spec_json, spec_key
from dpcore.runs.store import RunStore, StoredRun, stored
from dpcore.runs.timing import OneAtATime, machine, one_at_a_time

__all__ = [
    "EXECUTOR_FORMS",
    "EngineMissingError",
    "ExecutorChoice",
    "Imported",
    "OneAtATime",
    "RayExecutor",
    "RunNotFoundError",
    "RunStore",
    "RunsFailedError",
    "SpawnPool",
    "StoredRun",
    "SubmititExecutor",
    "SupportsSubmit",
    "check_spec",
    "code_fingerprint",
    "export_runs",
    "import_runs",
    "machine",
    "one_at_a_time",
    "open_executor",
    "parse_executor",
    "read_bundle",
    "run_many",
    "spec_json",
    "spec_key",
    "stored",
]
