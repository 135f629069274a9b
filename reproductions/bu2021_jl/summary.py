"""Bu et al. 2021 (arXiv 2102.03013), Fig. 1-style summary on IMDb: accuracy vs time per epoch.

The paper's Figure 1 places each optimizer by its time per epoch and test accuracy, annotated
with epsilon. Here: non-private Adam (``nn.LSTM`` model), DP-Adam with exact per-example clipping
(the ``DPLSTM`` model, engine ``"fast"``) and DP-Adam-JL with r = 1, 5, 10, 30 (``nn.LSTM``,
engine ``"jl"``; r of the paper's Table 2), all on the paper's IMDb model
(:func:`dpcore.torch.models.imdb_lstm`) and data (:func:`dpcore.data.text.imdb_sequences`:
vocabulary 8,000, length 150, §5). Lot, noise, clipping, epochs and delta are the shared ones in
:mod:`reproductions.bu2021_jl.config` (sigma = 1.0, C = 1.0 and 20 epochs are assumptions there);
Adam's learning rate 1e-3 (Keras' default) is an assumption too.

Seconds per epoch are *read* from ``figures/bu2021_jl_speed.json`` (Table 2,
:mod:`reproductions.bu2021_jl.speed`), never re-timed here; without that file the figure shows
accuracy and epsilon only and says to run ``bu2021_jl_speed`` first. Epsilon: tight PLD for
DP-Adam, the JL accountant for DP-Adam-JL (both certified intervals), after the steps run and
after the paper's schedule. The quick profile trains every method for the same few steps.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpcore.torch.models import imdb_lstm
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2021_jl import config as paper
from reproductions.bu2021_jl.accuracy import (
    Trainable,
    cpu_settings,
    fmt_interval,
    method_privacy,
    run_training,
    step_event,
)
from reproductions.common import FIGURES, load_results, save_results, write_between_markers

STEM = "bu2021_jl_summary"
SPEED_STEM = "bu2021_jl_speed"
SPEED_MISSING = "run bu2021_jl_speed first"
README = paper.README
CHECKPOINTS = paper.CHECKPOINTS / STEM
TABLE_START, TABLE_END = "<!-- summary-table:start -->", "<!-- summary-table:end -->"


@dataclasses.dataclass(frozen=True)
class SummaryConfig:
    """One profile of the summary (quick by default: a few steps, r in {1, 5})."""

    profile: str = "quick"
    jl_dimensions: tuple[int, ...] = (1, 5)
    seed: int = 0
    #: Steps per method (the same for all) and evaluation interval.
    steps: int = 24
    eval_every: int = 24
    paper_epochs: int = paper.IMDB_EPOCHS
    dataset_size: int = paper.IMDB_TRAIN_SIZE
    lot_size: int = paper.IMDB_LOT
    #: Adam's learning rate (assumption: Keras' default).
    learning_rate: float = 1e-3
    noise_multiplier: float = paper.NOISE_MULTIPLIER
    max_grad_norm: float = paper.MAX_GRAD_NORM
    delta: float = paper.DELTA
    #: Test reviews evaluated, a seeded random subset (None: all 25,000).
    test_size: int | None = 2000
    #: Shift-law bins of the JL accountant (400 is its default).
    jl_bins: int = 50
    checkpoint: bool = False
    #: torch threads while training (None: torch's default); see the accuracy module.
    threads: int | None = 1


PROFILES = {
    "quick": SummaryConfig(),
    "full": SummaryConfig(
        profile="full",
        jl_dimensions=paper.TABLE2_JL_DIMENSIONS,
        steps=paper.steps_for_epochs(paper.IMDB_EPOCHS),
        eval_every=98,
        test_size=None,
        jl_bins=400,
        checkpoint=True,
        threads=None,
    ),
}

#: ``(label, method key of the speed file, r)``; the keys are :mod:`.speed`'s row names.
Method = tuple[str, str, int | None]


def methods(config: SummaryConfig) -> list[Method]:
    """Non-private Adam, exact DP-Adam, then DP-Adam-JL per r."""
    return [
        ("Adam (non-private)", "nonprivate", None),
        ("DP-Adam (exact)", "dp_adam_exact", None),
        *((f"DP-Adam-JL r={r}", "dp_adam_jl", r) for r in config.jl_dimensions),
    ]


class NonPrivateAdam:
    """Plain Adam on shuffled lots of exactly ``lot_size`` (last partial lot of a pass dropped),
    with the checkpoint interface of :class:`DPTrainer` so :func:`run_training` can drive it."""

    def __init__(
        self,
        model: nn.Module,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        lr: float,
        lot_size: int,
        seed: int,
    ) -> None:
        self.model, self.inputs, self.targets, self.lot_size = model, inputs, targets, lot_size
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.generator = torch.Generator().manual_seed(seed)
        self.order = torch.empty(0, dtype=torch.long)
        self.position = 0
        self.steps = 0

    @property
    def steps_done(self) -> int:
        return self.steps

    def step(self) -> float:
        """One Adam step on the next lot; returns its mean loss."""
        if self.position + self.lot_size > len(self.order):
            self.order = torch.randperm(len(self.inputs), generator=self.generator)
            self.position = 0
        lot = self.order[self.position : self.position + self.lot_size]
        self.position += self.lot_size
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(self.inputs[lot]), self.targets[lot])
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(loss.detach())

    def save_checkpoint(self, path: str | Path) -> None:
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "order": self.order,
            "position": self.position,
            "steps": self.steps,
        }
        temporary = Path(path).with_suffix(".tmp")
        torch.save(state, temporary)
        temporary.replace(path)

    def load_checkpoint(self, path: str | Path) -> None:
        state = torch.load(Path(path), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.order, self.position, self.steps = state["order"], state["position"], state["steps"]


Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_data(config: SummaryConfig) -> Data:
    """IMDb token ids and float labels; the test set optionally a seeded random subset.

    The test split is stored negatives first, so a subset must be random, not a prefix.
    """
    from dpcore.data.text import imdb_sequences

    x_train, y_train, x_test, y_test = imdb_sequences()
    if config.test_size is not None:
        keep = np.random.default_rng(12345).permutation(len(x_test))[: config.test_size]
        x_test, y_test = x_test[keep], y_test[keep]
    return (
        torch.as_tensor(x_train, dtype=torch.long),
        torch.as_tensor(y_train, dtype=torch.float32),
        torch.as_tensor(x_test, dtype=torch.long),
        torch.as_tensor(y_test, dtype=torch.float32),
    )


def make_trainer(
    config: SummaryConfig, method: Method, inputs: torch.Tensor, targets: torch.Tensor
) -> Trainable:
    """A fresh model and its optimizer: plain Adam, exact DP-Adam or DP-Adam-JL."""
    _, key, r = method
    torch.manual_seed(config.seed)
    model = imdb_lstm(recurrent="dplstm" if key == "dp_adam_exact" else "lstm")
    if key == "nonprivate":
        return NonPrivateAdam(
            model,
            inputs,
            targets,
            lr=config.learning_rate,
            lot_size=config.lot_size,
            seed=config.seed,
        )
    return DPTrainer.dp_adam(
        model,
        lr=config.learning_rate,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.BCEWithLogitsLoss(reduction="none"),
        noise_multiplier=config.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(
            len(inputs), sampling_probability=config.lot_size / len(inputs), seed=config.seed
        ),
        engine="jl" if r is not None else "fast",
        jl_dimension=r,
        seed=10_000 + config.seed,
    )


def compute(
    profile: str = "quick",
    *,
    data_loader: Callable[[SummaryConfig], Data] | None = None,
    config: SummaryConfig | None = None,
) -> None:
    """Train every method for ``config.steps`` steps; save accuracy, epsilon and statements.

    Denormal floats are flushed to zero while training (as in the timing of Table 2): the LSTM
    backward on CPU is several times slower on them.
    """
    config = config or PROFILES[profile]
    data = (data_loader or load_data)(config)
    with cpu_settings(config.threads, flush_denormal=True):
        _compute(config, data)


def _compute(config: SummaryConfig, data: Data) -> None:
    x_train, y_train, x_test, y_test = data
    wall = time.perf_counter()
    per_epoch = max(1, round(len(x_train) / config.lot_size))
    q = config.lot_size / len(x_train)
    rows: list[dict[str, Any]] = []
    FIGURES.mkdir(parents=True, exist_ok=True)
    for method in methods(config):
        label, key, r = method
        trainer = make_trainer(config, method, x_train, y_train)
        fingerprint = {"config": dataclasses.asdict(config), "method": label}
        result = run_training(
            trainer,
            (x_test, y_test),
            steps=config.steps,
            eval_every=config.eval_every,
            per_epoch=per_epoch,
            fingerprint=fingerprint,
            checkpoint=CHECKPOINTS / config.profile / f"{key}_r{r}" if config.checkpoint else None,
            row={"method": label, "key": key, "r": r},
        )
        privacy = None
        statement = None
        if isinstance(trainer, DPTrainer):
            privacy = method_privacy(
                step_event(q, config.noise_multiplier, r),
                jl=r is not None,
                steps=config.steps,
                paper_steps=paper.steps_for_epochs(
                    config.paper_epochs, len(x_train), config.lot_size
                ),
                delta=config.delta,
                jl_bins=config.jl_bins,
                run_event=trainer.ledger.event() if trainer.steps_done == config.steps else None,
            )
            record = trainer.privacy_statement(
                delta=config.delta,
                accountants=() if r is not None else ("rdp", "pld"),
                model=f"imdb_lstm ({'DPLSTM' if r is None else 'nn.LSTM'})",
                method=label,
            )
            record["epsilon_interval"] = privacy
            statement = f"{STEM}_{key}{'' if r is None else r}_privacy.json"
            (FIGURES / statement).write_text(
                json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"
            )
        final = result["rows"][-1]
        rows.append(
            {
                **final,
                "train_seconds_per_step": result["train_seconds"] / config.steps,
                "epsilon_run_lower": None if privacy is None else privacy["run"]["lower"],
                "epsilon_run_upper": None if privacy is None else privacy["run"]["upper"],
                "privacy": privacy,
                "privacy_statement": statement,
            }
        )
        print(f"{STEM} {label}: accuracy {final['test_accuracy']:.4f}", flush=True)
    save_results(
        STEM,
        config=config,
        rows=rows,
        extra={
            "seed": config.seed,
            "hardware": f"{torch.get_num_threads()} torch thread(s) on a shared CPU",
            "torch": torch.__version__,
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "steps_per_epoch": per_epoch,
            "test_examples": len(x_test),
        },
    )


def speed_rows() -> dict[str, Any] | None:
    """Seconds per epoch by ``(method key, r)`` from the speed results, or None if absent.

    Only the file's own dpcore rows are used (not TF Privacy's, which it may also list).
    """
    if not (FIGURES / f"{SPEED_STEM}.json").is_file():
        return None
    data = load_results(SPEED_STEM)
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
    """E.g. ``quick: 16 steps (0.16 epochs of 20), 2,000 test reviews``."""
    config = data["config"]
    return (
        f"{config['profile']}: {config['steps']} steps "
        f"({config['steps'] / data['steps_per_epoch']:.2g} epochs of {config['paper_epochs']}), "
        f"{data['test_examples']:,} test reviews"
    )


def _eps(row: dict[str, Any], which: str = "run") -> str:
    return "- (not private)" if row["privacy"] is None else fmt_interval(row["privacy"][which])


def plot() -> None:
    """figures/bu2021_jl_summary.png: accuracy vs seconds per epoch, points annotated with eps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = load_results(STEM)
    speed = speed_rows()
    figure, axis = plt.subplots(figsize=(6.8, 4.4))
    for index, row in enumerate(data["rows"]):
        timed = None if speed is None else speed["rows"].get((row["key"], row["r"]))
        x = index if timed is None else timed["seconds_per_epoch"]
        axis.plot(x, row["test_accuracy"], "o", ms=7, label=row["method"])
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
    figure.tight_layout()
    figure.savefig(FIGURES / f"{STEM}.png", dpi=150)
    plt.close(figure)
    write_between_markers(README, TABLE_START, TABLE_END, readme_table(data, speed))


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
        "values of `config.py` (not verified against the paper), Adam's learning rate "
        f"{config['learning_rate']:g} is Keras' default. Epsilon: certified interval, tight "
        f"PLD for DP-Adam, the JL accountant ({config['jl_bins']} shift-law bins, worst case "
        "of the paper's Thm 4.1) for DP-Adam-JL. The paper's Figure 1 values were not "
        "transcribed. A quick run trains a fraction of an epoch: its accuracies are near "
        "chance and say nothing about the paper's converged ones.",
        "",
        f"| method | test acc. after {config['steps']} steps | s / epoch | x non-private "
        f"| eps after {config['steps']} steps | eps after {config['paper_epochs']} epochs |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        timed = None if speed is None else speed["rows"].get((row["key"], row["r"]))
        seconds = "-" if speed is None else "not timed"
        ratio = "-"
        if timed is not None:
            note = " (extrapolated)" if timed.get("extrapolated") else ""
            seconds = f"{timed['seconds_per_epoch']:.3g}{note}"
            if timed.get("ratio_to_nonprivate"):
                ratio = f"{timed['ratio_to_nonprivate']:.2g}"
        lines.append(
            f"| {row['method']} | {row['test_accuracy']:.3f} | {seconds} | {ratio} "
            f"| {_eps(row)} | {_eps(row, 'paper_schedule')} |"
        )
    return "\n".join(lines)
