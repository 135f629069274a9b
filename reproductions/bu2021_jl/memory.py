"""Bu et al. 2021, Tables 3-4: the largest lot that fits in a memory cap, per training method.

Models: the TF Privacy MNIST CNN (:func:`dpcore.torch.models.tf_privacy_mnist_cnn`, 26,010
parameters; Table 3) and the same topology widened (:func:`widened_mnist_cnn`, every channel and
hidden width times :data:`WIDE_WIDTH`: 16,650,410 parameters, our stand-in for the paper's ~17M
parameter model of Table 4; the widening rule is an assumption).

Methods, each one SGD step on a lot of random MNIST-shaped images (memory does not depend on the
values): non-private SGD, exact DP-SGD (dpcore's fast engine), DP-SGD-JL with r = 10 and r = 30.
dpcore's JL engine evaluates the r forward-mode projections in one vectorised pass by default
(r copies of the activations and of the parameter-sized directions); the rows marked
"one pass per direction" evaluate them one at a time (``vmap_directions=False``), the memory-lean
way.

Measurement reuses :mod:`bench.training_memory`: each lot size runs in a fresh process
(``python -m reproductions.bu2021_jl.memory --worker``: one warm-up and one timed step) whose
resident set the parent polls and kills above the cap (peak host RSS; on CUDA the cap applies to
``torch.cuda.max_memory_allocated`` instead). Lots are powers of two, searched by bisection on the
exponent (peak memory grows with the lot), so a method costs about log2(range) + 1 processes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from torch import nn

from bench import training, training_memory
from bench.training import Cell
from reproductions.bu2021_jl import config as paper
from reproductions.common import FIGURES, load_results, save_results

STEM = "bu2021_jl_memory"
TABLE = "memory-table"
MODULE = "reproductions.bu2021_jl.memory"
CHECKPOINT_DIR = paper.CHECKPOINTS / STEM
#: Width multiplier of the wide CNN (about 17M parameters; see :func:`widened_mnist_cnn`).
WIDE_WIDTH = 26


def widened_mnist_cnn(width: int) -> nn.Sequential:
    """The TF Privacy MNIST CNN with 16w, 32w conv channels and a 32w hidden layer.

    ``width = 1`` is :func:`~dpcore.torch.models.tf_privacy_mnist_cnn` exactly; the parameter
    count is ``24,576 w^2 + 1,424 w + 10``.

    Example:
        >>> sum(p.numel() for p in widened_mnist_cnn(1).parameters())
        26010
        >>> sum(p.numel() for p in widened_mnist_cnn(WIDE_WIDTH).parameters())
        16650410
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        from dpcore.errors import InvalidParameterError

        raise InvalidParameterError("width", "an integer >= 1", width)
    c1, c2, hidden = 16 * width, 32 * width, 32 * width
    return nn.Sequential(
        nn.Conv2d(1, c1, 8, stride=2, padding=3),  # 28x28 -> 14x14
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 13x13
        nn.Conv2d(c1, c2, 4, stride=2),  # -> 5x5
        nn.ReLU(),
        nn.MaxPool2d(2, stride=1),  # -> 4x4
        nn.Flatten(),
        nn.Linear(c2 * 4 * 4, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


@dataclasses.dataclass(frozen=True)
class Method:
    """One training method of the tables."""

    method: str  # nonprivate, dpsgd_exact or dpsgd_jl (bench.training's names)
    r: int | None = None
    per_direction: bool = False

    @property
    def label(self) -> str:
        names = {"nonprivate": "non-private SGD", "dpsgd_exact": "DP-SGD, exact (fast engine)"}
        if self.method != "dpsgd_jl":
            return names[self.method]
        return f"DP-SGD-JL, r = {self.r}" + (
            ", one pass per direction" if self.per_direction else ""
        )


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """One profile of Tables 3-4."""

    profile: str = "quick"
    #: Memory cap in MiB (host RSS on CPU, allocated GPU memory on CUDA).
    cap_mb: float = 1024.0
    wide_width: int = WIDE_WIDTH
    #: Exponent range (log2 of the lot) searched on the small and the wide CNN.
    small_log2: tuple[int, int] = (10, 13)
    wide_log2: tuple[int, int] = (2, 8)
    methods: tuple[Method, ...] = (
        Method("nonprivate"),
        Method("dpsgd_exact"),
        Method("dpsgd_jl", 10),
        Method("dpsgd_jl", 30),
    )
    threads: int = 1
    #: Seconds before a worker is killed (its lot is then "too slow", not "too big").
    timeout: float = 45.0
    #: On CUDA: the cap (16 GiB, the memory of the paper's P100) and the exponent ranges.
    cuda_cap_mb: float = 16384.0
    cuda_small_log2: tuple[int, int] = (10, 20)
    cuda_wide_log2: tuple[int, int] = (4, 15)

    def on(self, device: str) -> MemoryConfig:
        """This profile as run on ``device``: on CUDA the ``cuda_*`` cap and ranges apply.

        Example:
            >>> PROFILES["quick"].on("cuda").cap_mb, PROFILES["quick"].on("cpu").cap_mb
            (16384.0, 1024.0)
        """
        if device == "cpu":
            return self
        return dataclasses.replace(
            self,
            cap_mb=self.cuda_cap_mb,
            small_log2=self.cuda_small_log2,
            wide_log2=self.cuda_wide_log2,
        )


PROFILES = {
    "quick": MemoryConfig(),
    "full": MemoryConfig(
        profile="full",
        cap_mb=8192.0,
        small_log2=(10, 17),
        wide_log2=(4, 13),
        methods=(
            *MemoryConfig().methods,
            Method("dpsgd_jl", 10, per_direction=True),
            Method("dpsgd_jl", 30, per_direction=True),
        ),
        timeout=400.0,
    ),
}


def stem_for(device: str) -> str:
    """Results stem of a run on ``device`` (CPU and GPU results are kept side by side).

    Example:
        >>> stem_for("cpu"), stem_for("cuda")
        ('bu2021_jl_memory', 'bu2021_jl_memory_cuda')
    """
    return STEM if device == "cpu" else f"{STEM}_{device}"


def table_for(device: str) -> str:
    """README marker of the table of ``device``'s run."""
    return TABLE if device == "cpu" else f"{TABLE}-{device}"


def largest_fitting(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """Largest k in ``[low, high]`` with ``fits(k)``, for ``fits`` true up to a threshold.

    Bisection: ``1 + ceil(log2(high - low + 1))`` calls at most. None when ``fits(low)`` fails.

    Example:
        >>> calls = []
        >>> largest_fitting(lambda k: calls.append(k) or k <= 11, 8, 13), calls
        (11, [8, 11, 12])
    """
    if not fits(low):
        return None
    lo, hi = low, high  # fits(lo) holds; the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


# ----------------------------------------------------------------------------- worker side


def _variant(width: int, per_direction: bool) -> str:
    return f"width={width}" + (",per_direction" if per_direction else "")


def build(cell: Cell, batch_size: int, device: str) -> tuple[Any, Callable[[], None]]:
    """``(model, step)`` of ``cell`` on a random lot (the worker's hook into the measurement)."""
    import torch

    from dpcore.torch.optimizers import DPOptimizer
    from dpcore.torch.per_example.jl import JLEngine

    settings = dict(part.partition("=")[::2] for part in (cell.variant or "").split(","))
    torch.manual_seed(0)
    model = widened_mnist_cnn(int(settings.get("width") or 1)).to(device)
    inputs, targets = training._lot("mnist_cnn", device, batch_size)
    if "per_direction" not in settings:
        return model, training._step_function(cell, model, inputs, targets, batch_size)
    assert cell.jl_dimension is not None
    engine = JLEngine(
        model,
        max_grad_norm=training.MAX_GRAD_NORM,
        jl_dimension=cell.jl_dimension,
        vmap_directions=False,
    )
    private = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=training.LEARNING_RATE),
        engine=engine,
        noise_multiplier=training.NOISE_MULTIPLIER,
        expected_batch_size=batch_size,
    )
    loss_fn = nn.CrossEntropyLoss(reduction="none")

    def step() -> None:
        private.step(engine.clipped_sum(inputs, targets, loss_fn))

    return model, step


# ----------------------------------------------------------------------------- driver side


def outcome(measured: dict[str, Any], cap_mb: float, device: str) -> str:
    """``fits``, ``exceeds`` (over the cap or out of memory), ``too_slow`` or ``error``."""
    if measured.get("exceeded_cap"):
        return "exceeds"
    error = measured.get("error")
    if error is not None and measured.get("skipped") == "too slow":
        return "too_slow"  # killed by the parent's timeout
    if error is not None:
        return "exceeds" if training_memory._is_oom(measured) else "error"
    if device == "cuda" and (measured.get("peak_gpu_mb") or 0.0) > cap_mb:
        return "exceeds"
    return "fits"


def _probe(
    config: MemoryConfig, device: str, model: str, width: int, method: Method, lot: int
) -> dict[str, Any]:
    """One lot of one method in a watched process (cached on disk for the full profile)."""
    key = f"{config.profile}_{device}_{config.cap_mb:g}_{model}_{method.method}_{method.r}"
    path = CHECKPOINT_DIR / f"{key}_{int(method.per_direction)}_{lot}.json"
    if path.is_file():
        return dict(json.loads(path.read_text()))
    cell = Cell("mnist_cnn", method.method, _variant(width, method.per_direction), method.r)
    measured = training_memory.run_capped(
        cell,
        lot,
        # On CUDA the cap is judged on GPU memory; the host is only kept from swapping.
        cap_mb=config.cap_mb if device == "cpu" else 4 * config.cap_mb,
        threads=config.threads,
        timeout=config.timeout,
        module=MODULE,
        device=device,
    )
    row = {
        "model": model,
        "method": method.method,
        "r": method.r,
        "per_direction": method.per_direction,
        "batch_size": lot,
        "outcome": outcome(measured, config.cap_mb, device),
        "peak_rss_mb": measured.get("peak_rss_mb"),
        "peak_gpu_mb": measured.get("peak_gpu_mb"),
        "step_seconds": measured.get("step_seconds"),
        "error": (measured.get("error") or "")[:300] or None,
    }
    if config.profile == "full":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(row) + "\n")
    return row


