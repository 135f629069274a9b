"""The implementation audits: every adapter x every audit, over seeds; results and their tables.

``python -m audits --only implementations`` (part of ``nox -s audit``) writes
``audits/results/implementations.json`` (``{"rows": [...]}``, one row per library
implementation and audit, seeds summarised), ``implementations_planted.json`` (the same for the
hand-written loop and its planted bugs), ``implementations_seeds.json`` (every seed's row) and
the tables between their markers on the guide's Audits page (``docs/guide/audits.md``). Each
(implementation, seed) is one run of :mod:`audits.implementations.seed_runs`, kept in the
audits' run store as it finishes, so a killed run resumes where it stopped, and ``--executor``
fans the runs out.

Implementations: dpcore (Poisson lots), Opacus 1.6 with Poisson sampling and with its loader's
shuffled batches, TF Privacy 0.9 (``model.fit``; skipped, and said so, where its environment is
missing), dpcore's data-parallel trainer, a hand-written torch loop, and the hand-written loop
with each planted bug (:mod:`audits.implementations.plain_torch`). Every audit runs at the
default settings of :func:`dpcore.auditing.audit_implementation` (per-step and structural
audits on the MLP task); the correct ones over ``seeds`` seeds, the planted bugs over
``bug_seeds``. Each implementation's audits are decided together: seeds combined by Fisher,
audits by Holm at 0.05.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from audits.implementations import findings
from audits.implementations.distributed_worker import NOISE_AVERAGED
from audits.implementations.dpcore_distributed import DpcoreDistributed
from audits.implementations.opacus_adapter import Opacus
from audits.implementations.plain_torch import PLANTED_BUGS, PlainTorchDpSgd
from audits.implementations.seed_runs import SeedRun, run_seeds
from audits.implementations.tf_privacy import TfPrivacy, python
from audits.results_io import RESULTS, ROOT
from dpcore.auditing.dpcore_torch import DpcoreTorch
from dpcore.auditing.implementation import Implementation
from dpcore.auditing.implementation_audits import (
    ONE_RUN_SETTINGS,
    PER_STEP_SETTINGS,
    AuditSettings,
)
from dpcore.auditing.verdicts import summarise
from dpcore.provenance import provenance
from dpcore.runs.markers import write_between_markers

README = ROOT / "docs" / "guide" / "audits.md"  # the page that holds the tables
MARKERS = ("<!-- implementation-audits:start -->", "<!-- implementation-audits:end -->")
PLANTED_MARKERS = ("<!-- planted-bug-audits:start -->", "<!-- planted-bug-audits:end -->")
#: the libraries' rows (``implementations.json``) start with these; the hand-written loop and
#: every planted bug go to ``implementations_planted.json``
LIBRARIES = ("dpcore", "opacus", "tf_privacy")
#: the family-wise level of each implementation's decisions
LEVEL = 0.05


@dataclasses.dataclass(frozen=True)
class ImplementationsConfig:
    """Settings of the implementation audits (sigma calibrated to each target epsilon by PLD)."""

    per_step: AuditSettings = PER_STEP_SETTINGS
    one_run: AuditSettings = ONE_RUN_SETTINGS
    #: every correct implementation over 20 seeds; the default call's 200-run false-alarm
    #: measurement (``false_alarms.py``) reuses these runs and adds seeds of its own
    seeds: int = 20
    #: Opacus' and TF Privacy's shuffled batches, accounted as Poisson lots: the sampler audits
    #: flag every seed, so 5 seeds show what they must
    shuffled_seeds: int = 5
    bug_seeds: int = 5
    #: dpcore's data-parallel trainer runs every task in 2 spawned processes (several seconds
    #: each), so it gets fewer runs per world
    distributed_per_step: AuditSettings = dataclasses.field(
        default_factory=lambda: AuditSettings(runs=1, tiny_runs=1)
    )
    distributed_seeds: int = 20
    distributed_bug_seeds: int = 5


def is_planted(implementation: Implementation) -> bool:
    """The hand-written loop (correct or not) and every implementation with a planted bug."""
    return isinstance(implementation, PlainTorchDpSgd) or bool(getattr(implementation, "bug", ""))


def tf_privacy_available() -> bool:
    """Whether TF Privacy's own environment exists (``nox -s audit`` makes it)."""
    return python().exists()


