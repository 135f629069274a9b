"""``audits/results/blackbox.md``: the table of the saved rows, with the anchor beside ours."""

from __future__ import annotations

from typing import Any

from audits import results_io
from audits.blackbox.audit import ANCHOR, results_name
from audits.blackbox.profiles import PROFILES
from audits.blackbox.selection import other_commits
from dpcore.atomic import atomic_write_text

__all__ = ["OLD_ROWS", "table", "write_report"]

#: Said under a table with rows from before the public divisor (their settings have no
#: ``implementation`` field: they were made by the code that preceded both).
OLD_ROWS = (
    "dpcore*: measured before the public divisor: the runs divided the noisy sum by q times the"
    ' training set\'s own size, 1,001 in the "in" world and 1,000 in the "out" world; such rows'
    " are replaced when their profile is run again."
)


def _by_route(row: dict[str, Any], route: str) -> str:
    """The best bound of ``route`` over the scores (at the row's Bonferroni level)."""
    entries = [routes[route] for routes in row["decision"]["scores"].values() if route in routes]
    if not entries:
        return "not run"
    values = [entry["epsilon_lower"] for entry in entries if entry["reported"]]
    return f"{max(values):.3f}" if values else "check failed"


def _gaussian_checks(row: dict[str, Any]) -> str:
    checks = []
    for name, routes in sorted(row["decision"]["scores"].items()):
        entry = routes.get("gaussian")
        if entry is None:
            continue
        checks.append(f"{name}: {'passed' if entry.get('passed') else 'failed'}")
    return ", ".join(checks) if checks else "not run (q < 1)"


def table(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> str:
    """The markdown report of ``rows`` (and of their provenance ``meta``, when given)."""
    lines = [
        "# Black-box membership inference of the final model (multi-run)",
        "",
        "One target record; N DP-SGD trainings per world (target in / out) on a fixed MNIST",
        "training set (the records column: a 1,000-record subset, or all 60,000); the attacker",
        "sees the final model's outputs on the target only. Every training divides its noisy",
        "sum by the same public constant in both worlds (q times the records without the",
        "target). Implementation: dpcore's DPTrainer.dp_sgd, or Opacus 1.6's PrivacyEngine on",
        "the same run (initial parameters, sigma, clipping norm, divisor). ε_lb",
        "holds at 95 % for all routes of a row together (Bonferroni); thresholds are chosen on",
        "half of the runs and the bound is computed on the other half. ε_lb is the largest of",
        "the three routes' bounds (each the best over the loss and the logit margin):",
        "Clopper-Pearson holds for any (ε, δ)-DP training; the GDP threshold route assumes",
        "mu-GDP, which full-batch DP-SGD is by construction; the Gaussian-scores route also",
        "assumes Gaussian scores with one variance, checked on the selection half",
        "(Shapiro-Wilk, Levene). sigma: the noise multiplier dpcore's PLD calibration gives ε",
        "at δ = 1e-5; run time: the trainings' seconds, one thread each.",
        "",
        "| setting | model | implementation | records | ε | sigma | runs / world | ε_lb (95 %) |"
        " ε_lb / ε | Clopper-Pearson | GDP (threshold) | Gaussian scores | Gaussian check |"
        " anchor ε_lb / ε | run time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        setting = row["setting"]
        anchor = (
            f"{ANCHOR['ratio']:.2f}"
            if row["setting"] == rows[0]["setting"]
            and row["epsilon"] == ANCHOR["epsilon"]
            and row["setting"]["target"] in ("blank", "constant")
            and row["setting"]["init"] == "worst_case"
            else "-"
        )
        lines.append(
            f"| {row['setting_name']} | {setting['model']} | "
            f"{setting.get('implementation', 'dpcore*')} | {setting['subset_size']:,} | "
            f"{row['epsilon']:g} | {row['noise_multiplier']:.3g} | "
            f"{row['runs_per_world']} | {row['epsilon_lower']:.3f} | {row['ratio']:.3f} | "
            f"{_by_route(row, 'clopper_pearson')} | {_by_route(row, 'gdp')} | "
            f"{_by_route(row, 'gaussian')} | {_gaussian_checks(row)} | {anchor} | "
            f"{row['run_seconds']:.0f} |"
        )
    lines += [
        "",
        f"Anchor: {ANCHOR['source']}: ε_lb {ANCHOR['epsilon_lower']} at ε = "
        f"{ANCHOR['epsilon']:g} ({ANCHOR['ratio']}).",
    ]
    if any("implementation" not in row["setting"] for row in rows):
        lines += ["", OLD_ROWS]
    if meta is not None:
        opacus = meta.get("config", {}).get("opacus", "not recorded")
        lines += ["", results_io.provenance_line(meta, f"Opacus {opacus}")]
        lines += other_commits(rows, meta)
    return "\n".join(lines) + "\n"


def soundness_text(record: dict[str, Any]) -> str:
    """The paragraph of a soundness record (:mod:`audits.blackbox.soundness`)."""
    name = record["setting"]["name"]
    worst = max(
        b / c for b, c in zip(record["epsilon_lower"], record["certified_epsilon"], strict=True)
    )
    return (
        f"Soundness: {name} at ε = {record['epsilon']:g} over {record['seeds']} seeds (each its "
        f"own subset, pre-training records, initial parameters and runs; "
        f"{record['runs_per_world']} runs per world): ε_lb exceeded the certified ε in "
        f"{record['exceedances']} of {record['seeds']} (a sound audit: at most 5 % in "
        f"expectation; P[Binomial({record['seeds']}, 0.05) >= {record['exceedances']}] = "
        f"{record['p_value']:.3g}); the largest ε_lb / certified ε was {worst:.3f}.\n"
    )


def write_report(name: str | None = None) -> None:
    """Write ``results/<name>.md`` from ``results/<name>.json`` (and its provenance), with the
    soundness record (``results/blackbox_soundness.json``) under the full profile's table.

    Args:
        name: a results stem (:func:`~audits.blackbox.audit.results_name`); None: every
            profile's whose results exist.
    """
    names = [name] if name is not None else [results_name(p) for p in PROFILES]
    for stem, rows, meta in results_io.stored(names, every=name is None):
        text = table(rows, meta)
        soundness = results_io.RESULTS / "blackbox_soundness.json"
        if stem == results_name("full") and soundness.exists():
            text += "\n" + soundness_text(results_io.load("blackbox_soundness")[0])
        atomic_write_text(results_io.RESULTS / f"{stem}.md", text)
