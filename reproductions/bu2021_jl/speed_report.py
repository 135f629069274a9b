"""Bu et al. 2021, Table 2: figure and README tables of :mod:`reproductions.bu2021_jl.speed`.

Made from the saved results only (``bu2021_jl_speed[_cuda].json``, plus the newest
``bu2021_jl_tf_privacy.json`` and ``bu2021_jl_dpcore_tf.json`` beside a CPU run) of an
:class:`~reproductions.harness.Output` (default: ``figures/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.speed import (
    DPCORE_TF_MISSING,
    DPCORE_TF_NOT_ON_GPU,
    TF_PRIVACY_MISSING,
    TF_PRIVACY_NOT_ON_GPU,
    _paper_columns,
    dpcore_tf_rows,
    stem_for,
    table_for,
    tf_privacy_rows,
)
from reproductions.harness import Output


def _label(row: dict[str, Any]) -> str:
    names = {
        "nonprivate": "non-private Adam",
        "dp_adam_exact": "DP-Adam, exact (fast engine)",
        "keras_nonprivate": "Keras non-private Adam",
        "tf_privacy_vanilla": "TF Privacy vanilla DP-Adam",
        "tf_privacy_vectorized": "TF Privacy 0.9 vectorized DP-Adam (extra row)",
        "keras3_nonprivate": "Keras 3 non-private Adam (dpcore TF's reference)",
        "dpcore_tf_exact": "dpcore TF DP-Adam, exact",
    }
    if row["method"] == "dp_adam_jl":
        return f"DP-Adam-JL, r = {row['r']}"
    if row["method"] == "dpcore_tf_jl":
        return f"dpcore TF DP-Adam-JL, r = {row['r']}"
    return str(names.get(row["method"], row["method"]))


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


#: The TensorFlow timings shown beside a CPU run: (source, rows from ``output``'s newest file,
#: what the table says when there is none on CPU, and on GPU).
_TENSORFLOW_ROWS = (
    ("tf_privacy", tf_privacy_rows, TF_PRIVACY_MISSING, TF_PRIVACY_NOT_ON_GPU),
    ("dpcore_tf", dpcore_tf_rows, DPCORE_TF_MISSING, DPCORE_TF_NOT_ON_GPU),
)


def table_rows(data: dict[str, Any], output: Output | None = None) -> list[dict[str, Any]]:
    """Our rows, with the TF Privacy and dpcore TF rows from ``output``'s newest files (else
    those saved with ours).

    A GPU run gets no TensorFlow rows: those are CPU timings, and ratios across devices mislead.
    """
    ours = [row for row in data["rows"] if row["source"] == "dpcore"]
    if data.get("device", "cpu") != "cpu":
        return ours
    for source, fresh_rows, _, _ in _TENSORFLOW_ROWS:
        fresh = fresh_rows(output)
        ours += fresh or [row for row in data["rows"] if row["source"] == source]
    return ours


def _fitted_text(fitted: float | None) -> str:
    """The straight-line crossover in words (below 1: JL is slower at every r >= 1).

    Example:
        >>> _fitted_text(-15.6).endswith("r = -15.6, i.e. JL is slower at every r >= 1")
        True
        >>> _fitted_text(2.5).endswith("r = 2.5")
        True
    """
    if fitted is None:
        return "a straight line through the JL times gives no crossover (n/a)"
    text = f"a straight line through the JL times crosses the exact time at r = {fitted:g}"
    return text + (", i.e. JL is slower at every r >= 1" if fitted < 1 else "")


def readme_table(data: dict[str, Any], output: Output | None = None) -> str:
    """The paper-vs-ours Markdown table, from saved results only (``output``'s; default:
    figures/)."""
    rows = table_rows(data, output)
    cross = data["crossover"]
    lines = [
        f"Profile **{data['config']['profile']}**, commit `{data['commit'][:12]}`, "
        f"{data['hardware']}, torch {data['torch']}, wall time {data['wall_time_s']:.0f} s. "
        f"Paper: {data['paper_hardware']}.",
        "",
        "| method | ours: s / epoch | ours: x non-private | paper: s / epoch | "
        "paper: x non-private | how measured |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        how = (
            f"extrapolated from {row['timed_steps']} lot{'s' if row['timed_steps'] != 1 else ''}"
            if row["extrapolated"]
            else "full epoch"
        )
        if row["source"] == "tf_privacy":
            how += f"; TF Privacy run on {row['hardware']}"
        if row["source"] == "dpcore_tf":
            how += f"; dpcore TF run on {row['hardware']}"
        if row["error"]:
            how = f"failed: {row['error'][:80]}"
        lines.append(
            f"| {_label(row)} | {_fmt(row['seconds_per_epoch'])} "
            f"| {_fmt(row['ratio_to_nonprivate'], 2)} | {_fmt(row['paper_seconds_per_epoch'], 0)} "
            f"| {_fmt(row['paper_ratio_to_nonprivate'], 1)} | {how} |"
        )
    stand_ins = {"tf_privacy": "tf_privacy_vanilla", "dpcore_tf": "dpcore_tf_exact"}
    for source, _, on_cpu, on_gpu in _TENSORFLOW_ROWS:
        if any(row["source"] == source for row in rows):
            continue
        missing = {"method": stand_ins[source], "r": None}
        columns = _paper_columns(stand_ins[source], None)
        why = on_cpu if data.get("device", "cpu") == "cpu" else on_gpu
        lines.append(
            f"| {_label(missing)} | {why} | - "
            f"| {_fmt(columns['paper_seconds_per_epoch'], 0)} "
            f"| {_fmt(columns['paper_ratio_to_nonprivate'], 1)} | - |"
        )
    lines += [
        "",
        "Crossover: the smallest measured r at which DP-Adam-JL is slower than our exact DP-Adam "
        f"is **{cross['first_slower_r'] if cross['first_slower_r'] is not None else 'none'}**; "
        f"{_fitted_text(cross['fitted_r'])}.",
    ]
    return "\n".join(lines)


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``bu2021_jl_speed[_cuda].png`` and the README tables of every device saved in ``output``
    (default: figures/); the tables go to ``readme`` (default: this folder's README)."""
    output = output or Output()
    for device in paper.saved_devices(stem_for("cpu"), output):
        plot_device(device, output=output, readme=readme)


