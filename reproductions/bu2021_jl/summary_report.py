"""Figure and README table of :mod:`reproductions.bu2021_jl.summary` (Bu et al. 2021, Fig. 1).

Made from the saved results only: accuracy and epsilon from ``figures/bu2021_jl_summary.json``,
seconds per epoch read from ``figures/bu2021_jl_speed.json`` (:func:`speed_rows`; without it the
figure and table say to run ``bu2021_jl_speed`` first). Writes ``figures/bu2021_jl_summary.png``
and the table between ``<!-- summary-table:start -->`` and ``<!-- summary-table:end -->`` of the
folder's README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpcore.runs.markers import write_between_markers
from dpcore.torch.models import IMDB_SEQUENCE_LENGTH
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.privacy_intervals import fmt_interval
from reproductions.bu2021_jl.summary_setup import STEM
from reproductions.harness import Output

SPEED_STEM = "bu2021_jl_speed"
SPEED_MISSING = "run bu2021_jl_speed first"
README = paper.README


def markers(profile: str) -> tuple[str, str]:
    """README markers of a profile's table (``summary-table`` or ``summary-table-full``)."""
    name = "summary-table-full" if profile == "full" else "summary-table"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def speed_rows(output: Output | None = None) -> dict[str, Any] | None:
    """Seconds per epoch by ``(method key, r)`` from the speed results, or None if absent.

    Only the file's own dpcore rows are used (not TF Privacy's, which it may also list).
    """
    output = output or Output()
    if not output.has_results(SPEED_STEM):
        return None
    data = output.load_results(SPEED_STEM)
    table: dict[tuple[str, int | None], dict[str, Any]] = {}
    for row in data.get("rows", []):
        if row.get("source", "dpcore") == "dpcore" and row.get("seconds_per_epoch"):
            table[(str(row.get("method")), row.get("r"))] = row
    return {
        "rows": table,
        "profile": data.get("config", {}).get("profile"),
        "commit": str(data.get("commit", "unknown"))[:12],
    }


def profile_label(data: dict[str, Any]) -> str:
    """E.g. ``quick: 16 steps (0.16 epochs of 20), 2,000 test reviews``; a lot or review length
    other than the paper's is named (``lot 2048, last 50 tokens of each review``)."""
    config = data["config"]
    changed = []
    if config["lot_size"] != paper.IMDB_LOT:
        changed.append(f"lot {config['lot_size']}")
    length = config.get("sequence_length", IMDB_SEQUENCE_LENGTH)
    if length != IMDB_SEQUENCE_LENGTH:
        changed.append(f"last {length} tokens of each review")
    return (
        f"{config['profile']}: {config['steps']} steps "
        f"({config['steps'] / data['steps_per_epoch']:.2g} epochs of {config['paper_epochs']}), "
        + "".join(f"{item}, " for item in changed)
        + f"{data['test_examples']:,} test reviews"
    )


def _eps(row: dict[str, Any], which: str = "run") -> str:
    return "- (not private)" if row["privacy"] is None else fmt_interval(row["privacy"][which])


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """``<stem>.png``: accuracy vs seconds per epoch, points annotated with eps; README tables."""
    output = output or Output()
    for stem in (STEM, f"{STEM}_full"):
        if output.has_results(stem):
            _plot_profile(output, stem, readme or README)


