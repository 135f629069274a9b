"""The implementation audits: every adapter x every audit, over seeds; results and README table.

``python -m audits --only implementations`` (part of ``nox -s audit``) writes
``audits/results/implementations.json`` (``{"rows": [...]}``, one row per library
implementation and audit, seeds summarised), ``implementations_planted.json`` (the same for the
hand-written loop and its planted bugs), ``implementations_seeds.json`` (every seed's row) and
the README tables between their markers. Each (implementation, seed) is appended to a partial
file as it finishes, so a killed run resumes where it stopped.

Implementations: dpcore (Poisson lots), Opacus 1.6 with Poisson sampling and with its loader's
shuffled batches, TF Privacy 0.9 (``model.fit``), a hand-written torch loop, and the hand-written
loop with each planted bug (:mod:`audits.implementations.plain_torch`). The correct ones run
``seeds`` seeds (soundness: the exceedances must stay within what 95% allows); the planted bugs
``bug_seeds``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from audits.implementations.distributed_worker import NOISE_AVERAGED
from audits.implementations.dpcore_distributed import DpcoreDistributed
from audits.implementations.dpcore_torch import DpcoreTorch
from audits.implementations.opacus_adapter import Opacus
from audits.implementations.plain_torch import PLANTED_BUGS, PlainTorchDpSgd
from audits.implementations.tf_privacy import TfPrivacy
from audits.results_io import RESULTS, ROOT
from dpcore.auditing.implementation import Implementation
from dpcore.auditing.implementation_audits import (
    ONE_RUN_SETTINGS,
    AuditSettings,
    audit_seed,
    summarise,
)
from dpcore.provenance import provenance
from reproductions.common import write_between_markers

README = ROOT / "README.md"
MARKERS = ("<!-- implementation-audits:start -->", "<!-- implementation-audits:end -->")
PLANTED_MARKERS = ("<!-- planted-bug-audits:start -->", "<!-- planted-bug-audits:end -->")
#: the libraries' rows (``implementations.json``) start with these; the hand-written loop and
#: every planted bug go to ``implementations_planted.json``
LIBRARIES = ("dpcore", "opacus", "tf_privacy")


@dataclasses.dataclass(frozen=True)
class ImplementationsConfig:
    """Settings of the implementation audits (sigma calibrated to each target epsilon by PLD)."""

    per_step: AuditSettings = dataclasses.field(
        default_factory=lambda: AuditSettings(steps=50, runs=20)
    )
    one_run: AuditSettings = ONE_RUN_SETTINGS
    seeds: int = 20
    bug_seeds: int = 3
    #: dpcore's data-parallel trainer runs every task in 2 spawned processes (about 5 s each),
    #: so it gets fewer runs per world and seeds
    distributed_per_step: AuditSettings = dataclasses.field(
        default_factory=lambda: AuditSettings(steps=50, runs=10)
    )
    distributed_seeds: int = 2


def is_planted(implementation: Implementation) -> bool:
    """The hand-written loop (correct or not) and every implementation with a planted bug."""
    return isinstance(implementation, PlainTorchDpSgd) or bool(getattr(implementation, "bug", ""))


def implementations() -> list[tuple[Implementation, str]]:
    """(implementation, kind): kind is "correct", "bug" or "distributed"."""
    correct: list[Implementation] = [
        DpcoreTorch(),
        Opacus(poisson_sampling=True),
        Opacus(poisson_sampling=False),
        TfPrivacy(),
        PlainTorchDpSgd(),
    ]
    distributed: list[Implementation] = [DpcoreDistributed(), DpcoreDistributed(bug=NOISE_AVERAGED)]
    return (
        [(i, "correct") for i in correct]
        + [(PlainTorchDpSgd(b), "bug") for b in PLANTED_BUGS]
        + [(i, "distributed") for i in distributed]
    )


def _partial() -> Path:
    return RESULTS / "implementations.partial.jsonl"


def _done() -> dict[tuple[str, int], list[dict[str, Any]]]:
    done: dict[tuple[str, int], list[dict[str, Any]]] = {}
    if _partial().is_file():
        for line in _partial().read_text().splitlines():
            record = json.loads(line)
            done[(record["implementation"], record["seed"])] = record["rows"]
    return done


def _progress(total: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - progress extra missing
        return lambda items: items
    return lambda items: tqdm(items, total=total, desc="implementation audits")


def run(config: ImplementationsConfig = ImplementationsConfig()) -> list[dict[str, Any]]:
    """Run (or resume) every audit; save the seed rows, the summary and the README table."""
    import torch

    RESULTS.mkdir(parents=True, exist_ok=True)
    done = _done()
    seeds = {
        "correct": config.seeds,
        "bug": config.bug_seeds,
        "distributed": config.distributed_seeds,
    }
    per_step = {"distributed": config.distributed_per_step}
    plan = [
        (implementation, seed, per_step.get(kind, config.per_step))
        for implementation, kind in implementations()
        for seed in range(seeds[kind])
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny lots: intra-op threads only contend
    try:
        for implementation, seed, settings in _progress(len(plan))(iter(plan)):
            if (implementation.name, seed) in done:
                continue
            rows = audit_seed(implementation, per_step=settings, one_run=config.one_run, seed=seed)
            with _partial().open("a") as stream:
                record = {"implementation": implementation.name, "seed": seed, "rows": rows}
                stream.write(json.dumps(record, allow_nan=False) + "\n")
            done[(implementation.name, seed)] = rows
    finally:
        torch.set_num_threads(threads)
        for implementation, _ in implementations():
            close = getattr(implementation, "close", None)
            if close is not None:
                close()
    order = [(impl.name, seed) for impl, seed, _ in plan]
    every = [row for key in sorted(done, key=order.index) for row in done[key]]
    summary = save(every, config)
    _partial().unlink(missing_ok=True)
    return summary


def save(every: list[dict[str, Any]], config: ImplementationsConfig) -> list[dict[str, Any]]:
    """Write every seed's rows and their summary (with provenance); return the summary."""
    summary = summarise(every)
    (RESULTS / "implementations_seeds.json").write_text(
        json.dumps({"rows": every}, indent=1, allow_nan=False) + "\n"
    )
    meta = provenance(root=ROOT, audit="implementations", config=dataclasses.asdict(config))
    planted_names = {impl.name for impl, _ in implementations() if is_planted(impl)}
    libraries = [row for row in summary if row["implementation"] not in planted_names]
    planted = [row for row in summary if row["implementation"] in planted_names]
    for stem, rows in (("implementations", libraries), ("implementations_planted", planted)):
        (RESULTS / f"{stem}.json").write_text(
            json.dumps({"rows": rows, "provenance": meta}, indent=1, allow_nan=False) + "\n"
        )
    return summary


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table from the saved summary rows."""
    lines = [
        "| implementation | audit | claimed ε (theirs) | certified ε (dpcore) "
        "| ε_lb (95 %, seed 0) "
        "| flagged seeds | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        detail = ""
        p_value = row.get("combined_p_value")
        if p_value is None:
            p_value = row.get("p_value")
        shown = "p < 1e-300" if p_value == 0 else f"p = {p_value or 0:.2g}"
        if row["audit"] == "sampler" and p_value is not None:
            detail = f" ({shown}"
            if "shuffled_epsilon_lower_bound" in row:
                detail += f"; shuffled batches cost ε ≥ {row['shuffled_epsilon_lower_bound']:.2f}"
            detail += ")"
        elif row["audit"] == "noise_calibration" and p_value is not None:
            ratio = row["noise_std_ratio"]
            detail = f" ({shown}; noise / σC = {ratio:.2f} in seed 0)"  # noqa: RUF001
        flagged = f"{row['flagged_seeds']} / {row['seeds']}" if "flagged_seeds" in row else "—"
        lines.append(
            f"| {row['implementation']} | {row['audit']} | {_number(row['claimed_epsilon'])} "
            f"| {_number(row['certified_epsilon'])} | {_number(row['epsilon_lower'])} "
            f"| {flagged} | {row['verdict']}{detail} |"
        )
    return "\n".join(lines)


def load(stem: str) -> list[dict[str, Any]]:
    """The saved summary rows of ``implementations`` or ``implementations_planted``."""
    rows: list[dict[str, Any]] = json.loads((RESULTS / f"{stem}.json").read_text())["rows"]
    return rows


def write_report() -> None:
    """``results/implementations.md`` and the README tables, from the saved summaries."""
    libraries = markdown(load("implementations"))
    planted = markdown(load("implementations_planted"))
    (RESULTS / "implementations.md").write_text(
        "# Audits of DP-SGD implementations\n\n"
        + libraries
        + "\n\n## A hand-written loop and its planted bugs\n\n"
        + planted
        + "\n"
    )
    write_between_markers(README, *MARKERS, libraries)
    write_between_markers(README, *PLANTED_MARKERS, planted)
