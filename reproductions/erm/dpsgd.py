"""The same L2-regularised logistic regression trained with dpcore's DP-SGD at matched (eps, delta).

sigma is calibrated with the RDP accountant for the Poisson rate q and the step count, so the
run is (epsilon, delta)-DP like the Gaussian output perturbation it is compared with. The model is
nn.Linear(d, 1) without bias (the features carry a constant); per-example gradients of the
logistic loss have norm <= 1 (||x|| = 1, |ell'| <= 1) so clipping at C = 1 never binds. The
lambda/2 ||w||^2 term is left out of the per-example loss (its gradient is data-independent); the
released model is the average of the last half of the iterates (post-processing).
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from dpcore.calibration import calibrate_noise
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer, StepResult


@functools.lru_cache(maxsize=64)
def _calibrated_sigma(epsilon: float, delta: float, q: float, steps: int) -> float:
    return calibrate_noise(
        target_epsilon=epsilon,
        target_delta=delta,
        sampling_probability=q,
        steps=steps,
        accountant="rdp",  # the committed results were calibrated under RDP
    )


def logistic_per_example(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log(1 + exp(-y f(x))) per example."""
    return nn.functional.softplus(-targets * outputs.reshape(-1))


def dpsgd_logistic(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    lot_size: int,
    epochs: int,
    lr: float,
    seed: int,
) -> tuple[np.ndarray, float]:
    """Train with DP-SGD at (epsilon, delta) (RDP accountant); returns (weights, sigma)."""
    n, d = features.shape
    q = lot_size / n
    steps = epochs * max(1, round(1 / q))
    sigma = _calibrated_sigma(epsilon, delta, q, steps)
    torch.manual_seed(seed)
    model = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(model.weight)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=lr,
        inputs=torch.as_tensor(features, dtype=torch.float32),
        targets=torch.as_tensor(labels, dtype=torch.float32),
        loss_fn=logistic_per_example,
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        sampler=PoissonSampler(n, sampling_probability=q, seed=seed),
        engine="fast",
        seed=seed + 1,
    )
    average = np.zeros(d)
    kept = 0

    def accumulate(result: StepResult) -> None:
        nonlocal average, kept
        if result.step > steps // 2:
            average += model.weight.detach().double().numpy().ravel()
            kept += 1

    trainer.train(steps=steps, delta=delta, progress=False, on_step=accumulate)
    spent = trainer.epsilon(delta=delta)
    if spent > epsilon * (1 + 1e-9):  # pragma: no cover - calibration guarantees this
        raise ArithmeticError(f"DP-SGD spent epsilon {spent} > target {epsilon}.")
    return average / kept, sigma
