"""Abadi et al. 2016, Fig. 2: epsilon vs epochs, strong composition vs the moments accountant.

Setting of the figure: q = 0.01, sigma = 4, delta = 1e-5, epochs 0..400 (1/q = 100 steps per
epoch). Beyond the paper we add RDP (the moments accountant's modern form) and the tight PLD
interval. :func:`compute` saves the data; :func:`plot` draws only from the saved file.
"""

from __future__ import annotations

import dataclasses

from dpcore.accountants.report import epsilon_report
from dpcore.events import dpsgd_event
from dpcore.runs import run_many
from reproductions.harness import Executor, Output, fanned_store, fanning_out, spread

STEM = "abadi2016_fig2_epsilon_vs_epochs"


@dataclasses.dataclass(frozen=True)
class Fig2Config:
    """The paper's Fig. 2 setting."""

    sampling_probability: float = 0.01
    noise_multiplier: float = 4.0
    delta: float = 1e-5
    epochs: tuple[int, ...] = (1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400)
    accountants: tuple[str, ...] = ("advanced", "moments", "rdp", "pld")
    #: Values the paper prints for this setting at E = 100 (T = 10,000), Abadi et al. 2016, §3.1:
    #: "epsilon = 1.26 using the moments accountant ... epsilon = 9.34 using the strong
    #: composition theorem". The 9.34 follows from amplifying each step's classical-Gaussian
    #: epsilon (about 1.46) to q*epsilon, which is not valid at that epsilon; with the valid
    #: log(1 + q(e^eps - 1)) and the exact Gaussian, strong composition gives about 16.8.
    paper_epochs: int = 100
    paper_moments: float = 1.26
    paper_strong_composition: float = 9.34


#: The code the rows depend on: a change here computes them afresh in the run store.
CODE_MODULES = ("dpcore.accountants", "dpcore.pld", "dpcore.events", __name__)


@dataclasses.dataclass(frozen=True)
class EpochsRun:
    """Epsilon after ``epochs`` epochs of the figure's setting, a spec for :func:`epochs_row`."""

    config: Fig2Config
    epochs: int


def epochs_row(run: EpochsRun) -> dict[str, float | int | None]:
    """The row of ``run``: its epochs and steps, and epsilon per accountant (one column each:
    ``advanced``, ``moments``, ``rdp``; ``pld_lower``/``pld_upper``)."""
    config = run.config
    steps = run.epochs * round(1 / config.sampling_probability)
    event = dpsgd_event(
        sampling_probability=config.sampling_probability,
        noise_multiplier=config.noise_multiplier,
        steps=steps,
    )
    row: dict[str, float | int | None] = {"epochs": run.epochs, "steps": steps}
    report = epsilon_report(event, config.delta, config.accountants)
    row.update({key.removeprefix("epsilon_"): value for key, value in report.items()})
    return row


def compute(
    config: Fig2Config = Fig2Config(),
    *,
    output: Output | None = None,
    executor: Executor = None,
) -> None:
    """Compute epsilon for every epoch and accountant; save JSON + CSV to ``output`` (default:
    figures/).

    Each epoch count (:class:`EpochsRun`, independent) is a run of :func:`dpcore.runs.run_many`:
    here, one after another (``executor`` None or ``"local"``), or at once on ``executor``, then
    kept in the run store (``<runs>/<STEM>``, keyed by :data:`CODE_MODULES`), where a later run
    reads it back.

    Raises:
        InvalidParameterError: ``executor`` is invalid (before anything runs).
        RunsFailedError: runs still failed after one retry.
    """
    fanned = fanning_out(executor)
    output = output or Output()
    store = fanned_store(fanned, output, STEM, *CODE_MODULES)
    runs = [EpochsRun(config, epochs) for epochs in config.epochs]
    rows = run_many(epochs_row, runs, executor=fanned, store=store)
    output.save_results(STEM, config=config, rows=rows, extra={"runs_spread": spread(fanned)})


def plot(*, output: Output | None = None) -> None:
    """Draw ``<STEM>.png`` from the results saved in ``output`` (default: figures/)."""
    output = output or Output()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = output.load_results(STEM)
    rows, config = data["rows"], data["config"]
    epochs = [row["epochs"] for row in rows]
    figure, axes = plt.subplots(figsize=(6, 4))
    styles = {
        "advanced": ("strong composition (amplified)", "tab:red", "--"),
        "moments": ("moments accountant (Abadi et al.)", "tab:blue", "-"),
        "rdp": ("RDP", "tab:green", ":"),
        "pld_upper": ("tight PLD (certified upper)", "black", "-"),
    }
    for key, (label, colour, style) in styles.items():
        axes.plot(epochs, [row.get(key) for row in rows], style, color=colour, label=label)
    axes.plot(
        [config["paper_epochs"]],
        [config["paper_moments"]],
        "o",
        color="tab:blue",
        label="paper: moments accountant, E = 100",
    )
    axes.plot(
        [config["paper_epochs"]],
        [config["paper_strong_composition"]],
        "s",
        color="tab:red",
        label="paper: strong composition, E = 100",
    )
    axes.set_xlabel("epochs")
    axes.set_ylabel(f"epsilon at delta = {config['delta']:g}")
    axes.set_yscale("log")
    axes.set_title(f"q = {config['sampling_probability']}, sigma = {config['noise_multiplier']}")
    axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output.path(f"{STEM}.png"), dpi=150)
    plt.close(figure)
