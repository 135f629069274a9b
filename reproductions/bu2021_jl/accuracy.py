"""Bu et al. 2021 (arXiv 2102.03013), Fig. 4: MNIST test accuracy vs epochs, DP-SGD vs DP-SGD-JL.

Model: the TensorFlow Privacy tutorial's CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`);
the paper (§5) trains "a convolutional neural network from [TP] tutorial on MNIST", N = 60,000.
Methods: DP-SGD with exact per-example clipping (engine ``"fast"``) and DP-SGD-JL with r = 1, 3,
20 random projections (engine ``"jl"``; the r of Fig. 4). Hyperparameters are the tutorial's
defaults -- learning rate 0.15, noise multiplier 1.1, clipping norm 1.0, lot 256, 60 epochs,
delta = 1e-5 -- because we could not read the paper's own values for this figure (an
assumption, stated in the README). Lots are Poisson (q = 256 / 60,000).

Privacy per method (the events are the same for every seed): the tight PLD interval for DP-SGD
and the JL accountant's interval (Lemma 4.1 / Thm 4.1 of the paper, computed by
:class:`dpcore.accountants.JlAccountant`) for DP-SGD-JL, for the steps run and for the full
60-epoch schedule. :func:`compute` trains every method for several seeds and saves
``figures/bu2021_jl_accuracy.{json,csv}`` and one privacy statement per method; the full profile
is resumable from ``reproductions/checkpoints/bu2021_jl_accuracy/``. :func:`plot` draws mean and
min/max band per method from the saved JSON only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from dpcore.accountants import JlAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.data.datasets import load_mnist
from dpcore.errors import InvalidParameterError
from dpcore.events import (
    DpEvent,
    GaussianEvent,
    JLGaussianEvent,
    PoissonSampledEvent,
    SelfComposedEvent,
)
from dpcore.torch.models import tf_privacy_mnist_cnn
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from dpcore.torch.training import accuracy as batch_accuracy
from reproductions.bu2021_jl.config import CHECKPOINTS as CHECKPOINT_ROOT
from reproductions.bu2021_jl.config import DELTA, MNIST_TRAIN_SIZE, README
from reproductions.common import (
    FIGURES,
    finite_or_none,
    load_results,
    save_results,
    write_between_markers,
)

STEM = "bu2021_jl_accuracy"
CHECKPOINTS = CHECKPOINT_ROOT / STEM
TABLE_START, TABLE_END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"


@dataclasses.dataclass(frozen=True)
class AccuracyConfig:
    """One profile of the Fig. 4 reproduction (quick by default)."""

    profile: str = "quick"
    #: JL dimensions of Fig. 4; ``None`` in :func:`methods` is exact DP-SGD.
    jl_dimensions: tuple[int, ...] = (1, 3, 20)
    seeds: tuple[int, ...] = (0, 1)
    #: Noisy steps per run and evaluation interval (quick: a fraction of one epoch).
    steps: int = 100
    eval_every: int = 25
    #: The schedule the paper's figure runs (tutorial default: 60 epochs, an assumption).
    paper_epochs: int = 60
    dataset_size: int = MNIST_TRAIN_SIZE
    lot_size: int = 256
    learning_rate: float = 0.15
    noise_multiplier: float = 1.1
    max_grad_norm: float = 1.0
    delta: float = DELTA
    #: Test images evaluated (None: all 10,000).
    test_size: int | None = None
    #: Shift-law bins of the JL accountant (400 is its default; fewer is faster, wider).
    jl_bins: int = 50
    #: Save a checkpoint at every evaluation and resume from it.
    checkpoint: bool = False
    #: torch threads while training (None: torch's default). One thread by default: on a
    #: shared 2-core machine, oversubscribed threads slow every step several-fold.
    threads: int | None = 1


PROFILES = {
    "quick": AccuracyConfig(),
    "full": AccuracyConfig(
        profile="full",
        seeds=(0, 1, 2),
        steps=60 * 234,
        eval_every=234,
        jl_bins=400,
        checkpoint=True,
        threads=None,
    ),
}


def methods(config: AccuracyConfig) -> list[tuple[str, int | None]]:
    """``(label, r)`` per method: exact DP-SGD first (r = None), then DP-SGD-JL per r."""
    return [("DP-SGD", None)] + [(f"DP-SGD-JL r={r}", r) for r in config.jl_dimensions]


def steps_per_epoch(config: AccuracyConfig) -> int:
    """Lots per epoch, ``round(N / L)`` (234 for MNIST at L = 256), as the sampler counts."""
    return max(1, round(config.dataset_size / config.lot_size))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min, max and sample standard deviation (0 for one value) of per-seed results.

    Example:
        >>> spread([0.90, 0.94, 0.92])["mean"]
        0.92
    """
    if not values:
        raise InvalidParameterError("values", "to be non-empty", values)
    numbers = [float(v) for v in values]
    return {
        "mean": round(statistics.fmean(numbers), 12),
        "min": min(numbers),
        "max": max(numbers),
        "std": statistics.stdev(numbers) if len(numbers) > 1 else 0.0,
        "n": len(numbers),
    }