def implementations() -> list[tuple[Implementation, str]]:
    """(implementation, kind): kind is "correct", "shuffled" (correct code whose claim assumes
    Poisson lots it does not draw), "bug", "distributed" or "distributed bug"."""
    libraries: list[tuple[Implementation, str]] = [
        (DpcoreTorch(), "correct"),
        (Opacus(poisson_sampling=True), "correct"),
        (Opacus(poisson_sampling=False), "shuffled"),
    ]
    if tf_privacy_available():
        libraries.append((TfPrivacy(), "shuffled"))
    libraries.append((PlainTorchDpSgd(), "correct"))
    return (
        libraries
        + [(PlainTorchDpSgd(b), "bug") for b in PLANTED_BUGS]
        + [(DpcoreDistributed(), "distributed")]
        + [(DpcoreDistributed(bug=NOISE_AVERAGED), "distributed bug")]
    )


def plan(config: ImplementationsConfig = ImplementationsConfig()) -> list[SeedRun]:
    """Every (implementation, seed, settings) the table needs, in table order."""
    seeds = {
        "correct": config.seeds,
        "shuffled": config.shuffled_seeds,
        "bug": config.bug_seeds,
        "distributed": config.distributed_seeds,
        "distributed bug": config.distributed_bug_seeds,
    }
    per_step = {
        "distributed": config.distributed_per_step,
        "distributed bug": config.distributed_per_step,
    }
    return [
        SeedRun(implementation.name, seed, per_step.get(kind, config.per_step), config.one_run)
        for implementation, kind in implementations()
        for seed in range(seeds[kind])
    ]


def run(
    config: ImplementationsConfig = ImplementationsConfig(), *, executor: Any = None
) -> list[dict[str, Any]]:
    """Run (or resume, from the run store) every audit; save the seed rows and the summary.

    ``executor`` fans the (implementation, seed) runs out (:func:`dpcore.runs.run_many`'s
    choices); the results do not depend on it.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    every = [row for rows in run_seeds(plan(config), executor=executor) for row in rows]
    return save(every, config)


def save(every: list[dict[str, Any]], config: ImplementationsConfig) -> list[dict[str, Any]]:
    """Write every seed's rows and their summary (with provenance); return the summary."""
    summary = summarise(every, LEVEL, false_alarms())
    (RESULTS / "implementations_seeds.json").write_text(
        json.dumps({"rows": every}, indent=1, allow_nan=False) + "\n"
    )
    meta = provenance(
        root=ROOT,
        audit="implementations",
        config=dataclasses.asdict(config),
        tf_privacy="ran" if tf_privacy_available() else "not run: no TF Privacy environment",
    )
    planted_names = {impl.name for impl, _ in implementations() if is_planted(impl)}
    libraries = [row for row in summary if row["implementation"] not in planted_names]
    planted = [row for row in summary if row["implementation"] in planted_names]
    for stem, rows in (("implementations", libraries), ("implementations_planted", planted)):
        (RESULTS / f"{stem}.json").write_text(
            json.dumps({"rows": rows, "provenance": meta}, indent=1, allow_nan=False) + "\n"
        )
    return summary


def false_alarms() -> dict[str, Any] | None:
    """The measured false-alarm rate of the default call (None before it is measured)."""
    path = RESULTS / "implementations_false_alarms.json"
    if not path.is_file():
        return None
    measured: dict[str, Any] = json.loads(path.read_text())
    return measured


