"""One seed of every audit of one implementation, as a run of :mod:`dpcore.runs`.

The implementation audits' table, the default call's false-alarm measurement and the tightness
record all consist of the same unit: :func:`dpcore.auditing.audit_seed` of one implementation
at one seed and one pair of settings. :class:`SeedRun` names that unit, :func:`execute` computes
it (in any process: the implementation is rebuilt from its name), and :func:`run_seeds` runs many
through :func:`dpcore.runs.run_many` into one run store (``audits/results/runs/implementations``,
keyed by the code of the audits, the adapters and dpcore's torch layer). A killed run resumes
where it stopped; a seed the table ran is not run again for the false-alarm measurement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from audits.results_io import ROOT, run_store
from dpcore.auditing.audit_settings import ONE_RUN_SETTINGS, PER_STEP_SETTINGS, AuditSettings
from dpcore.auditing.implementation import Implementation
from dpcore.auditing.implementation_audits import audit_seed
from dpcore.runs import RunStore, run_many

__all__ = ["SeedRun", "execute", "registry", "run_seeds", "store"]


@dataclasses.dataclass(frozen=True)
class SeedRun:
    """Every audit of the implementation named ``implementation`` at ``seed``."""

    implementation: str
    seed: int
    per_step: AuditSettings = PER_STEP_SETTINGS
    one_run: AuditSettings = ONE_RUN_SETTINGS


def registry() -> dict[str, Callable[[], Implementation]]:
    """Name -> constructor of every implementation the audits know (built lazily, so that a
    worker process starts only what its runs need)."""
    from audits.implementations.distributed_worker import NOISE_AVERAGED
    from audits.implementations.dpcore_distributed import DpcoreDistributed
    from audits.implementations.opacus_adapter import Opacus
    from audits.implementations.plain_torch import PLANTED_BUGS, PlainTorchDpSgd
    from audits.implementations.tf_privacy import TfPrivacy
    from dpcore.auditing.dpcore_torch import DpcoreTorch

    makers: list[Callable[[], Implementation]] = [
        DpcoreTorch,
        lambda: Opacus(poisson_sampling=True),
        lambda: Opacus(poisson_sampling=False),
        TfPrivacy,
        PlainTorchDpSgd,
        DpcoreDistributed,
        lambda: DpcoreDistributed(bug=NOISE_AVERAGED),
    ]
    makers += [lambda bug=bug: PlainTorchDpSgd(bug) for bug in PLANTED_BUGS]
    return {maker().name: maker for maker in makers}


#: implementations built in this process, by name (one TF Privacy worker per process)
_BUILT: dict[str, Implementation] = {}


def execute(spec: SeedRun) -> list[dict[str, Any]]:
    """The rows of :func:`dpcore.auditing.audit_seed` for ``spec`` (one torch thread)."""
    import torch

    if spec.implementation not in _BUILT:
        _BUILT[spec.implementation] = registry()[spec.implementation]()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny lots: intra-op threads only contend
    try:
        return audit_seed(
            _BUILT[spec.implementation],
            per_step=spec.per_step,
            one_run=spec.one_run,
            seed=spec.seed,
        )
    finally:
        torch.set_num_threads(threads)


#: written by the false-alarm measurement itself (its result, not code that computes runs)
_RESULT_MODULES = ("dpcore/auditing/false_alarms.py",)


def _sources() -> list[Path]:
    folders = ("audits/implementations", "dpcore/auditing", "dpcore/torch")
    paths = (path for folder in folders for path in (ROOT / folder).rglob("*.py"))
    return sorted(p for p in paths if p.relative_to(ROOT).as_posix() not in _RESULT_MODULES)


def store() -> RunStore:
    """The implementation audits' run store."""
    return run_store("implementations", *_sources())


def run_seeds(
    specs: Sequence[SeedRun], *, executor: Any = None, progress: bool = True
) -> list[list[dict[str, Any]]]:
    """The rows of every spec, from the store or computed (fanned out over ``executor``)."""
    try:
        return run_many(execute, specs, executor=executor, store=store(), progress=progress)
    finally:
        for built in _BUILT.values():
            close = getattr(built, "close", None)
            if close is not None:
                close()
        _BUILT.clear()
