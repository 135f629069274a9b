"""The false-alarm rate of the default ``audit_implementation`` call, measured on correct loops.

``python -m audits.implementations.false_alarms [--runs N]`` runs the default call (one seed,
Holm at 0.05 over all its audits) on the correct implementations, one seed offset per run, and
counts the runs with any flag. Each finished run is appended to
``audits/results/implementations_false_alarms.partial.jsonl``, so a killed run resumes where it
stopped; at the end it writes ``audits/results/implementations_false_alarms.json`` and
regenerates :mod:`dpcore.auditing.false_alarms` (the rate every report prints beside its
verdicts). Run it with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
from typing import Any

from scipy import stats

from audits.implementations.dpcore_torch import DpcoreTorch
from audits.implementations.opacus_adapter import Opacus
from audits.implementations.plain_torch import PlainTorchDpSgd
from audits.results_io import RESULTS, ROOT
from dpcore.auditing import audit_implementation
from dpcore.auditing.implementation import Implementation
from dpcore.provenance import provenance

PARTIAL = RESULTS / "implementations_false_alarms.partial.jsonl"
OUTPUT = RESULTS / "implementations_false_alarms.json"
MODULE = ROOT / "dpcore" / "auditing" / "false_alarms.py"
#: (implementation, share of the runs): the hand-written loop is the cheapest
MIX: tuple[tuple[Implementation, float], ...] = (
    (PlainTorchDpSgd(), 0.6),
    (DpcoreTorch(), 0.2),
    (Opacus(poisson_sampling=True), 0.2),
)


def plan(runs: int) -> list[tuple[Implementation, int]]:
    """(implementation, seed offset) of every run, interleaved so that a partial run is mixed."""
    counts = [math.floor(share * runs) for _, share in MIX]
    counts[0] += runs - sum(counts)
    out: list[tuple[Implementation, int]] = []
    for index in range(max(counts)):
        for (implementation, _), count in zip(MIX, counts, strict=True):
            if index < count:
                out.append((implementation, 10_000 + index))
    return out


def _done() -> dict[tuple[str, int], dict[str, Any]]:
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if PARTIAL.is_file():
        for line in PARTIAL.read_text().splitlines():
            record = json.loads(line)
            done[(record["implementation"], record["seed"])] = record
    return done


def run(runs: int = 200) -> dict[str, Any]:
    """Run (or resume) the measurement; write the results and the module; return the summary."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    done = _done()
    for implementation, seed in plan(runs):
        if (implementation.name, seed) in done:
            continue
        report = audit_implementation(implementation, seed_offset=seed)
        record = {
            "implementation": implementation.name,
            "seed": seed,
            "flagged": [row["audit"] for row in report if row["verdict"] != "consistent"],
            "p_values": {row["audit"]: row["p_value"] for row in report},
            "epsilon_lower": {
                row["audit"]: row["epsilon_lower"]
                for row in report
                if row["epsilon_lower"] is not None
            },
            "certified_epsilon": {row["audit"]: row["certified_epsilon"] for row in report},
        }
        with PARTIAL.open("a") as stream:
            stream.write(json.dumps(record, allow_nan=False) + "\n")
        done[(implementation.name, seed)] = record
        print(f"{len(done)}/{runs} {implementation.name} seed {seed}: {record['flagged']}")
    summary = summarise([done[(i.name, s)] for i, s in plan(runs)])
    summary["provenance"] = provenance(root=ROOT, audit="implementation false alarms")
    OUTPUT.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
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
    }


def write_module(summary: dict[str, Any]) -> None:
    """Regenerate :mod:`dpcore.auditing.false_alarms` from the measurement."""
    measured = {k: summary[k] for k in ("runs", "flagged_runs", "rate", "interval_95", "level")}
    measured["commit"] = summary["provenance"].get("commit")
    MODULE.write_text(
        '"""The false-alarm rate of the default :func:`~dpcore.auditing.audit_implementation` '
        "call,\nmeasured on correct implementations (written by ``python -m "
        "audits.implementations.false_alarms``;\nnot typed by hand). ``MEASURED`` is None until "
        'it has been measured."""\n\nfrom __future__ import annotations\n\nfrom typing import '
        f"Any\n\nMEASURED: dict[str, Any] | None = {pprint.pformat(measured, width=90)}\n"
    )


def main() -> None:
    """Command line: ``--runs N`` (default 200)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    summary = run(parser.parse_args().runs)
    print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=1))


if __name__ == "__main__":
    main()