def false_alarm_line() -> str:
    """The README's sentence on the default call's measured false-alarm rate."""
    measured = false_alarms()
    if measured is None:
        return "False alarms of the default call: not measured yet."
    low, high = measured["interval_95"]
    return (
        "False alarms of the default call (`audit_implementation(implementation)`: one seed, "
        f"every audit, Holm at {measured['level']}) on correct implementations: "
        f"{measured['flagged_runs']} of {measured['runs']} runs flagged "
        f"({100 * measured['rate']:.1f} %, exact 95 % interval "
        f"[{100 * low:.1f}, {100 * high:.1f}] %; "
        "`audits/results/implementations_false_alarms.json`)."
    )


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return "< 1e-300" if value == 0 else f"{value:.2g}"


def _detail(row: dict[str, Any]) -> str:
    audit = row["audit"]
    parts: list[str] = []
    if row.get("sampler_seen"):
        parts.append(f"saw {row['sampler_seen']}")
    if "shuffled_epsilon_lower_bound" in row:
        parts.append(f"shuffled batches cost ε ≥ {row['shuffled_epsilon_lower_bound']:.2f}")
    if audit in ("noise_calibration", "empty_lots") and row.get("noise_std_ratio") is not None:
        parts.append(f"noise / σC = {row['noise_std_ratio']:.2f}")  # noqa: RUF001
    if audit == "noise_per_tensor" and row.get("parts"):
        worst = min(row["parts"].items(), key=lambda item: item[1]["p_value"])
        parts.append(f"{worst[0]}: noise / σC = {worst[1]['noise_std_ratio']:.2f}")  # noqa: RUF001
    if audit == "canary_per_tensor" and row.get("tensors"):
        ratios = ", ".join(
            f"{name} {value['read_over_expected']:.2f}" for name, value in row["tensors"].items()
        )
        parts.append(f"read / exact: {ratios}")
    if audit == "noise_correlation" and row.get("lag1_correlation") is not None:
        parts.append(f"lag-1 correlation {row['lag1_correlation']:.2f}")
    if row.get("epsilon_lower_fdp") is not None:
        parts.append(f"f-DP (GDP) one-run ε_lb {row['epsilon_lower_fdp']:.2f}")
    if row.get("epsilon_lower_threshold") is not None:
        parts.append(f"threshold route ε_lb {row['epsilon_lower_threshold']:.2f}")
    if row.get("bound_note"):
        parts.append(row["bound_note"])
    return f" ({'; '.join(parts)})" if parts else ""


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table from the saved summary rows."""
    lines = [
        "| implementation | audit | claimed ε (theirs) | certified ε (dpcore) "
        "| ε_lb (95 %, seed 0) | p (seeds combined) | seeds p < 0.05 | verdict (Holm, 0.05) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        flagged = f"{row['flagged_seeds']} / {row['seeds']}" if "flagged_seeds" in row else "—"
        lines.append(
            f"| {row['implementation']} | {row['audit']} | {_number(row['claimed_epsilon'])} "
            f"| {_number(row['certified_epsilon'])} | {_number(row['epsilon_lower'])} "
            f"| {_p(row.get('p_value'))} | {flagged} | {row['verdict']}{_detail(row)} |"
        )
    return "\n".join(lines)


def load(stem: str) -> list[dict[str, Any]]:
    """The saved summary rows of ``implementations`` or ``implementations_planted``."""
    rows: list[dict[str, Any]] = json.loads((RESULTS / f"{stem}.json").read_text())["rows"]
    return rows


def load_config() -> dict[str, Any]:
    """The config the saved table was run with."""
    config: dict[str, Any] = json.loads((RESULTS / "implementations.json").read_text())[
        "provenance"
    ]["config"]
    return config


def write_report() -> None:
    """``results/implementations.md`` and the README tables, from the saved summaries."""
    libraries = markdown(load("implementations"))
    planted = markdown(load("implementations_planted"))
    (RESULTS / "implementations.md").write_text(
        "# Audits of DP-SGD implementations\n\n"
        + libraries
        + "\n\n"
        + false_alarm_line()
        + "\n\n## A hand-written loop and its planted bugs\n\n"
        + planted
        + "\n"
    )
    write_between_markers(README, *MARKERS, libraries + "\n\n" + false_alarm_line())
    write_between_markers(README, *PLANTED_MARKERS, planted)
    findings.write_report()
