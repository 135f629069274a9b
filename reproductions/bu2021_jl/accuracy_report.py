"""Figure and README table of :mod:`reproductions.bu2021_jl.accuracy` (Bu et al. 2021, Fig. 4).

Made from the saved results only, per profile (``figures/bu2021_jl_accuracy.json`` quick,
``figures/bu2021_jl_accuracy_full.json`` full): the figure ``figures/<stem>.png`` and the table
between ``<!-- accuracy-table:start -->`` and ``<!-- accuracy-table:end -->``
(``accuracy-table-full`` for full) of the folder's README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpcore.runs.markers import write_between_markers
from reproductions.bu2021_jl.accuracy_setup import results_stem, spread
from reproductions.bu2021_jl.config import README
from reproductions.bu2021_jl.privacy_intervals import fmt_interval
from reproductions.harness import Output


def markers(profile: str) -> tuple[str, str]:
    """README markers of a profile's table (``accuracy-table`` or ``accuracy-table-full``)."""
    name = "accuracy-table-full" if profile == "full" else "accuracy-table"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def profile_label(data: dict[str, Any]) -> str:
    """E.g. ``quick: 100 steps (0.43 epochs of 60), 2 seeds`` -- how far from the paper a run is."""
    config = data["config"]
    epochs = config["steps"] / data["steps_per_epoch"]
    unfinished = sum(len(item.get("unfinished") or {}) for item in data["summary"].values())
    runs = sum(
        len(item.get("unfinished") or {}) + len(item.get("seeds_done") or [])
        for item in data["summary"].values()
    )
    reached = ""
    if unfinished == runs and data.get("common_epoch"):
        reached = f", every run stopped at epoch {data['common_epoch']:g} (deadline)"
    elif unfinished and data.get("common_epoch"):
        reached = (
            f", {unfinished} of {runs} runs stopped by the deadline, every run reached epoch "
            f"{data['common_epoch']:g}"
        )
    return (
        f"{config['profile']}: {config['steps']} steps ({epochs:.2g} epochs of "
        f"{config['paper_epochs']}), {len(data['seeds'])} seeds{reached}"
    )


def _seeds_text(item: dict[str, Any]) -> str:
    done = item.get("seeds_done")
    unfinished = item.get("unfinished") or {}
    text = "" if done is None else f"{len(done)} seed(s) done"
    if unfinished:
        reached = ", ".join(f"seed {s} at epoch {e:g}" for s, e in unfinished.items())
        text += f"; stopped: {reached}"
    return text


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``<stem>.png``: mean test accuracy vs epoch, min/max band per method; README tables."""
    output = output or Output()
    for profile in ("quick", "full"):
        if output.has_results(results_stem(profile)):
            _plot_profile(output, results_stem(profile), readme or README)


def _curves(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rows drawn per method: a method whose runs all finished is drawn to its end; one with
    runs stopped early (a deadline) up to the last epoch all of its seeds reached, so that
    every point of a curve is a mean over the same seeds."""
    rows, summary = data["rows"], data["summary"]
    drawn: dict[str, list[dict[str, Any]]] = {}
    for label, item in summary.items():
        mine = [row for row in rows if row["method"] == label]
        if item.get("unfinished"):
            reached = min(
                max(row["epoch"] for row in mine if row["seed"] == seed)
                for seed in {row["seed"] for row in mine}
            ) if mine else 0  # fmt: skip
            mine = [row for row in mine if row["epoch"] <= reached]
        elif item.get("seeds_done") is not None:
            mine = [row for row in mine if row["seed"] in item["seeds_done"]]
        if mine:
            drawn[label] = mine
    return drawn


