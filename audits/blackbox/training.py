"""One run of a black-box audit: train with dpcore's DP-SGD, score the target on the final model.

The model starts from the setting's initial parameters (the same in every run: pre-trained
non-privately on records disjoint from the subset for the worst case, else the seeded random
initialisation), is trained with DP-SGD on the subset (plus the target in the "in" world) with
Poisson lots and the noise multiplier that dpcore's PLD calibration gives the claimed epsilon at
the setting's delta, q and steps, and only the final model's outputs on the target are kept.

The noisy sum is divided by a public constant, :func:`public_divisor` (q times the subset's
size), the same in both worlds: dividing by q N with N the training set's own size would
change the divisor with the target's presence (1,000 or 1,001), a difference the DP analysis
does not cover (it assumes the released gradient is the noisy sum over a fixed divisor).
Opacus runs (``implementation="opacus"``) train in :mod:`audits.blackbox.opacus_training`
from the same initial parameters, noise multiplier, clipping norm and divisor.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from audits import results_io
from audits.blackbox.data import pretraining_records, subset, target
from audits.blackbox.scores import target_scores
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting, check_run, check_setting
from audits.dpsgd_whitebox import single_thread
from dpcore.atomic import atomic_write_bytes
from dpcore.calibration import calibrate_noise
from dpcore.runs import code_fingerprint
from dpcore.torch.models import tf_privacy_mnist_cnn
from dpcore.torch.noise import NoiseSource
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer

__all__ = [
    "PHYSICAL_BATCH",
    "BeforeStep",
    "execute",
    "fit",
    "initial_state",
    "make_model",
    "noise_multiplier",
    "per_example_cross_entropy",
    "public_divisor",
    "run_options",
    "run_seed",
    "train",
]

#: Adam's learning rate for the non-private pre-training (full batch).
PRETRAIN_LR = 1e-2
#: Examples clipped at a time (a lot above it is clipped in parts: one noise draw, one step),
#: so that full-batch steps on the whole of MNIST fit in memory.
PHYSICAL_BATCH = 5000


class _NoNoise(NoiseSource):
    """Zeros: training without noise (``train(..., noise=False)``, for implementation checks)."""

    name = "none"

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=device)


def make_model(setting: BlackBoxSetting) -> nn.Module:
    """The setting's model with torch's default initialisation seeded by ``setting.seed``."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(check_setting(setting).seed)
    try:
        if setting.model == "linear":
            return nn.Linear(784, 10)
        if setting.model == "cnn":  # the records are flat (784,): unflattened to (1, 28, 28)
            return nn.Sequential(
                nn.Unflatten(1, (1, 28, 28)), *tf_privacy_mnist_cnn(setting.hidden)
            )
        return nn.Sequential(
            nn.Linear(784, setting.hidden), nn.ReLU(), nn.Linear(setting.hidden, 10)
        )
    finally:
        torch.random.set_rng_state(generator_state)


def initial_state(setting: BlackBoxSetting) -> dict[str, torch.Tensor]:
    """The parameters every run of ``setting`` starts from (computed once per process).

    Worst case: the seeded model pre-trained with full-batch Adam for ``pretrain_steps`` on
    :func:`~audits.blackbox.data.pretraining_records` (one torch thread, so every process gets
    the same bits); random: the seeded model as built. The setting's name and implementation do
    not enter: dpcore and Opacus runs start alike. Pre-trained parameters are also kept on disk
    (:func:`state_file`): the CNN's take about five minutes of one core, and every worker of
    every process pool would otherwise compute them again.
    """
    return _initial_state(dataclasses.replace(setting, name="-", implementation="dpcore"))


#: The code that determines pre-trained initial parameters (it keys the files on disk).
STATE_SOURCES = ("audits.blackbox.training", "audits.blackbox.data", "dpcore.torch.models")


