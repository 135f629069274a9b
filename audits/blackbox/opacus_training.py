"""One run of a black-box audit trained by Opacus 1.6 instead of dpcore (a second implementation).

The same run as :func:`audits.blackbox.training.train`: the same training set, initial
parameters, noise multiplier (dpcore's PLD calibration of the claim), clipping norm C, learning
rate, steps and public divisor, trained with Opacus' ``PrivacyEngine.make_private`` (flat
clipping, per-sample gradients from its hooks, SGD). What Opacus does its own way, and so is
audited too:

- lots: Opacus' Poisson sampler (:class:`opacus.data_loader.DPDataLoader`, each record in a lot
  with probability q; every record at q = 1), seeded from the run's seed. ``make_private`` is
  called with ``poisson_sampling=False`` on that loader: left to itself it would set the rate to
  1 / len(loader) from a batch size, which cannot equal q in both worlds (1,000 and 1,001
  records);
- divisor: ``make_private`` sets ``expected_batch_size = int(len(dataset) * rate)`` (1,000 or
  1,001 at q = 1), replaced by :func:`~audits.blackbox.training.public_divisor`;
- noise: ``torch.normal`` from a generator seeded from the run's seed (float32 draws for float32
  parameters, dpcore draws in float64), added to the clipped sum, then divided by the divisor
  (``loss_reduction="mean"``: the per-sample gradients of the lot's mean loss are scaled back
  by the lot's size, so the step is ``(sum_i clip(g_i) + N(0, sigma^2 C^2)) / divisor``);
- clipping: factor ``min(1, C / (||g_i|| + 1e-6))`` (dpcore: ``min(1, C / ||g_i||)``).

Lots larger than :data:`~audits.blackbox.training.PHYSICAL_BATCH` are processed in parts with
Opacus' skipped steps (as its ``BatchMemoryManager`` does): one noise draw and one step per lot.
Opacus is an audit dependency: dpcore never imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from torch import nn
from torch.utils.data import TensorDataset

from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting, check_run, check_setting
from audits.blackbox.training import (
    PHYSICAL_BATCH,
    BeforeStep,
    initial_state,
    make_model,
    per_example_cross_entropy,
    run_options,
    training_records,
)

__all__ = ["fit", "train"]

#: Opacus' warnings that say nothing about a run: the seeded generators are meant (audits need
#: reproducible runs), and the hooks on the first layer fire without input gradients as usual.
_EXPECTED_WARNINGS = ("Secure RNG turned off", "Full backward hook is firing")


def train(run: BlackBoxRun, *, dtype: torch.dtype = torch.float32, noise: bool = True) -> nn.Module:
    """The final model of ``run`` trained by Opacus (call it with one torch thread), whatever the
    setting's ``implementation``.

    ``dtype`` and ``noise=False`` (noise multiplier 0) are for checks against dpcore; audits
    use the defaults.

    Raises:
        InvalidParameterError: a bad run (see :func:`~audits.blackbox.settings.check_run`).
    """
    options = run_options(check_run(run))
    if not noise:
        options["noise_multiplier"] = 0.0
    return fit(run.setting, *training_records(run), dtype=dtype, **options)


def fit(
    setting: BlackBoxSetting,
    inputs: np.ndarray,
    labels: np.ndarray,
    *,
    seed: int,
    noise_multiplier: float,
    divisor: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    before_step: BeforeStep | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """:func:`audits.blackbox.training.fit` done by Opacus (see the module docstring): the
    setting's model from its initial parameters, trained on ``(inputs, labels)``; the lot's
    loss is the mean of ``loss_fn``'s per-example losses (``loss_reduction="mean"``).

    Raises:
        InvalidParameterError: a bad setting.
    """
    check_setting(setting)
    with warnings.catch_warnings():
        for message in _EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        return _fit(
            setting,
            inputs,
            labels,
            seed=seed,
            sigma=noise_multiplier,
            divisor=divisor,
            loss_fn=loss_fn if loss_fn is not None else per_example_cross_entropy(),
            before_step=before_step,
            dtype=dtype,
        )


def _fit(
    setting: BlackBoxSetting,
    x: np.ndarray,
    y: np.ndarray,
    *,
    seed: int,
    sigma: float,
    divisor: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    before_step: BeforeStep | None,
    dtype: torch.dtype,
) -> nn.Module:
    model = make_model(setting)
    model.load_state_dict(initial_state(setting))
    model.to(dtype)
    lots = torch.Generator().manual_seed(seed)
    draws = torch.Generator().manual_seed(seed ^ 1)  # a second stream for the noise
    loader = DPDataLoader(
        TensorDataset(torch.from_numpy(x).to(dtype), torch.from_numpy(y)),
        sample_rate=setting.sampling_probability,
        generator=lots,
    )
    module, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=setting.lr),
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=setting.max_grad_norm,
        poisson_sampling=False,  # the loader above already draws Poisson lots at rate q
        noise_generator=draws,
        loss_reduction="mean",
    )
    optimizer.expected_batch_size = divisor  # type: ignore[assignment]
    module.train()
    done = 0
    while done < setting.steps:
        for inputs, targets in loader:
            if done == setting.steps:
                break
            if before_step is not None:
                before_step(done, model)
            parts = list(
                zip(inputs.split(PHYSICAL_BATCH), targets.split(PHYSICAL_BATCH), strict=True)
            )
            optimizer.zero_grad()
            for index, (part_x, part_y) in enumerate(parts):
                last = index == len(parts) - 1
                optimizer.signal_skip_step(do_skip=not last)
                loss_fn(module(part_x), part_y).mean().backward()
                optimizer.step()
                if not last:
                    optimizer.zero_grad()  # per-sample gradients go; the clipped sum stays
            done += 1
    module.remove_hooks()
    return model
