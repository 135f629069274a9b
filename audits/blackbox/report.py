"""``audits/results/blackbox.md``: the table of the saved rows, with the anchor beside ours."""

from __future__ import annotations

import json
from typing import Any

from audits import results_io
from audits.blackbox.audit import ANCHOR
from dpcore.atomic import atomic_write_text

__all__ = ["table", "write_report"]


def _route(row: dict[str, Any]) -> str:
    best = row["decision"]["best"]
    return " / ".join(best) if best else "none above 0"


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
        "One target record; N DP-SGD trainings per world (target in / out) on a 1,000-record",
        "MNIST subset; the attacker sees the final model's outputs on the target only. ε_lb",
        "holds at 95 % for all routes of a row together (Bonferroni); thresholds are chosen on",
        "half of the runs and the bound is computed on the other half.",
        "",
        "| setting | ε | sigma | runs / world | ε_lb (95 %) | ε_lb / ε | best score / route |"
        " Gaussian check | anchor ε_lb / ε | run time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        anchor = (
            f"{ANCHOR['ratio']:.2f}"
            if row["setting"] == rows[0]["setting"]
            and row["epsilon"] == ANCHOR["epsilon"]
            and row["setting"]["target"] in ("blank", "constant")
            and row["setting"]["init"] == "worst_case"
            else "-"
        )
        lines.append(
            f"| {row['setting_name']} | {row['epsilon']:g} | {row['noise_multiplier']:.3g} | "
            f"{row['runs_per_world']} | {row['epsilon_lower']:.3f} | {row['ratio']:.3f} | "
            f"{_route(row)} | {_gaussian_checks(row)} | {anchor} | {row['run_seconds']:.0f} |"
        )
    lines += [
        "",
        f"Anchor: {ANCHOR['source']}: ε_lb {ANCHOR['epsilon_lower']} at ε = "
        f"{ANCHOR['epsilon']:g} ({ANCHOR['ratio']}).",
    ]
    if meta is not None:
        hardware = meta.get("config", {}).get("hardware", {})
        lines += [
            "",
            f"Profile `{meta.get('config', {}).get('profile')}`, commit `{meta.get('commit')}`, "
            f"{hardware.get('cpu')} ({hardware.get('cpus')} CPUs), torch "
            f"{meta.get('config', {}).get('torch')}, created {meta.get('created')}.",
        ]
    return "\n".join(lines) + "\n"


def write_report() -> None:
    """Write ``results/blackbox.md`` from ``results/blackbox.json`` (and its provenance)."""
    rows = results_io.load("blackbox")
    meta_path = results_io.RESULTS / "blackbox.meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else None
    atomic_write_text(results_io.RESULTS / "blackbox.md", table(rows, meta))
