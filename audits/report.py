"""Reports drawn from saved audit results: a markdown table and a figure per audit."""

from __future__ import annotations

import statistics
from collections import defaultdict

from audits.results_io import RESULTS, load


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
        "| mechanism | target ε | ε_lb mean | ε_lb worst | mean / target | worst / target "
        "| confidence | RDP ε | PLD ε (upper) | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (mechanism, target), members in sorted(groups.items()):
        lows = [m["epsilon_lower"] for m in members]
        upper = members[0]["epsilon_upper"]
        lines.append(
            f"| {mechanism} | {target:g} | {statistics.mean(lows):.3f} | {min(lows):.3f} | "
            f"{statistics.mean(lows) / target:.3f} | {min(lows) / target:.3f} | "
            f"{members[0]['confidence']:.2f} | {upper['rdp']:.3f} | {upper['pld']:.3f} | "
            f"{len(members)} |"
        )
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
