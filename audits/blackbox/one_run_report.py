"""``audits/results/blackbox_one_run*.md``: the one-run audit's table, generated from its JSON.

One line per (canary setting, claim): the audit of run seed 0 (m, guesses, right guesses, both
bounds, the ratio of the larger to the claim, the training's seconds), then what the other run
seeds of the profile gave (each its own audit, with its own bits and noise): the median bounds
and how many runs put a bound above the claim; and the median bounds of the *ideal game* at
the same m, k and mechanism (:func:`ideal_game`), the reference a black-box auditor is
measured against.
"""

from __future__ import annotations

import functools
import math
import textwrap
from typing import Any

import numpy as np

from audits import results_io
from audits.blackbox.one_run import ANCHORS, PROFILES, decide, results_name
from audits.blackbox.selection import other_commits
from dpcore.atomic import atomic_write_text

__all__ = ["best_bound", "ideal_game", "table", "write_report"]

#: Simulated games per ideal-game median.
IDEAL_GAMES = 50


#: The paragraph above the table (what the columns mean).
EXPLANATION = (
    "One DP-SGD training (dpcore's, or Opacus 1.6's where the setting says so) on a "
    "1,000-record MNIST subset (all 60,000 training records where the setting says so) plus"
    " m canaries, each included with probability 1/2; the auditor sees the final model's "
    "logits on the canaries only, scores each by the gain of its logit margin over the "
    "initial model's, guesses 'in' for the k highest and 'out' for the k lowest (k fixed in"
    " advance) and bounds ε from the right guesses: Thm 5.2 of Steinke, Nasr, Jagielski "
    "2023 (any (ε, δ)-DP training) and the f-DP one-run bound of Mahloujifar, Melis, "
    "Chaudhuri 2025 for Gaussian DP (full batch only, where DP-SGD is μ-GDP by "
    "construction). With both, each is at 97.5 % (Bonferroni, 95 % together); with q < 1, "
    "Thm 5.2 alone at 95 %. ε_lb / ε uses the larger bound. Columns up to 'run time' are "
    "the audit of run seed 0; the last three summarise the profile's run seeds (each an "
    "audit of its own, with its own bits and noise). Ideal game: the median bounds at the "
    "same m, k, q, T and sigma when each canary's score is b Bin(T, q) + N(0, T sigma²) (b "
    "its bit: non-interfering canaries read white-box; with full batch, N(μ b, 1) scaled, μ"
    " = sqrt(T) / sigma)."
)


def best_bound(row: dict[str, Any]) -> float:
    """The larger of a row's bounds (both hold together at the row's confidence)."""
    gdp = row["epsilon_lower_gdp"]
    return max(float(row["epsilon_lower_steinke"]), float(gdp) if gdp is not None else 0.0)


@functools.cache
def ideal_game(
    canaries: int,
    guesses_each_side: int,
    steps: int,
    sampling_probability: float,
    noise_multiplier: float,
    delta: float,
) -> tuple[float, float | None]:
    """Median (Thm 5.2, GDP route) bounds of the one-run game with ideal canaries.

    A canary whose clipped gradient keeps norm C and one direction, orthogonal to every other
    record's, is seen by a white-box auditor as the sum over the T steps of its part in the
    noised sums: b Bin(T, q) + N(0, T sigma^2) in units of C (b its bit; audits/one_run.py's
    game). With full batch this is b T + N(0, T sigma^2), i.e. N(mu b, 1) scaled, with
    mu = sqrt(T) / sigma, the optimal score for one canary of a mu-GDP training. The median
    over :data:`IDEAL_GAMES` seeded games of the bounds :func:`~audits.blackbox.one_run.decide`
    gives on such scores (the GDP route only with full batch, as in the audit) is what the
    audit could reach at this m and k if its canaries neither interfered nor lost signal
    through the final model's outputs.
    """
    rng = np.random.default_rng(0)
    full_batch = sampling_probability == 1
    bounds = []
    for _ in range(IDEAL_GAMES):
        included = rng.random(canaries) < 0.5
        drawn = steps if full_batch else rng.binomial(steps, sampling_probability, canaries)
        noise = rng.normal(scale=math.sqrt(steps) * noise_multiplier, size=canaries)
        row = decide(
            included * drawn + noise,
            included.astype(int),
            guesses_each_side=guesses_each_side,
            delta=delta,
            gdp=full_batch,
        )
        bounds.append((row["epsilon_lower_steinke"], row["epsilon_lower_gdp"] or 0.0))
    steinke, gdp = np.median(bounds, axis=0)
    return float(steinke), float(gdp) if full_batch else None


