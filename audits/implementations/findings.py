"""The findings of the implementation audits, written from the saved results.

Every number in the block between ``<!-- implementation-findings:start -->`` and its end marker
(on the guide's Audits page) comes from ``audits/results/implementations*.json``: the setting
(from the saved config), what each correct implementation was flagged for, which test flagged
each planted bug in how many seeds, the tightness record and the default call's false-alarm
rate. The project README's front page quotes their headline (``<!-- audit-headline:start -->``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from audits.implementations.plain_torch import TEST_FOR_BUG
from audits.results_io import RESULTS, ROOT
from dpcore.runs.markers import write_between_markers

README = ROOT / "docs" / "guide" / "audits.md"  # the page that holds the findings
MARKERS = ("<!-- implementation-findings:start -->", "<!-- implementation-findings:end -->")
#: the front page, and the markers of the headline it quotes
FRONT_PAGE = ROOT / "README.md"
HEADLINE_MARKERS = ("<!-- audit-headline:start -->", "<!-- audit-headline:end -->")
PLANTED_PREFIX = "hand-written torch loop ("


def _load(stem: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((RESULTS / f"{stem}.json").read_text())
    return loaded


def _by_implementation(rows: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["implementation"], []).append(row)
    return grouped


def _p(value: float) -> str:
    return "p < 1e-300" if value == 0 else f"p = {value:.2g}"


def _flagging(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The audits that flag, by name (rows not applicable left out)."""
    return [
        f"`{row['audit']}`"
        for row in rows
        if row["verdict"] != "consistent" and "not_applicable" not in row
    ]


def _flags(rows: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"`{row['audit']}` ({_p(row['p_value'])})"
        for row in rows
        if row["verdict"] != "consistent" and "not_applicable" not in row
    ]


def setting(config: dict[str, Any]) -> str:
    """The audited setting, from the saved config of the table."""
    per_step, one_run = config["per_step"], config["one_run"]
    return (
        f"Setting: per-step and structural audits on the MLP task ({per_step['real_records']} "
        f"records plus the canary, {per_step['real_features']} features, {per_step['hidden']} "
        f"hidden units, {per_step['classes']} classes, {per_step['rare_records']} real record "
        f"of the rare class; q = {per_step['sampling_probability']}, T = {per_step['steps']}, "
        f"C = {per_step['max_grad_norm']}, σ calibrated to ε = {per_step['target_epsilon']:g}; "  # noqa: RUF001
        f"{per_step['runs']} runs per world and {per_step['tiny_runs']} runs on a "
        f"{per_step['tiny_records']}-record data set), one-run and sampler audits on the linear "
        f"task (σ calibrated to ε = {one_run['target_epsilon']:g}, T = {one_run['steps']}, "  # noqa: RUF001
        f"{one_run['one_run_canaries']} canaries). Correct implementations over "
        f"{config['seeds']} seeds, shuffled batches over {config['shuffled_seeds']}, planted "
        f"bugs over {config['bug_seeds']}, dpcore's data-parallel trainer over "
        f"{config['distributed_seeds']} ({config['distributed_per_step']['runs']} run per world; "
        f"its planted bug over {config['distributed_bug_seeds']}). Seeds combined by Fisher, "
        "each implementation's audits decided by Holm at 0.05."
    )


def libraries(rows: Sequence[dict[str, Any]]) -> str:
    """One line per library implementation: what it was flagged for, over how many seeds."""
    lines = []
    for name, group in _by_implementation(rows).items():
        flags = _flags(group)
        seeds = max(int(row.get("seeds", 0)) for row in group)
        said = "flagged by " + ", ".join(flags) if flags else "no flag"
        seen = {row.get("sampler_seen") for row in group if row.get("sampler_seen")}
        sampler = f"; lots seen: {', '.join(sorted(seen))}" if seen else ""
        lines.append(f"  - {name}: {said} over {seeds} seeds{sampler}")
    return "\n".join(lines)


def planted(rows: Sequence[dict[str, Any]]) -> str:
    """One line per planted bug: its test's verdict and seeds, and the other tests that flag."""
    lines = []
    for name, group in _by_implementation(rows).items():
        bug = name[len(PLANTED_PREFIX) : -1] if name.startswith(PLANTED_PREFIX) else ""
        by_audit = {row["audit"]: row for row in group}
        if bug in TEST_FOR_BUG:
            test = by_audit[TEST_FOR_BUG[bug]]
            mark = "flagged" if test["verdict"] != "consistent" else "**not flagged**"
            others = [f for f in _flags(group) if not f.startswith(f"`{test['audit']}`")]
            also = f"; also {', '.join(others)}" if others else ""
            lines.append(
                f"  - {bug}: {mark} by `{test['audit']}` ({_p(test['p_value'])}; "
                f"{test['flagged_seeds']} of {test['seeds']} seeds below 0.05){also}"
            )
        else:
            flags = _flags(group)
            said = "flagged by " + ", ".join(flags) if flags else "no flag"
            lines.append(f"  - {name}: {said} over {max(r['seeds'] for r in group)} seeds")
    return "\n".join(lines)


