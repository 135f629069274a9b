"""One run of a black-box audit: train with dpcore's DP-SGD, score the target on the final model.

The model starts from the setting's initial parameters (the same in every run: pre-trained
non-privately on records disjoint from the subset for the worst case, else the seeded random
initialisation), is trained with DP-SGD on the subset (plus the target in the "in" world) with
Poisson lots and the noise multiplier that dpcore's PLD calibration gives the claimed epsilon at
the setting's delta, q and steps, and only the final model's outputs on the target are kept.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from audits.blackbox.data import pretraining_records, subset, target
from audits.blackbox.scores import target_scores
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting, check_run, check_setting
from audits.dpsgd_whitebox import single_thread
from dpcore.calibration import calibrate_noise
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer

__all__ = ["execute", "initial_state", "make_model", "noise_multiplier", "run_seed"]

#: Adam's learning rate for the non-private pre-training (full batch).
PRETRAIN_LR = 1e-2


def make_model(setting: BlackBoxSetting) -> nn.Module:
    """The setting's model with torch's default initialisation seeded by ``setting.seed``."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(check_setting(setting).seed)
    try:
        if setting.model == "linear":
            return nn.Linear(784, 10)
        return nn.Sequential(
            nn.Linear(784, setting.hidden), nn.ReLU(), nn.Linear(setting.hidden, 10)
        )
    finally:
        torch.random.set_rng_state(generator_state)


@functools.cache
def initial_state(setting: BlackBoxSetting) -> dict[str, torch.Tensor]:
    """The parameters every run of ``setting`` starts from (computed once per process).

    Worst case: the seeded model pre-trained with full-batch Adam for ``pretrain_steps`` on
    :func:`~audits.blackbox.data.pretraining_records`; random: the seeded model as built.
    """
    model = make_model(setting)
    if setting.init == "worst_case":
        x, y = pretraining_records(setting)
        inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
        optimizer = torch.optim.Adam(model.parameters(), lr=PRETRAIN_LR)
        for _ in range(setting.pretrain_steps):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@functools.cache
def noise_multiplier(
    epsilon: float, delta: float, sampling_probability: float, steps: int
) -> float:
    """dpcore's PLD-calibrated sigma for DP-SGD(q, T) at (epsilon, delta) (1 % tolerance)."""
    return calibrate_noise(
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=sampling_probability,
        steps=steps,
        accountant="pld",
    )


def run_seed(run: BlackBoxRun) -> int:
    """The seed of a run's noise and lots, in [0, 2**63): a hash (numpy's SeedSequence) of the
    setting's seed, the claim, the world and the run's seed, so that no two runs of different
    worlds, claims or setting seeds share noise draws."""
    entropy = [run.setting.seed, run.seed, int(run.world == "in"), round(run.epsilon * 1e6)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def train(run: BlackBoxRun) -> nn.Module:
    """The final model of ``run`` (one torch thread).

    Raises:
        InvalidParameterError: a bad run (see :func:`~audits.blackbox.settings.check_run`).
    """
    setting = check_run(run).setting
    x, y = subset(setting)
    if run.world == "in":
        tx, ty = target(setting)
        x, y = np.concatenate([x, tx]), np.concatenate([y, ty])
    model = make_model(setting)
    model.load_state_dict(initial_state(setting))
    seed = run_seed(run)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=setting.lr,
        inputs=torch.from_numpy(x),
        targets=torch.from_numpy(y),
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=noise_multiplier(
            run.epsilon, setting.delta, setting.sampling_probability, setting.steps
        ),
        max_grad_norm=setting.max_grad_norm,
        sampler=PoissonSampler(
            len(y), sampling_probability=setting.sampling_probability, seed=seed
        ),
        engine="fast",
        seed=seed,
    )
    for _ in range(setting.steps):
        trainer.step()
    return model


def execute(run: BlackBoxRun) -> dict[str, Any]:
    """Train ``run``'s model; the target's scores on the final model and the seconds (JSON).

    Returns:
        ``{"loss": ..., "logit_margin": ..., "noise_multiplier": ..., "seconds": ...}``.

    Raises:
        InvalidParameterError: a bad run.
    """
    start = time.perf_counter()
    with single_thread():
        model = train(run)
        scores = target_scores(model, *target(run.setting))
    sigma = noise_multiplier(
        run.epsilon, run.setting.delta, run.setting.sampling_probability, run.setting.steps
    )
    return {**scores, "noise_multiplier": sigma, "seconds": time.perf_counter() - start}
