"""Setup of the Fig. 1-style summary of Bu et al. 2021 (:mod:`reproductions.bu2021_jl.summary`).

The profiles (:class:`SummaryConfig`, :data:`PROFILES`), the methods compared (non-private Adam,
exact DP-Adam, DP-Adam-JL per r), IMDb as tensors (:func:`load_data`) and one fresh model and
optimizer per method (:func:`make_trainer`; the non-private one is the harness's
:class:`~reproductions.harness.NonPrivateTrainer`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from dpcore.torch.models import IMDB_SEQUENCE_LENGTH, imdb_lstm
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2021_jl import config as paper
from reproductions.harness import NonPrivateTrainer, Trainable, torch_seeded

STEM = "bu2021_jl_summary"


@dataclasses.dataclass(frozen=True)
class SummaryConfig:
    """One profile of the summary (a few steps, r in {1, 5} by default; quick: r = 1)."""

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
    #: Tokens kept per review, the last ones (the paper's §5: 150). The model is the same at
    #: any length (its parameters do not depend on it); shorter reviews make each step cheaper.
    sequence_length: int = IMDB_SEQUENCE_LENGTH
    #: Shift-law bins of the JL accountant (400 is its default).
    jl_bins: int = 50
    checkpoint: bool = False
    #: torch threads while training (None: torch's default); see the accuracy module.
    threads: int | None = 1


PROFILES = {
    # r = 1 only (r = 5 costs about a minute more on 2 cores, over the quick profile's budget).
    # At the paper's lot (256) and length (150) a few dozen steps leave every method near
    # chance (24 steps: 0.50-0.52); 20 lots of 2,048 reviews cut to their last 50 tokens at
    # lr 0.03 reach about 0.74 (Adam), 0.63 (DP-Adam), 0.64 (JL, r = 1) in about 2 minutes.
    "quick": SummaryConfig(
        jl_dimensions=(1,),
        steps=20,
        eval_every=20,
        lot_size=2048,
        learning_rate=0.03,
        sequence_length=50,
        threads=None,  # alone on the machine: torch's default (1.6x faster on 2 cores)
    ),
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


Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def load_data(config: SummaryConfig) -> Data:
    """IMDb token ids and float labels; the test set optionally a seeded random subset.

    The test split is stored negatives first, so a subset must be random, not a prefix.
    """
    from dpcore.data.text import imdb_sequences

    x_train, y_train, x_test, y_test = imdb_sequences(length=config.sequence_length)
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
    with torch_seeded(config.seed):
        model = imdb_lstm(recurrent="dplstm" if key == "dp_adam_exact" else "lstm")
    model = model.to(inputs.device)
    if key == "nonprivate":
        return NonPrivateTrainer(
            model,
            inputs,
            targets,
            optimizer=lambda params: torch.optim.Adam(params, lr=config.learning_rate),
            loss_fn=nn.BCEWithLogitsLoss(),
            batch_size=config.lot_size,
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
