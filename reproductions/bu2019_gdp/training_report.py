"""Figures and the README table of :mod:`reproductions.bu2019_gdp.training`, from its JSON only.

Each profile's results (``bu2019_training`` quick, ``bu2019_training_full`` full) get their own
figures and table:

- ``figures/<stem>_accuracy.png``: test accuracy (RMSE for MovieLens) vs epoch, one
  panel per task, private settings and the non-private baseline; the paper's printed value as a
  star at the paper's epochs. The quick figure also draws, dashed, the saved full-profile curves
  of its settings (when ``bu2019_training_full.json`` exists), so a few quick epochs are read
  against the paper-sized run.
- ``figures/<stem>_vs_mu.png``: the same metric vs the CLT's mu after each epoch; the
  paper's printed (mu, metric) pairs as stars.
- The "paper vs ours" table between ``<!-- training-table:start -->`` and
  ``<!-- training-table:end -->`` (quick; ``training-table-full`` for full) of the folder's README
  (left alone if a marker is missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpcore.runs.markers import write_between_markers
from reproductions.bu2019_gdp.training_setup import results_stem
from reproductions.harness import Output

README = Path(__file__).with_name("README.md")


def markers(profile: str) -> tuple[str, str]:
    """The README markers of a profile's table (``training-table`` or ``training-table-full``)."""
    name = "training-table-full" if profile == "full" else "training-table"
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


TITLES = {"mnist": "MNIST", "imdb": "IMDb", "adult": "Adult", "movielens": "MovieLens-100K"}


def _tasks(data: dict[str, Any]) -> list[str]:
    present = {row["task"] for row in data["rows"]}
    return [task for task in TITLES if task in present]


def _private(data: dict[str, Any], task: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, item)
        for name, item in data["summary"].items()
        if item["task"] == task and "setting" in item
    ]


def _ylabel(task: str) -> str:
    return "test RMSE (lower is better)" if task == "movielens" else "test accuracy"


def plot(*, output: Output | None = None, readme: Path | None = None) -> None:
    """Draw both figures and rewrite the README table of every profile with saved results."""
    output = output or Output()
    for profile in ("quick", "full"):
        stem = results_stem(profile)
        if output.has_results(stem):
            _plot_profile(output, stem, readme or README)


