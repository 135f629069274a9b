"""Figure and README table of :mod:`reproductions.bu2021_jl.accuracy` (Bu et al. 2021, Fig. 4).

Made from the saved results only (``figures/bu2021_jl_accuracy.json``): the figure
``figures/bu2021_jl_accuracy.png`` and the table between ``<!-- accuracy-table:start -->`` and
``<!-- accuracy-table:end -->`` of the folder's README.
"""

from __future__ import annotations

from typing import Any

from reproductions.bu2021_jl.accuracy_setup import STEM, spread
from reproductions.bu2021_jl.config import README
from reproductions.bu2021_jl.privacy_intervals import fmt_interval
from reproductions.common import FIGURES, load_results, write_between_markers

TABLE_START, TABLE_END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"


def profile_label(data: dict[str, Any]) -> str:
    """E.g. ``quick: 100 steps (0.43 epochs), 2 seeds`` -- says how far from the paper a run is."""
    config = data["config"]
    epochs = config["steps"] / data["steps_per_epoch"]
    return (
        f"{config['profile']}: {config['steps']} steps ({epochs:.2g} epochs of "
        f"{config['paper_epochs']}), {len(data['seeds'])} seeds"
    )


def plot() -> None:
    """figures/bu2021_jl_accuracy.png: mean test accuracy vs epoch, min/max band per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_results(STEM)
    rows, summary = data["rows"], data["summary"]
    figure, axis = plt.subplots(figsize=(6.4, 4.2))
    for label, item in summary.items():
        mine = [row for row in rows if row["method"] == label]
        epochs = sorted({row["epoch"] for row in mine})
        per_epoch = [[row["test_accuracy"] for row in mine if row["epoch"] == e] for e in epochs]
        bands = [spread(values) for values in per_epoch]
        eps = fmt_interval(item["privacy"]["run"])
        (line,) = axis.plot(
            epochs, [b["mean"] for b in bands], "-o", ms=3, label=f"{label} (eps {eps})"
        )
        axis.fill_between(
            epochs,
            [b["min"] for b in bands],
            [b["max"] for b in bands],
            color=line.get_color(),
            alpha=0.2,
            lw=0,
        )
    axis.set_xlabel("epoch")
    axis.set_ylabel("test accuracy (mean, min-max band over seeds)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    config = data["config"]
    axis.set_title(
        f"Bu et al. 2021 Fig. 4, MNIST CNN -- {profile_label(data)}\n"
        f"sigma={config['noise_multiplier']:g}, C={config['max_grad_norm']:g}, "
        f"L={config['lot_size']}, lr={config['learning_rate']:g}, "
        f"delta={config['delta']:g}",
        fontsize=8,
    )
    figure.tight_layout()
    figure.savefig(FIGURES / f"{STEM}.png", dpi=150)
    plt.close(figure)
    write_between_markers(README, TABLE_START, TABLE_END, readme_table(data))


def readme_table(data: dict[str, Any]) -> str:
    """Final accuracy (mean and min-max over seeds) and epsilon per method, from the JSON only."""
    config = data["config"]
    lines = [
        f"Profile **{profile_label(data)}**; commit `{data['commit'][:12]}`, wall time "
        f"{data['wall_time_s']:.0f} s ({data['hardware']}); "
        f"delta = {config['delta']:g}. *Assumption*: the paper says it trains the TF Privacy "
        "tutorial's CNN on MNIST; its hyperparameters for Fig. 4 were not verified, so the "
        f"tutorial's defaults are used (lr {config['learning_rate']:g}, sigma "
        f"{config['noise_multiplier']:g}, C {config['max_grad_norm']:g}, lot "
        f"{config['lot_size']}, {config['paper_epochs']} epochs). Paper accuracies: not "
        "transcribed (Fig. 4 is a plot). Epsilon is a certified interval: tight PLD for "
        f"DP-SGD, the JL accountant ({config['jl_bins']} shift-law bins) for DP-SGD-JL; it "
        "bounds the worst case of the paper's Thm 4.1 (gradient norm -> infinity, clipped norm "
        "C sqrt(r/X), X ~ chi2_r), whose heavy tail makes r = 1 and 3 far less private than "
        "exact DP-SGD at the same sigma. A quick run covers a fraction of an epoch, so its "
        "accuracies are far below converged values.",
        "",
        f"| method | test acc. mean [min, max] | paper | eps after {config['steps']} steps "
        f"| eps after {config['paper_epochs']} epochs | s / step |",
        "|---|---|---|---|---|---|",
    ]
    for label, item in data["summary"].items():
        acc, speed = item["final_accuracy"], item["seconds_per_step"]
        lines.append(
            f"| {label} | {acc['mean']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}] | n/a "
            f"| {fmt_interval(item['privacy']['run'])} "
            f"| {fmt_interval(item['privacy']['paper_schedule'])} | {speed['mean']:.3f} |"
        )
    return "\n".join(lines)