def step_event(sampling_probability: float, noise_multiplier: float, r: int | None) -> DpEvent:
    """One Poisson-subsampled step: Gaussian (exact clipping) or JL-Gaussian (r projections)."""
    inner = GaussianEvent(noise_multiplier) if r is None else JLGaussianEvent(noise_multiplier, r)
    return PoissonSampledEvent(sampling_probability, inner)


def epsilon_interval(
    event: DpEvent, *, delta: float, jl_bins: int, jl: bool, count: int = 1
) -> dict[str, Any]:
    """Certified ``[lower, upper]`` epsilon of ``count`` x ``event``: JL accountant or tight PLD."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # grid notes do not change the certified bracket
        accountant = JlAccountant(bins=jl_bins) if jl else PldAccountant()
        interval = accountant.compose(event, count).get_epsilon_interval(delta)
    return {
        "accountant": "jl" if jl else "pld",
        "jl_bins": jl_bins if jl else None,
        "lower": finite_or_none(interval.lower),
        "upper": finite_or_none(interval.upper),
    }


def method_privacy(
    step: DpEvent,
    *,
    jl: bool,
    steps: int,
    paper_steps: int,
    delta: float,
    jl_bins: int,
    run_event: DpEvent | None = None,
) -> dict[str, Any]:
    """Epsilon intervals after ``steps`` steps (``run_event``, e.g. the ledger's, if given) and
    after the paper's ``paper_steps``; JL accountant if ``jl``, else tight PLD."""
    run = epsilon_interval(
        run_event if run_event is not None else SelfComposedEvent(step, steps),
        delta=delta,
        jl_bins=jl_bins,
        jl=jl,
    )
    paper = (
        run
        if paper_steps == steps
        else epsilon_interval(step, count=paper_steps, delta=delta, jl_bins=jl_bins, jl=jl)
    )
    return {"run": run, "steps": steps, "paper_schedule": paper, "paper_steps": paper_steps}


def _slug(label: str) -> str:
    return label.lower().replace(" ", "_").replace("=", "")


def evaluate(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Test accuracy in batches of 1,000 (argmax of class scores, sign of a single logit)."""
    model.eval()
    correct = 0.0
    with torch.no_grad():
        for start in range(0, len(inputs), 1000):
            chunk = slice(start, start + 1000)
            batch = len(inputs[chunk])
            correct += batch_accuracy(model(inputs[chunk]), targets[chunk]) * batch
    return round(correct / len(inputs), 10)


Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_data(config: AccuracyConfig) -> Data:
    """MNIST scaled to [0, 1] as ``(n, 1, 28, 28)`` float32 images and int64 labels."""
    x_train, y_train = load_mnist("train")
    x_test, y_test = load_mnist("test")
    if config.test_size is not None:
        x_test, y_test = x_test[: config.test_size], y_test[: config.test_size]

    def images(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(x.astype(np.float32) / 255.0).reshape(len(x), 1, 28, 28)

    return (
        images(x_train),
        torch.as_tensor(y_train, dtype=torch.long),
        images(x_test),
        torch.as_tensor(y_test, dtype=torch.long),
    )


def make_trainer(
    config: AccuracyConfig, r: int | None, seed: int, inputs: torch.Tensor, targets: torch.Tensor
) -> DPTrainer:
    """DP-SGD (engine ``fast``) or DP-SGD-JL (engine ``jl``, r directions) on a fresh CNN."""
    torch.manual_seed(seed)
    model = tf_privacy_mnist_cnn()
    return DPTrainer.dp_sgd(
        model,
        lr=config.learning_rate,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=config.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        sampler=PoissonSampler(
            len(inputs), sampling_probability=config.lot_size / len(inputs), seed=seed
        ),
        engine="fast" if r is None else "jl",
        jl_dimension=r,
        seed=10_000 + seed,
    )


@contextlib.contextmanager
def cpu_settings(threads: int | None, *, flush_denormal: bool = False) -> Iterator[None]:
    """Set torch's thread count (and flush-to-zero of denormal floats) for a block, then restore."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    if flush_denormal:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
        if flush_denormal:
            torch.set_flush_denormal(False)


class Trainable(Protocol):
    """What :func:`run_training` drives: a :class:`DPTrainer` or a non-private stand-in."""

    model: nn.Module

    @property
    def steps_done(self) -> int: ...

    def step(self) -> object: ...

    def save_checkpoint(self, path: str | Path) -> None: ...

    def load_checkpoint(self, path: str | Path) -> None: ...


def run_training(
    trainer: Trainable,
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    steps: int,
    eval_every: int,
    per_epoch: int,
    fingerprint: dict[str, Any],
    checkpoint: Path | None = None,
    row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train to ``steps`` steps, evaluating every ``eval_every``; resumable.

    With ``checkpoint`` (a path stem), the trainer is saved to ``<stem>.pt`` and the rows so far
    to ``<stem>.json`` at every evaluation; a run saved with the same ``fingerprint`` (config,
    method, seed) resumes from there, and a finished one is read back instead of retrained.
    Every row holds ``row``, the step, the epoch (``step / per_epoch``) and the test accuracy.
    Returns ``{"rows": [...], "train_seconds": ..., "done": True, **fingerprint}``.
    """
    from tqdm import tqdm

    fingerprint = json.loads(json.dumps(fingerprint))  # tuples -> lists, as read back
    state: dict[str, Any] = {"rows": [], "train_seconds": 0.0, "done": False, **fingerprint}
    if checkpoint is not None and checkpoint.with_suffix(".json").is_file():
        saved: dict[str, Any] = json.loads(checkpoint.with_suffix(".json").read_text())
        weights = checkpoint.with_suffix(".pt")
        if all(saved.get(k) == v for k, v in fingerprint.items()) and weights.is_file():
            trainer.load_checkpoint(weights)
            if saved["done"]:
                return saved
            state = saved
    bar = tqdm(
        total=steps,
        initial=trainer.steps_done,
        desc=" ".join(str(v) for v in (row or {}).values()),
        unit="step",
        leave=False,
        disable=None,
    )
    while trainer.steps_done < steps:
        start = time.perf_counter()
        for _ in range(min(eval_every, steps - trainer.steps_done)):
            trainer.step()
            bar.update(1)
        state["train_seconds"] += time.perf_counter() - start
        state["rows"].append(
            {
                **(row or {}),
                "step": trainer.steps_done,
                "epoch": round(trainer.steps_done / per_epoch, 4),
                "test_accuracy": evaluate(trainer.model, *test),
            }
        )
        state["done"] = trainer.steps_done >= steps
        if checkpoint is not None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            trainer.save_checkpoint(checkpoint.with_suffix(".pt"))
            checkpoint.with_suffix(".json").write_text(json.dumps(state, indent=1) + "\n")
    bar.close()
    state["done"] = True
    return state


def compute(
    profile: str = "quick",
    *,
    data_loader: Callable[[AccuracyConfig], Data] | None = None,
    config: AccuracyConfig | None = None,
) -> None:
    """Train every method for every seed; save rows, per-method summary and privacy statements."""
    config = config or PROFILES[profile]
    data = (data_loader or load_data)(config)
    with cpu_settings(config.threads):
        _compute(config, data)


def _compute(config: AccuracyConfig, data: Data) -> None:
    x_train, y_train, x_test, y_test = data
    if len(x_train) != config.dataset_size:
        raise InvalidParameterError("dataset_size", f"to equal {len(x_train)}", config.dataset_size)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    FIGURES.mkdir(parents=True, exist_ok=True)
    for label, r in methods(config):
        finals, seconds = [], []
        statement: dict[str, Any] | None = None
        for seed in config.seeds:
            trainer = make_trainer(config, r, seed, x_train, y_train)
            stem = CHECKPOINTS / config.profile / f"{_slug(label)}_seed{seed}"
            result = run_training(
                trainer,
                (x_test, y_test),
                steps=config.steps,
                eval_every=config.eval_every,
                per_epoch=steps_per_epoch(config),
                fingerprint={"config": dataclasses.asdict(config), "method": label, "seed": seed},
                checkpoint=stem if config.checkpoint else None,
                row={"method": label, "r": r, "seed": seed},
            )
            rows += result["rows"]
            finals.append(result["rows"][-1]["test_accuracy"])
            seconds.append(result["train_seconds"] / config.steps)
            if statement is None:
                statement = trainer.privacy_statement(
                    delta=config.delta,
                    accountants=() if r is not None else ("rdp", "pld"),
                    model="tf_privacy_mnist_cnn (26,010 parameters)",
                    method=label,
                    steps_planned=config.steps,
                )
        assert statement is not None
        privacy = method_privacy(
            step_event(config.lot_size / config.dataset_size, config.noise_multiplier, r),
            jl=r is not None,
            steps=config.steps,
            paper_steps=config.paper_epochs * steps_per_epoch(config),
            delta=config.delta,
            jl_bins=config.jl_bins,
            run_event=trainer.ledger.event() if trainer.steps_done == config.steps else None,
        )
        statement["epsilon_interval"] = privacy
        path = FIGURES / f"{STEM}_{_slug(label)}_privacy.json"
        path.write_text(json.dumps(statement, indent=2, sort_keys=True, default=str) + "\n")
        summary[label] = {
            "r": r,
            "final_accuracy": spread(finals),
            "seconds_per_step": spread(seconds),
            "privacy": privacy,
            "privacy_statement": path.name,
        }
        acc = summary[label]["final_accuracy"]
        print(f"{STEM} {label}: {acc['mean']:.4f} [{acc['min']:.4f}, {acc['max']:.4f}]", flush=True)
    save_results(
        STEM,
        config=config,
        rows=rows,
        extra={
            "seeds": list(config.seeds),
            "hardware": f"{torch.get_num_threads()} torch thread(s) on a shared CPU",
            "torch": torch.__version__,
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "steps_per_epoch": steps_per_epoch(config),
            "summary": summary,
        },
    )


def profile_label(data: dict[str, Any]) -> str:
    """E.g. ``quick: 100 steps (0.43 epochs), 2 seeds`` -- says how far from the paper a run is."""
    config = data["config"]
    epochs = config["steps"] / data["steps_per_epoch"]
    return (
        f"{config['profile']}: {config['steps']} steps ({epochs:.2g} epochs of "
        f"{config['paper_epochs']}), {len(data['seeds'])} seeds"
    )


def fmt_interval(interval: dict[str, Any]) -> str:
    """``[lower, upper]`` with ``inf`` for an unbounded (null) end; one number if they agree."""

    def one(value: float | None) -> str:
        return "inf" if value is None else f"{value:.3g}"

    lower, upper = interval["lower"], interval["upper"]
    if lower is not None and upper is not None and one(lower) == one(upper):
        return one(lower)
    return f"[{one(lower)}, {one(upper)}]"


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