def plot_device(device: str, *, output: Output | None = None, readme: Path | None = None) -> None:
    """Ratios to non-private, ours vs paper, of the run on ``device``; and its README table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    output = output or Output()
    stem = stem_for(device)
    data = output.load_results(stem)
    references = ("keras_nonprivate", "keras3_nonprivate")
    rows = [row for row in table_rows(data, output) if row["method"] not in references]
    labels = [
        _label(row).replace(", ", "\n")
        + ("\n(paper: TF Privacy)" if row["method"] in ("dp_adam_exact", "dpcore_tf_exact") else "")
        for row in rows
    ]
    positions = np.arange(len(rows))
    figure, axis = plt.subplots(figsize=(max(9.0, 0.75 * len(rows)), 4.2))
    ours = [row["ratio_to_nonprivate"] or np.nan for row in rows]
    theirs = [row["paper_ratio_to_nonprivate"] or np.nan for row in rows]
    axis.bar(positions - 0.2, ours, 0.4, label=f"ours ({data['hardware']})")
    axis.bar(positions + 0.2, theirs, 0.4, label="paper (P100, TensorFlow)")
    axis.set_xticks(positions, labels, fontsize=7)
    axis.set_yscale("log")
    axis.set_ylabel("time per epoch / non-private")
    axis.axhline(1.0, color="grey", lw=0.8)
    axis.set_title(f"IMDb LSTM, lot 256 ({data['config']['profile']} profile)", fontsize=10)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="y", which="both")
    figure.tight_layout()
    figure.savefig(output.path(f"{stem}.png"), dpi=150)
    plt.close(figure)
    paper.replace_between(readme or paper.README, table_for(device), readme_table(data, output))