def _ideal(row: dict[str, Any]) -> str:
    base = row["setting"]["base"]
    steinke, gdp = ideal_game(
        row["canaries"],
        row["guesses"] // 2,
        base["steps"],
        base["sampling_probability"],
        row["noise_multiplier"],
        row["delta"],
    )
    return f"{steinke:.2f} / {'-' if gdp is None else f'{gdp:.2f}'}"


def _gdp(value: float | None) -> str:
    return "not run (q < 1)" if value is None else f"{value:.3f}"


def table(rows: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> str:
    """The markdown report of ``rows`` (and of their provenance ``meta``, when given)."""
    lines = [
        "# One-run black-box membership audit with designed canaries",
        "",
        *textwrap.wrap(EXPLANATION, 92),
        "",
        "| canaries | ε | sigma | m | k (each side) | right guesses | ε_lb Thm 5.2 |"
        " ε_lb GDP route | ε_lb / ε | run time (s) | seeds | median ε_lb Thm 5.2 / GDP |"
        " seeds with ε_lb > ε | ideal game median Thm 5.2 / GDP |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["setting_name"], row["epsilon"]), []).append(row)
    for (name, epsilon), group in cells.items():
        group = sorted(group, key=lambda row: row["seed"])
        first = group[0]
        steinke = float(np.median([row["epsilon_lower_steinke"] for row in group]))
        gdps = [row["epsilon_lower_gdp"] for row in group if row["epsilon_lower_gdp"] is not None]
        median_gdp = f"{float(np.median(gdps)):.2f}" if gdps else "-"
        over = sum(best_bound(row) > epsilon for row in group)
        lines.append(
            f"| {name} | {epsilon:g} | {first['noise_multiplier']:.3g} | {first['canaries']} | "
            f"{first['guesses'] // 2} | {first['correct']} / {first['guesses']} | "
            f"{first['epsilon_lower_steinke']:.3f} | {_gdp(first['epsilon_lower_gdp'])} | "
            f"{best_bound(first) / epsilon:.3f} | {first['run_seconds']:.1f} | {len(group)} | "
            f"{steinke:.2f} / {median_gdp} | {over} | {_ideal(first)} |"
        )
    lines += ["", "Anchors (ε_lb at ε = 4):"]
    lines += [
        f"- {anchor['source']}: {anchor['epsilon_lower']} ({anchor['ratio']})" for anchor in ANCHORS
    ]
    if meta is not None:
        config = meta.get("config", {})
        lines += [
            "",
            results_io.provenance_line(
                meta,
                f"executor {config.get('executor')}",
                f"wall time {config.get('wall_seconds', 0):.0f} s",
            ),
            *other_commits(rows, meta),
        ]
    return "\n".join(lines) + "\n"


def write_report(name: str | None = None) -> None:
    """Write ``results/<name>.md`` from ``results/<name>.json`` (and its provenance).

    Args:
        name: a results stem (:func:`~audits.blackbox.one_run.results_name`); None: every
            profile's whose results exist.
    """
    names = [name] if name is not None else [results_name(p) for p in PROFILES]
    for stem, rows, meta in results_io.stored(names, every=name is None):
        atomic_write_text(results_io.RESULTS / f"{stem}.md", table(rows, meta))