def _plot_profile(output: Output, stem: str, readme: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = output.load_results(stem)
    speed = speed_rows(output)
    figure, axis = plt.subplots(figsize=(6.8, 4.4))
    for index, row in enumerate(row for row in data["rows"] if "test_accuracy" in row):
        timed = None if speed is None else speed["rows"].get((row["key"], row["r"]))
        x = index if timed is None else timed["seconds_per_epoch"]
        stopped = "" if row["status"] == "done" else f" ({row['status']})"
        axis.plot(x, row["test_accuracy"], "o", ms=7, label=row["method"] + stopped)
        axis.annotate(
            "not private" if row["privacy"] is None else f"eps {_eps(row)}",
            (x, row["test_accuracy"]),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
        )
    if speed is None:
        axis.set_xticks(range(len(data["rows"])))
        axis.set_xticklabels([row["method"] for row in data["rows"]], rotation=20, fontsize=7)
        axis.set_xlabel(f"method (seconds per epoch: {SPEED_MISSING})")
    else:
        axis.set_xscale("log")
        axis.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.set_xlabel(
            f"seconds per epoch (from {SPEED_STEM}, {speed['profile']} profile, "
            f"commit {speed['commit']})"
        )
    config = data["config"]
    axis.margins(x=0.2, y=0.15)
    axis.set_ylabel("test accuracy")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, loc="best")
    axis.set_title(
        f"Bu et al. 2021 Fig. 1-style summary, IMDb LSTM -- {profile_label(data)}\n"
        f"sigma={config['noise_multiplier']:g}, C={config['max_grad_norm']:g}, "
        f"L={config['lot_size']}, Adam lr={config['learning_rate']:g}, "
        f"delta={config['delta']:g}; eps after the steps run",
        fontsize=8,
    )
    missing = [row["method"] for row in data["rows"] if "test_accuracy" not in row]
    if missing:
        figure.text(0.01, 0.01, f"not run: {', '.join(missing)}", fontsize=7, color="grey")
    figure.tight_layout()
    figure.savefig(output.path(f"{stem}.png"), dpi=150)
    plt.close(figure)
    write_between_markers(readme, *markers(config["profile"]), readme_table(data, speed))


def _learning_rate_note(config: dict[str, Any]) -> str:
    keras_default = 1e-3
    if config["learning_rate"] == keras_default:
        return f"Adam's learning rate {keras_default:g} is Keras' default."
    return (
        f"Adam's learning rate is {config['learning_rate']:g} here (Keras' default "
        f"{keras_default:g} in the full profile)."
    )


def readme_table(data: dict[str, Any], speed: dict[str, Any] | None) -> str:
    """Accuracy, seconds per epoch (from the speed results) and epsilon per method."""
    config = data["config"]
    source = (
        SPEED_MISSING
        if speed is None
        else f"from `{SPEED_STEM}` ({speed['profile']} profile, commit `{speed['commit']}`)"
    )
    lines = [
        f"Profile **{profile_label(data)}**; commit `{data['commit'][:12]}`, wall time "
        f"{data['wall_time_s']:.0f} s ({data['hardware']}); sigma = "
        f"{config['noise_multiplier']:g}, delta = {config['delta']:g}. Seconds per epoch: "
        f"{source}. *Assumptions*: sigma, C and {config['paper_epochs']} epochs are the shared "
        "values of `config.py` (not verified against the paper), "
        + _learning_rate_note(config)
        + " Epsilon: certified interval, tight "
        f"PLD for DP-Adam, the JL accountant ({config['jl_bins']} shift-law bins, worst case "
        "of the paper's Thm 4.1) for DP-Adam-JL. The paper's Figure 1 values were not "
        "transcribed."
        + (
            " The quick profile trains a fraction of the paper's epochs on larger lots of "
            "shorter reviews (so that a few steps move every method off chance): its "
            "accuracies are below the converged ones, and its epsilon after "
            f"{config['paper_epochs']} epochs is at its own lot size, not the paper's."
            if config["profile"] == "quick"
            else ""
        ),
        "",
        f"| method | test acc. after {config['steps']} steps | s / epoch | x non-private "
        f"| eps after {config['steps']} steps | eps after {config['paper_epochs']} epochs |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        if "test_accuracy" not in row:
            lines.append(f"| {row['method']} | {row['status']} | - | - | - | - |")
            continue
        accuracy = f"{row['test_accuracy']:.3f}"
        eps = _eps(row)
        if row["status"] != "done":
            accuracy += f" ({row['status']})"
            eps += f" (after step {row['step']})"
        timed = None if speed is None else speed["rows"].get((row["key"], row["r"]))
        seconds = "-" if speed is None else "not timed"
        ratio = "-"
        if timed is not None:
            note = " (extrapolated)" if timed.get("extrapolated") else ""
            seconds = f"{timed['seconds_per_epoch']:.3g}{note}"
            if timed.get("ratio_to_nonprivate"):
                ratio = f"{timed['ratio_to_nonprivate']:.2g}"
        lines.append(
            f"| {row['method']} | {accuracy} | {seconds} | {ratio} "
            f"| {eps} | {_eps(row, 'paper_schedule')} |"
        )
    return "\n".join(lines)
