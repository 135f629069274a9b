"""The false-alarm rate of the default ``audit_implementation`` call, measured on correct loops.

``python -m audits.implementations.false_alarms [--runs N] [--executor E]`` runs the default
call (one seed, Holm at 0.05 over all its audits) on the correct implementations, one seed
offset per run, and counts the runs with any flag. Each run is one
:class:`~audits.implementations.seed_runs.SeedRun` in the implementation audits' run store
(seeds 0, 1, ... of each implementation: those the table ran are read back, not rerun), so a
killed measurement resumes where it stopped; at the end it writes
``audits/results/implementations_false_alarms.json`` and regenerates
:mod:`dpcore.auditing.false_alarms` (the rate every report prints beside its verdicts).
Run it with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from scipy import stats

from audits.implementations.opacus_adapter import Opacus
from audits.implementations.plain_torch import PlainTorchDpSgd
from audits.implementations.seed_runs import SeedRun, run_seeds
from audits.results_io import RESULTS, ROOT
from dpcore.atomic import atomic_write_text
from dpcore.auditing.audit_settings import PER_STEP_SETTINGS
from dpcore.auditing.dpcore_torch import DpcoreTorch
from dpcore.auditing.implementation import Implementation
from dpcore.auditing.verdicts import summarise as summarise_rows
from dpcore.provenance import provenance

OUTPUT = RESULTS / "implementations_false_alarms.json"
MODULE = ROOT / "dpcore" / "auditing" / "false_alarms.py"
#: (implementation, share of the runs): the hand-written loop is the cheapest
MIX: tuple[tuple[Implementation, float], ...] = (
    (PlainTorchDpSgd(), 0.6),
    (DpcoreTorch(), 0.2),
    (Opacus(poisson_sampling=True), 0.2),
)
LEVEL = 0.05


def plan(runs: int) -> list[SeedRun]:
    """The default call's runs: seeds 0, 1, ... of each implementation in ``MIX``, interleaved
    so that a partial measurement is mixed (seeds the table ran come from the store)."""
    counts = [math.floor(share * runs) for _, share in MIX]
    counts[0] += runs - sum(counts)
    out: list[SeedRun] = []
    for index in range(max(counts)):
        for (implementation, _), count in zip(MIX, counts, strict=True):
            if index < count:
                out.append(SeedRun(implementation.name, index))
    return out


def record(spec: SeedRun, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One default call: its audits decided together (Holm at ``LEVEL``), what it flagged."""
    report = summarise_rows(rows, LEVEL)
    return {
        "implementation": spec.implementation,
        "seed": spec.seed,
        "flagged": [row["audit"] for row in report if row["verdict"] != "consistent"],
        "p_values": {row["audit"]: row["p_value"] for row in report},
        "epsilon_lower": {
            row["audit"]: row["epsilon_lower"] for row in report if row["epsilon_lower"] is not None
        },
        "certified_epsilon": {row["audit"]: row["certified_epsilon"] for row in report},
    }


def run(runs: int = 200, *, executor: Any = None) -> dict[str, Any]:
    """Run (or resume) the measurement; write the results and the module; return the summary."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    specs = plan(runs)
    records = [
        record(spec, rows)
        for spec, rows in zip(specs, run_seeds(specs, executor=executor), strict=True)
    ]
    summary = summarise(records)
    summary["provenance"] = provenance(root=ROOT, audit="implementation false alarms")
    atomic_write_text(OUTPUT, json.dumps(summary, indent=1, allow_nan=False) + "\n")
    write_module(summary)
    return summary


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs, flagged runs, the rate with its exact 95 % interval, per audit and per library."""
    flagged = sum(bool(r["flagged"]) for r in records)
    n = len(records)
    low = 0.0 if flagged == 0 else float(stats.beta.ppf(0.025, flagged, n - flagged + 1))
    high = 1.0 if flagged == n else float(stats.beta.ppf(0.975, flagged + 1, n - flagged))
    per_audit: dict[str, int] = {}
    for record in records:
        for audit in record["flagged"]:
            per_audit[audit] = per_audit.get(audit, 0) + 1
    per_implementation: dict[str, list[int]] = {}
    for record in records:
        counts = per_implementation.setdefault(record["implementation"], [0, 0])
        counts[0] += 1
        counts[1] += bool(record["flagged"])
    return {
        "runs": n,
        "flagged_runs": flagged,
        "rate": flagged / n,
        "interval_95": [low, high],
        "level": 0.05,
        "flags_per_audit": per_audit,
        "runs_and_flags_per_implementation": per_implementation,
        "call": "audit_implementation(implementation, seed_offset=s): default settings, one seed",
        "settings": {"per_step_runs_per_world": PER_STEP_SETTINGS.runs},
    }


def write_module(summary: dict[str, Any]) -> None:
    """Regenerate :mod:`dpcore.auditing.false_alarms` from the measurement."""
    measured = {k: summary[k] for k in ("runs", "flagged_runs", "rate", "interval_95", "level")}
    measured["commit"] = summary["provenance"].get("commit")
    atomic_write_text(
        MODULE,
        '"""The false-alarm rate of the default :func:`~dpcore.auditing.audit_implementation` '
        "call,\nmeasured on correct implementations (written by ``python -m "
        "audits.implementations.false_alarms``;\nnot typed by hand). ``MEASURED`` is None until "
        'it has been measured."""\n\nfrom __future__ import annotations\n\nfrom typing import '
        f"Any\n\nMEASURED: dict[str, Any] | None = {_literal(measured)}\n",
    )


def _literal(measured: dict[str, Any]) -> str:
    """The dict as formatted Python (one key per line, sorted, trailing commas: ruff's style)."""
    lines = [
        f"    {json.dumps(key)}: {'None' if value is None else json.dumps(value)},"
        for key, value in sorted(measured.items())
    ]
    return "{\n" + "\n".join(lines) + "\n}"


def main() -> None:
    """Command line: ``--runs N`` (default 200)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--executor", default=None, help="local, processes:N, dask, ray, slurm")
    arguments = parser.parse_args()
    summary = run(arguments.runs, executor=arguments.executor)
    print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=1))


if __name__ == "__main__":
    main()