def compute(profile: str = "quick") -> None:
    """Bisect the largest power-of-two lot under the cap for every (model, method)."""
    import torch
    from tqdm import tqdm

    device = paper.default_device()
    config = PROFILES[profile].on(device)
    start = time.perf_counter()
    models = {"small": (1, config.small_log2), "wide": (config.wide_width, config.wide_log2)}
    probes: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    sweeps = [(name, method) for name in models for method in config.methods]
    for name, method in tqdm(sweeps, desc="largest lot under the cap", unit="method"):
        width, (low, high) = models[name]
        mine: list[dict[str, Any]] = []

        def fits(
            k: int,
            name: str = name,
            width: int = width,
            method: Method = method,
            mine: list[dict[str, Any]] = mine,
        ) -> bool:
            row = _probe(config, device, name, width, method, 2**k)
            mine.append(row)
            return bool(row["outcome"] == "fits")

        k = largest_fitting(fits, low, high)
        probes += mine
        above = [row for row in mine if row["batch_size"] > (2**k if k is not None else 0)]
        bounded_by_memory = bool(above) and all(row["outcome"] == "exceeds" for row in above)
        rows.append(
            {
                "model": name,
                "parameters": sum(p.numel() for p in widened_mnist_cnn(width).parameters()),
                "method": method.method,
                "r": method.r,
                "per_direction": method.per_direction,
                "label": method.label,
                "largest_lot": None if k is None else 2**k,
                "largest_tried": 2**high,
                "smallest_tried": 2**low,
                # True: the next lot up was tried and exceeded the cap (the answer is exact).
                "bounded_by_memory": bounded_by_memory or k is None,
                "ratio_to_nonprivate": None,
                "peak_mb_at_largest": next(
                    (
                        row["peak_gpu_mb" if device == "cuda" else "peak_rss_mb"]
                        for row in mine
                        if k is not None and row["batch_size"] == 2**k
                    ),
                    None,
                ),
                "outcomes": ", ".join(f"{row['batch_size']}: {row['outcome']}" for row in mine),
            }
        )
    for row in rows:
        reference = next(
            r["largest_lot"]
            for r in rows
            if r["model"] == row["model"] and r["method"] == "nonprivate"
        )
        if reference and row["largest_lot"]:
            row["ratio_to_nonprivate"] = row["largest_lot"] / reference
    extra = {
        "seed": 0,
        "hardware": (
            f"{torch.cuda.get_device_name(0)} (CUDA)"
            if device == "cuda"
            else f"CPU, {config.threads} torch thread(s)"
        ),
        "device": device,
        "memory_measured": "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS",
        "torch": torch.__version__,
        "wall_time_s": round(time.perf_counter() - start, 1),
        "probes": probes,
    }
    save_results(stem_for(device), config=config, rows=rows, extra=extra)


