"""Reports drawn from saved audit results: a markdown table and a figure per audit."""

from __future__ import annotations

import statistics
from collections import defaultdict

from scipy import stats

from audits.results_io import RESULTS, load


def exceedance_summary(rows: list[dict]) -> str:  # type: ignore[type-arg]
    """How many bounds exceed the claimed epsilon, against what their confidence allows.

    Each bound fails with probability at most 1 - confidence, so among N bounds about
    N (1 - confidence) may exceed a correct claim; only an improbable excess (binomial tail below
    1e-3) is evidence of a bug.
    """
    exceed = sum(r["epsilon_lower"] > r["setting"]["target_epsilon"] for r in rows)
    failure = 1 - rows[0]["confidence"]
    tail = float(stats.binom.sf(exceed - 1, len(rows), failure)) if exceed else 1.0
    verdict = "evidence of a bug" if tail < 1e-3 else "consistent with the stated confidence"
    return (
        f"{exceed} of {len(rows)} lower bounds exceed the claimed ε; at {1 - failure:.0%} "
        f"confidence each, {len(rows) * failure:.1f} are expected "
        f"(P[Bin ≥ {exceed}] = {tail:.3g}): {verdict}."
    )


def write(audit: str) -> None:
    """Write ``results/<audit>.md`` and ``results/<audit>.png`` from ``results/<audit>.json``."""
    rows = load(audit)
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for row in rows:
        groups[(row["setting"]["mechanism"], row["setting"]["target_epsilon"])].append(row)
    lines = [
        f"# Audit: {audit}",
        "",
        "Lower bounds hold with the stated confidence each; upper bounds are the accountants'.",
        "",
        "| mechanism | target ε | ε_lb mean | ε_lb worst | ε_lb best | mean / target "
        "| worst / target | confidence | RDP ε | PLD ε (upper) | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mechanism, target), members in sorted(groups.items()):
        lows = [m["epsilon_lower"] for m in members]
        upper = members[0]["epsilon_upper"]
        lines.append(
            f"| {mechanism} | {target:g} | {statistics.mean(lows):.3f} | {min(lows):.3f} | "
            f"{max(lows):.3f} | "
            f"{statistics.mean(lows) / target:.3f} | {min(lows) / target:.3f} | "
            f"{members[0]['confidence']:.2f} | {upper['rdp']:.3f} | {upper['pld']:.3f} | "
            f"{len(members)} |"
        )
    lines += ["", exceedance_summary(rows)]
    (RESULTS / f"{audit}.md").write_text("\n".join(lines) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for mechanism, marker in (("gaussian", "o"), ("laplace", "s")):
        keys = sorted(k for k in groups if k[0] == mechanism)
        targets = [k[1] for k in keys]
        axes.plot(
            targets,
            [statistics.mean(r["epsilon_lower"] for r in groups[k]) for k in keys],
            marker,
            label=f"{mechanism}: mean ε_lb",
        )
        axes.plot(
            targets,
            [min(r["epsilon_lower"] for r in groups[k]) for k in keys],
            marker,
            fillstyle="none",
            label=f"{mechanism}: worst ε_lb",
        )
    top = max(k[1] for k in groups)
    axes.plot([0, top], [0, top], "k-", lw=0.8, label="claimed ε")
    axes.set_xlabel("claimed ε (δ = 1e-5)")
    axes.set_ylabel("audited lower bound (95%)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / f"{audit}.png", dpi=150)
    plt.close(figure)
