"""Bu et al. 2021, Tables 3-4: figure and README tables of :mod:`reproductions.bu2021_jl.memory`.

Made from the saved results only (``bu2021_jl_memory[_cuda].json`` of an
:class:`~reproductions.harness.Output`; default: ``figures/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.memory import stem_for, table_for
from reproductions.harness import Output


def _lot_text(row: dict[str, Any]) -> str:
    if not row.get("complete", True):
        return "not run" if row["largest_lot"] is None else f">= {row['largest_lot']:,} (cut off)"
    if row["largest_lot"] is None:
        return f"< {row['smallest_tried']:,}"
    text = f"{row['largest_lot']:,}"
    return text if row["bounded_by_memory"] else f">= {text}"


def _wall_time(data: dict[str, Any]) -> str:
    if data.get("wall_time_s") is None:
        return (
            "**cut off before the end**: assembled from the probes it finished (`cut off`: a "
            "lower bound; `not run`: no probe)"
        )
    return f"wall time {data['wall_time_s']:.0f} s"


def readme_table(data: dict[str, Any]) -> str:
    """The paper-vs-ours Markdown table, from saved results only."""
    config = data["config"]
    lines = [
        f"Profile **{config['profile']}**, commit `{data['commit'][:12]}`, cap "
        f"**{config['cap_mb'] / 1024:g} GiB** of {data['memory_measured']} ({data['hardware']}), "
        f"torch {data['torch']}, {_wall_time(data)}. Lots are powers of two; "
        "`>=`: the largest lot tried fit (or a larger one was too slow), `<`: the smallest "
        "did not.",
        "",
        "| model | method | largest lot (ours) | x non-private | peak MiB at that lot | "
        "paper | lots tried |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        model = f"{row['model']} ({row['parameters']:,} params)"
        ratio = "-" if row["ratio_to_nonprivate"] is None else f"{row['ratio_to_nonprivate']:g}"
        if ratio != "-" and not row.get("complete", True):
            ratio = f">= {ratio}"
        peak = "-" if row["peak_mb_at_largest"] is None else f"{row['peak_mb_at_largest']:,.0f}"
        lines.append(
            f"| {model} | {row['label']} | {_lot_text(row)} | {ratio} | {peak} | not read "
            f"| {row['outcomes']} |"
        )
    return "\n".join(lines)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``bu2021_jl_memory[_cuda].png`` and the README tables of every device saved in ``output``
    (default: figures/); the tables go to ``readme`` (default: this folder's README)."""
    output = output or Output()
    for device in paper.saved_devices(stem_for("cpu"), output):
        plot_device(device, output=output, readme=readme)


def plot_device(device: str, *, output: Output | None = None, readme: Path | None = None) -> None:
    """Largest lot per method and model of the run on ``device``; and its README table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    output = output or Output()
    stem = stem_for(device)
    data = output.load_results(stem)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for axis, model in zip(axes, ("small", "wide"), strict=True):
        rows = [row for row in data["rows"] if row["model"] == model]
        values = [row["largest_lot"] or 0.5 * row["smallest_tried"] for row in rows]
        positions = np.arange(len(rows))
        bars = axis.bar(positions, values, color="tab:blue")
        for bar, row in zip(bars, rows, strict=True):
            bar.set_hatch("" if row["bounded_by_memory"] and row["largest_lot"] else "//")
            axis.annotate(
                _lot_text(row),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        axis.set_xticks(positions, [row["label"].replace(", ", "\n") for row in rows], fontsize=6)
        axis.set_yscale("log", base=2)
        axis.set_title(f"{model} CNN ({rows[0]['parameters']:,} parameters)", fontsize=9)
        axis.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("largest lot under the cap")
    figure.suptitle(
        f"Largest lot under {data['config']['cap_mb'] / 1024:g} GiB ({data['memory_measured']}, "
        f"{data['config']['profile']} profile); hatched: bound, not exact",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(output.path(f"{stem}.png"), dpi=150)
    plt.close(figure)
    paper.replace_between(readme or paper.README, table_for(device), readme_table(data))