# ----------------------------------------------------------------------------- plot and table


def _lot_text(row: dict[str, Any]) -> str:
    if row["largest_lot"] is None:
        return f"< {row['smallest_tried']:,}"
    text = f"{row['largest_lot']:,}"
    return text if row["bounded_by_memory"] else f">= {text}"


def readme_table(data: dict[str, Any]) -> str:
    """The paper-vs-ours Markdown table, from saved results only."""
    config = data["config"]
    lines = [
        f"Profile **{config['profile']}**, commit `{data['commit'][:12]}`, cap "
        f"**{config['cap_mb'] / 1024:g} GiB** of {data['memory_measured']} ({data['hardware']}), "
        f"torch {data['torch']}, wall time {data['wall_time_s']:.0f} s. Lots are powers of two; "
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
        peak = "-" if row["peak_mb_at_largest"] is None else f"{row['peak_mb_at_largest']:,.0f}"
        lines.append(
            f"| {model} | {row['label']} | {_lot_text(row)} | {ratio} | {peak} | not read "
            f"| {row['outcomes']} |"
        )
    return "\n".join(lines)


def plot() -> None:
    """``figures/bu2021_jl_memory[_cuda].png`` and the README tables of every saved device."""
    for device in ("cpu", "cuda"):
        if (FIGURES / f"{stem_for(device)}.json").is_file():
            plot_device(device)


def plot_device(device: str) -> None:
    """Largest lot per method and model of the run on ``device``; and its README table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stem = stem_for(device)
    data = load_results(stem)
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
    figure.savefig(FIGURES / f"{stem}.png", dpi=150)
    plt.close(figure)
    paper.replace_between(paper.README, table_for(device), readme_table(data))


if __name__ == "__main__":
    sys.exit(training_memory._worker(sys.argv[1:], build=build, module=MODULE))