def state_file(setting: BlackBoxSetting) -> Path:
    """Where the pre-trained initial parameters of ``setting`` are kept:
    ``audits/results/runs/initial_states/<key>.pt`` (git-ignored), the key a hash of the
    setting's fields (name and implementation aside), the torch version and the code of
    :data:`STATE_SOURCES`."""
    fields = dataclasses.asdict(dataclasses.replace(setting, name="-", implementation="dpcore"))
    text = json.dumps(fields, sort_keys=True) + torch.__version__
    key = code_fingerprint(*STATE_SOURCES, extra=text)
    return results_io.RUNS / "initial_states" / f"{key}.pt"


def _load_state(path: Path, model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The state saved at ``path`` if it is one of ``model``'s (same names, shapes, dtypes,
    finite values), else None (unreadable or damaged files are recomputed)."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception:  # missing, truncated or not a state: computed again
        return None
    expected = model.state_dict()
    if not isinstance(state, dict) or set(state) != set(expected):
        return None
    for name, value in expected.items():
        saved = state[name]
        if (
            not isinstance(saved, torch.Tensor)
            or saved.shape != value.shape
            or saved.dtype != value.dtype
            or not bool(torch.isfinite(saved).all())
        ):
            return None
    return state


@functools.cache
def _initial_state(setting: BlackBoxSetting) -> dict[str, torch.Tensor]:
    model = make_model(setting)
    if setting.init == "worst_case":
        path = state_file(setting)
        saved = _load_state(path, model)
        if saved is not None:
            return saved
        x, y = pretraining_records(setting)
        inputs, labels = torch.from_numpy(x), torch.from_numpy(y)
        optimizer = torch.optim.Adam(model.parameters(), lr=PRETRAIN_LR)
        with single_thread():
            for _ in range(setting.pretrain_steps):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(inputs), labels).backward()
                optimizer.step()
        state = {name: value.detach().clone() for name, value in model.state_dict().items()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
        return state
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


def public_divisor(setting: BlackBoxSetting) -> float:
    """The divisor of every run's noisy sum: ``sampling_probability * subset_size``.

    A public constant fixed by the setting before any record is seen, the same in both worlds
    (the expected lot size of the "out" world's training set); not q times the size of the
    run's own training set, which is one larger in the "in" world.
    """
    check_setting(setting)
    return setting.sampling_probability * setting.subset_size


def run_seed(run: BlackBoxRun) -> int:
    """The seed of a run's noise and lots, in [0, 2**63): a hash (numpy's SeedSequence) of the
    setting's seed, the claim, the world and the run's seed, so that no two runs of different
    worlds, claims or setting seeds share noise draws."""
    entropy = [run.setting.seed, run.seed, int(run.world == "in"), round(run.epsilon * 1e6)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


def training_records(run: BlackBoxRun) -> tuple[np.ndarray, np.ndarray]:
    """The run's training set: the subset, then the target in the "in" world."""
    x, y = subset(check_run(run).setting)
    if run.world == "in":
        tx, ty = target(run.setting)
        x, y = np.concatenate([x, tx]), np.concatenate([y, ty])
    return x, y


#: What a training calls before each step: ``before_step(step, model)`` (step from 0).
BeforeStep = Callable[[int, nn.Module], None]


def per_example_cross_entropy() -> nn.Module:
    """The runs' default loss: cross-entropy per example (``reduction="none"``)."""
    return nn.CrossEntropyLoss(reduction="none")


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
    noise: bool = True,
) -> nn.Module:
    """Train the setting's model from :func:`initial_state` on ``(inputs, labels)`` with the
    setting's implementation: dpcore's :meth:`DPTrainer.dp_sgd` or Opacus 1.6
    (:func:`audits.blackbox.opacus_training.fit`); call it with one torch thread.

    Every audit of this package trains through here: Poisson lots at the setting's q seeded by
    ``seed``, ``setting.steps`` steps of SGD at ``setting.lr``, clipping to
    ``setting.max_grad_norm``, noise ``noise_multiplier * C`` (none with ``noise=False``: checks
    against other implementations), the noisy sum divided by the public constant ``divisor``
    (the same in both worlds; not q times the run's own training set).

    Args:
        setting: model, initial parameters, q, steps, lr, C and the implementation.
        inputs, labels: the training set, (n, 784) float32 and (n,) int64.
        seed: the run's seed (lots and noise).
        noise_multiplier: sigma.
        divisor: the public divisor of the noisy sum.
        loss_fn: per-example losses ``(outputs, labels) -> (n,)`` (default: cross-entropy).
        before_step: called before each step with its index and the model.
        dtype: the parameters' and inputs' dtype.
        noise: False to train without noise.

    Raises:
        InvalidParameterError: a bad setting.
    """
    check_setting(setting)
    if loss_fn is None:
        loss_fn = per_example_cross_entropy()
    if setting.implementation == "opacus":
        from audits.blackbox import opacus_training

        return opacus_training.fit(
            setting,
            inputs,
            labels,
            seed=seed,
            noise_multiplier=noise_multiplier if noise else 0.0,
            divisor=divisor,
            loss_fn=loss_fn,
            before_step=before_step,
            dtype=dtype,
        )
    model = make_model(setting)
    model.load_state_dict(initial_state(setting))
    model.to(dtype)
    trainer = DPTrainer.dp_sgd(
        model,
        lr=setting.lr,
        inputs=torch.from_numpy(inputs).to(dtype),
        targets=torch.from_numpy(labels),
        loss_fn=loss_fn,
        noise_multiplier=noise_multiplier,
        max_grad_norm=setting.max_grad_norm,
        sampler=PoissonSampler(
            len(labels), sampling_probability=setting.sampling_probability, seed=seed
        ),
        engine="fast",
        noise=None if noise else _NoNoise(),
        seed=seed,
        max_physical_batch_size=PHYSICAL_BATCH,
    )
    # DPTrainer divides by its sampler's expected lot size, q * len(labels): q (N + 1) in the
    # "in" world of a multi-run audit, q times the included canaries in a one-run audit.
    trainer.optimizer.expected_batch_size = divisor
    for step in range(setting.steps):
        if before_step is not None:
            before_step(step, model)
        trainer.step()
    return model


def train(run: BlackBoxRun, *, dtype: torch.dtype = torch.float32, noise: bool = True) -> nn.Module:
    """The final model of ``run`` (one torch thread), trained by dpcore whatever the setting's
    ``implementation`` (:func:`execute` dispatches on it; Opacus' own run:
    :func:`audits.blackbox.opacus_training.train`).

    ``dtype`` and ``noise=False`` are for checks against other implementations (float64, no
    noise); audits use the defaults.

    Raises:
        InvalidParameterError: a bad run (see :func:`~audits.blackbox.settings.check_run`).
    """
    setting = dataclasses.replace(check_run(run).setting, implementation="dpcore")
    return fit(setting, *training_records(run), dtype=dtype, noise=noise, **run_options(run))


def run_options(run: BlackBoxRun) -> dict[str, Any]:
    """:func:`fit`'s ``seed``, ``noise_multiplier`` and ``divisor`` for a multi-run audit's run:
    its seed, the claim's sigma and the public divisor."""
    setting = run.setting
    return {
        "seed": run_seed(run),
        "noise_multiplier": noise_multiplier(
            run.epsilon, setting.delta, setting.sampling_probability, setting.steps
        ),
        "divisor": public_divisor(setting),
    }


def execute(run: BlackBoxRun) -> dict[str, Any]:
    """Train ``run``'s model with the setting's implementation (dpcore: :func:`train`; Opacus:
    :func:`audits.blackbox.opacus_training.train`); the target's scores on the final model and
    the seconds (JSON).

    Returns:
        ``{"loss": ..., "logit_margin": ..., "noise_multiplier": ..., "seconds": ...}``.

    Raises:
        InvalidParameterError: a bad run.
    """
    start = time.perf_counter()
    with single_thread():
        model = fit(run.setting, *training_records(check_run(run)), **run_options(run))
        scores = target_scores(model, *target(run.setting))
    sigma = noise_multiplier(
        run.epsilon, run.setting.delta, run.setting.sampling_probability, run.setting.steps
    )
    return {**scores, "noise_multiplier": sigma, "seconds": time.perf_counter() - start}