def _plot_profile(output: Output, stem: str, readme: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(stem)
    rows, tasks = data["rows"], _tasks(data)
    label = data["config"]["profile"]
    full = results_stem("full")
    # The quick figure draws the committed full results of the same settings beside its own.
    beside = output.load_results(full) if label != "full" and output.has_results(full) else None
    for suffix, x_key in (("accuracy", "epoch"), ("vs_mu", "mu")):
        columns = min(2, len(tasks))
        lines = (len(tasks) + columns - 1) // columns
        figure, axes = plt.subplots(lines, columns, figsize=(5.6 * columns, 3.8 * lines))
        flat = list(axes.flat) if hasattr(axes, "flat") else [axes]
        for axis, task in zip(flat, tasks, strict=False):
            for name, item in _private(data, task):
                mine = [r for r in rows if r["setting"] == name]
                (line,) = axis.plot(
                    [r[x_key] for r in mine], [r["test_metric"] for r in mine], "-o", ms=3,
                    label=f"{name} (ours)",
                )  # fmt: skip
                if beside is not None:
                    longer = [r for r in beside["rows"] if r["setting"] == name]
                    axis.plot(
                        [r[x_key] for r in longer], [r["test_metric"] for r in longer], "--",
                        lw=1, color=line.get_color(), label=f"{name} (full profile, committed)",
                    )  # fmt: skip
                paper = item["setting"]
                x_paper = paper["epochs"] if x_key == "epoch" else paper["paper_mu_clt"]
                if paper["paper_metric"] is not None and x_paper is not None:
                    axis.plot(x_paper, paper["paper_metric"], "*", ms=11, color=line.get_color(),
                              label=f"{name} (paper)")  # fmt: skip
            baseline = data["summary"].get(f"{task}:non-private")
            if baseline is not None and baseline["test_metric"] is not None:
                ours = f"non-private, {baseline['epochs_run']:g} epochs (ours)"
                axis.axhline(baseline["test_metric"], color="grey", ls="--", lw=1, label=ours)
                if baseline.get("paper_metric") is not None:
                    axis.axhline(baseline["paper_metric"], color="grey", ls=":", lw=1,
                                 label="non-private (paper)")  # fmt: skip
            axis.set_title(f"{TITLES[task]} ({label} profile)", fontsize=9)
            axis.set_xlabel("epoch" if x_key == "epoch" else "mu (CLT, Bu et al. Cor. 5)")
            axis.set_ylabel(_ylabel(task))
            axis.grid(alpha=0.3)
            axis.legend(fontsize=6)
        for axis in flat[len(tasks) :]:
            axis.set_visible(False)
        figure.suptitle(f"Bu et al. 2020, Sec. 5: DP training ({label} profile)", fontsize=10)
        figure.tight_layout()
        figure.savefig(output.path(f"{stem}_{suffix}.png"), dpi=130)
        plt.close(figure)
    write_between_markers(readme, *markers(label), readme_table(data))


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _metric(value: float | None, task: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if task == "movielens" else f"{100 * value:.1f} %"


def readme_table(data: dict[str, Any]) -> str:
    """The "paper vs ours" markdown table, from the saved results only."""
    config, summary = data["config"], data["summary"]
    profile = config["profile"]
    scope = " (few epochs, one setting per task)" if profile == "quick" else ""
    stopped = [n for n, item in summary.items() if item.get("status", "done") != "done"]
    if stopped:
        scope += f"; not finished: {', '.join(stopped)} (see the epochs run)"
    lines = [
        f"Profile **{profile}**{scope}, seed {data['seed']}, commit `{data['commit'][:12]}`, "
        f"wall time {data['wall_time_s']:.0f} s"
        + (
            f" for this call, {data['training_seconds']:,.0f} s of training over all runs"
            if "training_seconds" in data
            else ""
        )
        + f" ({data['hardware']}). mu and eps (CLT) are "
        "the CLT's approximation (not a bound); RDP and the PLD interval's upper end are "
        "certified upper bounds (its lower end bounds the true epsilon of the same steps from "
        "below).",
        "",
        "| task | setting: sigma, lot ours (paper), lr, C, optimizer | epochs run (paper) "
        "| ours | paper | non-private ours (paper) | mu ours | eps CLT | eps RDP | eps PLD "
        "| paper's schedule: mu computed (printed) | eps CLT computed (printed) | delta "
        "| not in paper text |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task in _tasks(data):
        base = summary.get(f"{task}:non-private")
        base_text = (
            "not run"
            if base is None
            else f"{_metric(base['test_metric'], task)} ({_metric(base['paper_metric'], task)})"
        )
        for name, item in _private(data, task):
            s, run = item["setting"], item["privacy_run"]
            paper = item["privacy_paper_schedule"]
            lot = item["lot_size_ours"]
            lines.append(
                f"| {TITLES[task]} | {name}: {s['noise_multiplier']:g}, {lot:.0f} "
                f"({s['lot_size']}), {s['learning_rate']:g}, {s['max_grad_norm']:g}, "
                f"{s['optimizer']} | {item['epochs_run']:g} ({s['epochs']}) "
                f"| {_metric(item['test_metric'], task)} | {_metric(s['paper_metric'], task)} "
                f"| {base_text} | {_num(run.get('mu'))} "
                f"| {_num(run.get('epsilon_clt'))} | {_num(run.get('epsilon_rdp'))} "
                f"| [{_num(run.get('epsilon_pld_lower'))}, {_num(run.get('epsilon_pld_upper'))}] "
                f"| {_num(paper['mu'])} ({_num(s['paper_mu_clt'])}) "
                f"| {_num(paper['epsilon_clt'])} ({_num(s['paper_eps_clt'])}) "
                f"| {s['delta']:g} | {', '.join(s['assumed']) or '-'} |"
            )
    return "\n".join(lines)
