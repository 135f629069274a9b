"""Setup of the Fig. 4 reproduction of Bu et al. 2021 (:mod:`reproductions.bu2021_jl.accuracy`).

The profiles (:class:`AccuracyConfig`, :data:`PROFILES`), the methods compared (exact DP-SGD and
DP-SGD-JL per r), MNIST as tensors (:func:`load_data`), one trainer per method and seed on a fresh
TF Privacy tutorial CNN (:func:`make_trainer`), and :func:`spread`, the per-seed summary used by
both the computation and the figure.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from dpcore.data.datasets import load_mnist
from dpcore.errors import InvalidParameterError
from dpcore.torch.models import tf_privacy_mnist_cnn
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2021_jl.config import DELTA, MNIST_TRAIN_SIZE

STEM = "bu2021_jl_accuracy"


def results_stem(profile: str) -> str:
    """``bu2021_jl_accuracy`` (quick, tests) or ``bu2021_jl_accuracy_full`` (full profile)."""
    return f"{STEM}_full" if profile == "full" else STEM


@dataclasses.dataclass(frozen=True)
class AccuracyConfig:
    """One profile of the Fig. 4 reproduction (quick by default)."""

    profile: str = "quick"
    #: JL dimensions of Fig. 4; ``None`` in :func:`methods` is exact DP-SGD.
    jl_dimensions: tuple[int, ...] = (1, 3, 20)
    seeds: tuple[int, ...] = (0, 1)
    #: Noisy steps per run and evaluation interval.
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
    #: Advance every run one evaluation interval at a time, round by round, instead of each run
    #: to its end in turn: a deadline then leaves every method and seed at the same epoch (the
    #: results do not depend on it; each run has its own generators).
    interleave: bool = False


PROFILES = {
    # One seed, 200 steps (0.85 epochs) at a larger learning rate: DP-SGD and DP-SGD-JL(3, 20)
    # reach about 86-90 % test accuracy, the figure's qualitative result, in about 2 minutes
    # (r = 1, whose certified epsilon alone takes 14 s, is left to the full profile). torch's
    # default threads: the quick profile runs alone (1.6-2x faster per step on 2 cores).
    "quick": AccuracyConfig(
        jl_dimensions=(3, 20),
        seeds=(0,),
        steps=200,
        eval_every=50,
        learning_rate=0.5,
        threads=None,
    ),
    "full": AccuracyConfig(
        profile="full",
        seeds=(0, 1, 2, 3, 4),
        steps=60 * 234,
        eval_every=234,
        jl_bins=400,
        checkpoint=True,
        interleave=True,
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
    model = tf_privacy_mnist_cnn().to(inputs.device)  # where the data is
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
