"""Training runs of Bu et al. 2019, Sec. 5 (:mod:`reproductions.bu2019_gdp.training`): one run.

A run is a :class:`RunSpec` (the setting, epochs, seed, private or the non-private baseline,
subsets) executed by :func:`execute` on the harness (:mod:`reproductions.harness`): DP-SGD or
DP-Adam with exact per-example clipping on Poisson lots (:func:`make_trainer`), or the same model
with plain SGD/Adam on shuffled batches of the expected lot size (:func:`make_baseline`). After
every epoch a row records the test metric and, for private runs, the privacy spent so far
(:func:`privacy_at`: the CLT's mu, the epsilon of mu-GDP, the RDP epsilon). Runs are resumable
and keyed by spec and code (:data:`CODE_MODULES`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.accountants.report import epsilon_report
from dpcore.events import DpEvent
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import models
from reproductions.bu2019_gdp.data import TaskData
from reproductions.bu2019_gdp.settings import Setting
from reproductions.bu2019_gdp.training_setup import STEM, sampling_probability
from reproductions.common import code_fingerprint
from reproductions.harness import (
    NonPrivateTrainer,
    RunState,
    Trainable,
    evaluate,
    run_training,
    torch_seeded,
)

#: The code a run's result depends on: a change here starts its runs afresh.
CODE_MODULES = (
    "dpcore.torch",
    "dpcore.accountants",
    "dpcore.events",
    "dpcore.pld",
    "dpcore.data",
    "reproductions.harness",
    "reproductions.bu2019_gdp.models",
    "reproductions.bu2019_gdp.data",
    "reproductions.bu2019_gdp.training_runs",
)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run: everything its result depends on (data apart from the subsets)."""

    setting: Setting
    epochs: int
    seed: int
    private: bool = True
    train_subset: int | None = None
    test_subset: int | None = None
    eval_batch: int = 4096

    @property
    def label(self) -> str:
        """``<setting name>`` or ``<dataset>_baseline``."""
        return self.setting.name if self.private else f"{self.setting.dataset}_baseline"


def make_trainer(setting: Setting, data: TaskData, seed: int) -> DPTrainer:
    """DP-SGD or DP-Adam (the setting's optimizer) on a fresh model, Poisson lots of rate q."""
    with torch_seeded(seed):
        model = models.build_model(setting.dataset, data.info)
    factory = DPTrainer.dp_adam if setting.optimizer == "adam" else DPTrainer.dp_sgd
    return factory(
        model,
        lr=setting.learning_rate,
        inputs=data.x_train,
        targets=data.y_train,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=setting.noise_multiplier,
        max_grad_norm=setting.max_grad_norm,
        sampler=PoissonSampler(
            len(data.x_train), sampling_probability=sampling_probability(setting), seed=seed
        ),
        engine="fast",
        seed=seed + 7919,
    )


def make_baseline(setting: Setting, data: TaskData, seed: int) -> NonPrivateTrainer:
    """The same model, plain SGD/Adam (the setting's, same learning rate), batches of q n."""
    seed = seed + 99
    with torch_seeded(seed):
        model = models.build_model(setting.dataset, data.info)
    optimizer = torch.optim.Adam if setting.optimizer == "adam" else torch.optim.SGD
    return NonPrivateTrainer(
        model,
        data.x_train,
        data.y_train,
        optimizer=lambda params: optimizer(params, lr=setting.learning_rate),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=max(1, round(sampling_probability(setting) * len(data.x_train))),
        seed=seed,
    )


def privacy_at(
    event: DpEvent, delta: float, *, rdp: bool = True, pld: bool = False
) -> dict[str, float | None]:
    """mu (CLT), epsilon of mu-GDP (approximate) and, if asked, RDP epsilon and PLD interval."""
    names = ("gdp_clt",) + (("rdp",) if rdp else ()) + (("pld",) if pld else ())
    report = epsilon_report(event, delta, names)
    out = {"mu": report["mu_clt"], "epsilon_clt": report["epsilon_gdp_clt"]}
    if rdp:
        out["epsilon_rdp"] = report["epsilon_rdp"]
    if pld:
        out["epsilon_pld_lower"] = report["epsilon_pld_lower"]
        out["epsilon_pld_upper"] = report["epsilon_pld_upper"]
    return out


def code() -> str:
    """The fingerprint of :data:`CODE_MODULES`."""
    return code_fingerprint(*CODE_MODULES)


def execute(
    spec: RunSpec,
    data: TaskData,
    store: Path | None,
    *,
    fingerprint: str | None = None,
    deadline: float | None = None,
) -> tuple[RunState, Trainable]:
    """Train ``spec`` for its epochs (one row per epoch), resuming from ``store`` if saved."""
    setting = spec.setting
    trainer: DPTrainer | NonPrivateTrainer
    if spec.private:
        trainer = make_trainer(setting, data, spec.seed)
        per_epoch = trainer.sampler.steps_per_epoch
    else:
        trainer = make_baseline(setting, data, spec.seed)
        per_epoch = trainer.steps_per_epoch
    state = RunState.open(store, spec, fingerprint or code())

    def measure(current: Trainable) -> dict[str, Any]:
        metric = evaluate(
            current.model,
            data.x_test,
            data.y_test,
            metric=setting.metric,
            batch=spec.eval_batch,
        )
        if isinstance(current, DPTrainer):
            privacy = privacy_at(current.ledger.event(), setting.delta)
        else:
            privacy = {"mu": None, "epsilon_clt": None, "epsilon_rdp": None}
        return {"test_metric": metric, **privacy}

    run_training(
        trainer,
        state,
        steps=spec.epochs * per_epoch,
        eval_every=per_epoch,
        per_epoch=per_epoch,
        measure=measure,
        row={
            "task": setting.dataset,
            "setting": setting.name if spec.private else "non-private",
            "private": spec.private,
            "seed": spec.seed,
            "metric": setting.metric,
        },
        deadline=deadline,
        label=f"{STEM} {spec.label}",
    )
    return state, trainer