def tightness(record: dict[str, Any]) -> str:
    """The tightness record in one paragraph."""
    summary = record["summary"]
    step, threshold = summary["per_step_gdp"], summary["per_step_threshold"]
    fdp, steinke = summary["one_run_fdp"], summary["one_run_steinke"]
    return (
        f"Tightness (`python -m audits.implementations.tightness`, the hand-written loop, "
        f"{record['seeds']} seeds, {record.get('per_step_runs_per_world', '?')} runs per world): "
        f"per-step ε_lb by the Gaussian-scores GDP route {step['mean_ratio']:.2f} of the "
        f"certified ε {step['certified_epsilon']:.2f} on average "
        f"({step['min_ratio']:.2f}–{step['max_ratio']:.2f}; the held-out threshold route "  # noqa: RUF001
        f"{threshold['mean_ratio']:.2f}; not printed in {step['not_printed']} seeds, where the "
        f"correlation test rejected at 95 %); one run {fdp['mean_ratio']:.2f} of "
        f"{fdp['certified_epsilon']:.2f} with the f-DP bound of Mahloujifar, Melis, Chaudhuri "
        f"({fdp['min_ratio']:.2f}–{fdp['max_ratio']:.2f}) against {steinke['mean_ratio']:.2f} "  # noqa: RUF001
        f"with Steinke et al.'s. Seeds whose bound exceeds the certified ε (each bound holds at "
        f"95 %): per-step {step['exceedances']} (threshold route {threshold['exceedances']}), "
        f"one run {fdp['exceedances']} (Steinke et al. {steinke['exceedances']})."
    )


def _seeds(groups: Sequence[Sequence[dict[str, Any]]]) -> str:
    counts = sorted({max(int(row.get("seeds", 0)) for row in group) for group in groups})
    return f"{counts[0]} seeds each" if len(counts) == 1 else f"{counts[0]}–{counts[-1]} seeds"  # noqa: RUF001


def headline() -> str:
    """The implementation audits in two sentences, for the front page (the project README).

    Which library implementations no audit flags and which ones are flagged by which audits, and
    how many of the planted bugs their own test flags.
    """
    libraries = _by_implementation(_load("implementations")["rows"])
    clean = {name: group for name, group in libraries.items() if not _flagging(group)}
    flagged = [
        f"{name} by {', '.join(_flagging(group))}"
        for name, group in libraries.items()
        if _flagging(group)
    ]
    bugs = {
        name[len(PLANTED_PREFIX) : -1]: {row["audit"]: row for row in group}
        for name, group in _by_implementation(_load("implementations_planted")["rows"]).items()
        if name.startswith(PLANTED_PREFIX)
    }
    tested = [by_audit[TEST_FOR_BUG[bug]] for bug, by_audit in bugs.items() if bug in TEST_FOR_BUG]
    caught = [row for row in tested if row["verdict"] != "consistent"]
    said = f"No flag for {', '.join(clean)} over {_seeds(list(clean.values()))}"
    if flagged:
        said += f"; flagged: {'; '.join(flagged)}"
    return (
        f"{said}. {len(caught)} of {len(TEST_FOR_BUG)} bugs planted in a hand-written loop "
        f"flagged by their own test ({_seeds([[row] for row in tested])})."
    )


def markdown() -> str:
    """The findings block from the saved results."""
    table = _load("implementations")
    parts = [
        setting(table["provenance"]["config"]),
        "",
        "- Libraries and the data-parallel trainer (Holm at 0.05 over each one's audits):",
        libraries(table["rows"]),
        "- The hand-written loop and its planted bugs (each bug's own test first):",
        planted(_load("implementations_planted")["rows"]),
    ]
    if (RESULTS / "implementations_tightness.json").is_file():
        parts.append("- " + tightness(_load("implementations_tightness")))
    return "\n".join(parts)


def write_report() -> None:
    """Write the findings block into the Audits page and their headline into the README."""
    write_between_markers(README, *MARKERS, markdown())
    write_between_markers(FRONT_PAGE, *HEADLINE_MARKERS, headline())