def _draw(axis: Any, data: dict[str, Any]) -> None:
    """Mean test accuracy vs epoch with the min-max band over seeds, one line per method."""
    summary = data["summary"]
    for label, mine in _curves(data).items():
        epochs = sorted({row["epoch"] for row in mine})
        per_epoch = [[row["test_accuracy"] for row in mine if row["epoch"] == e] for e in epochs]
        bands = [spread(values) for values in per_epoch]
        eps = fmt_interval(summary[label]["privacy"]["run"])
        seeds = max(b["n"] for b in bands)
        (line,) = axis.plot(
            epochs, [b["mean"] for b in bands], "-o", ms=3,
            label=f"{label} (eps {eps}; {seeds} seed(s))",
        )  # fmt: skip
        axis.fill_between(
            epochs,
            [b["min"] for b in bands],
            [b["max"] for b in bands],
            color=line.get_color(),
            alpha=0.2,
            lw=0,
        )
    config = data["config"]
    axis.set_xlabel("epoch")
    axis.set_ylabel("test accuracy (mean, min-max band over seeds)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=6, loc="lower right")
    axis.set_title(
        f"{profile_label(data)}\nsigma={config['noise_multiplier']:g}, "
        f"C={config['max_grad_norm']:g}, L={config['lot_size']}, "
        f"lr={config['learning_rate']:g}, delta={config['delta']:g}",
        fontsize=7,
    )


def _plot_profile(output: Output, stem: str, readme: Path) -> None:
    """The profile's figure; the quick one has the committed full results in a panel beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(stem)
    panels = [data]
    full = results_stem("full")
    if data["config"]["profile"] != "full" and output.has_results(full):
        panels.append(output.load_results(full))
    figure, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.4), squeeze=False)
    for axis, panel in zip(axes[0], panels, strict=True):
        _draw(axis, panel)
    figure.suptitle("Bu et al. 2021 Fig. 4, MNIST CNN: DP-SGD vs DP-SGD-JL", fontsize=9)
    figure.tight_layout()
    figure.savefig(output.path(f"{stem}.png"), dpi=150)
    plt.close(figure)
    write_between_markers(readme, *markers(data["config"]["profile"]), readme_table(data))


def readme_table(data: dict[str, Any]) -> str:
    """Final accuracy (mean and min-max over seeds) and epsilon per method, from the JSON only."""
    config = data["config"]
    lines = [
        f"Profile **{profile_label(data)}**; commit `{data['commit'][:12]}`, wall time "
        f"{data['wall_time_s']:.0f} s"
        + (
            f" for this call, {data['training_seconds']:,.0f} s of training over all runs"
            if "training_seconds" in data
            else ""
        )
        + f" ({data['hardware']}); "
        f"delta = {config['delta']:g}. *Assumption*: the paper says it trains the TF Privacy "
        "tutorial's CNN on MNIST; its hyperparameters for Fig. 4 were not verified, so the "
        f"tutorial's defaults are used (lr {config['learning_rate']:g}, sigma "
        f"{config['noise_multiplier']:g}, C {config['max_grad_norm']:g}, lot "
        f"{config['lot_size']}, {config['paper_epochs']} epochs). Paper accuracies: not "
        "transcribed (Fig. 4 is a plot). Epsilon is a certified interval: tight PLD for "
        f"DP-SGD, the JL accountant ({config['jl_bins']} shift-law bins) for DP-SGD-JL; it "
        "bounds the worst case of the paper's Thm 4.1 (gradient norm -> infinity, clipped norm "
        "C sqrt(r/X), X ~ chi2_r), whose heavy tail makes r = 1 and 3 far less private than "
        "exact DP-SGD at the same sigma."
        + (
            " The quick profile covers a fraction of the paper's epochs, so its accuracies are "
            "below converged values."
            if config["profile"] == "quick"
            else ""
        ),
        "",
        f"| method | test acc. mean [min, max] | paper | eps after {config['steps']} steps "
        f"| eps after {config['paper_epochs']} epochs | s / step | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, item in data["summary"].items():
        acc, speed = item["final_accuracy"], item["seconds_per_step"]
        at_common = item.get("accuracy_at_common_epoch")
        if acc is not None:
            accuracy = f"{acc['mean']:.3f} [{acc['min']:.3f}, {acc['max']:.3f}]"
        elif at_common is not None:
            accuracy = (
                f"not finished; at epoch {data['common_epoch']:g} ({at_common['n']} seeds): "
                f"{at_common['mean']:.3f} [{at_common['min']:.3f}, {at_common['max']:.3f}]"
            )
        else:
            accuracy = "not finished"
        seconds = "n/a" if speed is None else f"{speed['mean']:.3f}"
        if speed is not None and " + " in data["hardware"]:
            seconds = "n/a (runs moved between machines)"
        lines.append(
            f"| {label} | {accuracy} | n/a "
            f"| {fmt_interval(item['privacy']['run'])} "
            f"| {fmt_interval(item['privacy']['paper_schedule'])} | {seconds} "
            f"| {_seeds_text(item)} |"
        )
    return "\n".join(lines)
