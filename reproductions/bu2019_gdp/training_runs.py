"""Training runs of Bu et al. 2019, Sec. 5 (:mod:`reproductions.bu2019_gdp.training`): one task.

:func:`train_private` trains one setting with DP-SGD or DP-Adam (:func:`make_trainer`: exact
per-example clipping on Poisson lots) and records, after every epoch, the test metric and the
privacy spent (:func:`privacy_at`: the CLT's mu, the epsilon of mu-GDP, the RDP epsilon);
:func:`train_baseline` trains the task's non-private baseline. Both save after every epoch when
given a checkpoint path and resume from there.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.accountants import GdpCltAccountant, RdpAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.events import DpEvent
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import models
from reproductions.bu2019_gdp.data import TaskData
from reproductions.bu2019_gdp.settings import Setting
from reproductions.bu2019_gdp.training_setup import (
    STEM,
    TrainingConfig,
    epochs_run,
    sampling_probability,
)
from reproductions.common import finite_or_none


def make_trainer(setting: Setting, data: TaskData, seed: int) -> DPTrainer:
    """DP-SGD or DP-Adam (the setting's optimizer) on a fresh model, Poisson lots of rate q."""
    torch.manual_seed(seed)
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


def privacy_at(
    event: DpEvent, delta: float, *, rdp: bool = True, pld: bool = False
) -> dict[str, float | None]:
    """mu (CLT), epsilon of mu-GDP (approximate) and, if asked, RDP epsilon and PLD interval."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # order-grid notes do not change the bounds
        clt = GdpCltAccountant().compose(event)
        out: dict[str, float | None] = {
            "mu": finite_or_none(clt.mu),
            "epsilon_clt": finite_or_none(float(clt.get_epsilon(delta))),
        }
        if rdp:
            out["epsilon_rdp"] = finite_or_none(RdpAccountant().compose(event).get_epsilon(delta))
        if pld:
            interval = PldAccountant().compose(event).get_epsilon_interval(delta)
            out["epsilon_pld_lower"] = finite_or_none(interval.lower)
            out["epsilon_pld_upper"] = finite_or_none(interval.upper)
    return out


def _load_state(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    record = path.with_suffix(".json")
    if not record.is_file() or not path.with_suffix(".pt").is_file():
        return None
    saved = json.loads(record.read_text())
    same = all(saved.get(k) == json.loads(json.dumps(v)) for k, v in fingerprint.items())
    return saved if same else None


def _save_state(path: Path, state: dict[str, Any], save_pt: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_pt(path.with_suffix(".pt"))
    path.with_suffix(".json").write_text(json.dumps(state, indent=1) + "\n")


def train_private(
    setting: Setting, data: TaskData, config: TrainingConfig, checkpoint: Path | None
) -> tuple[list[dict[str, Any]], DPTrainer]:
    """Train one setting for :func:`epochs_run` epochs; one row per epoch. Resumable."""
    from tqdm import tqdm

    epochs = epochs_run(config, setting)
    trainer = make_trainer(setting, data, config.seed)
    per_epoch = trainer.sampler.steps_per_epoch
    fingerprint = {"setting": dataclasses.asdict(setting), "epochs": epochs, "seed": config.seed}
    state: dict[str, Any] = {"rows": [], **fingerprint}
    saved = _load_state(checkpoint, fingerprint) if checkpoint is not None else None
    if saved is not None and checkpoint is not None:
        trainer.load_checkpoint(checkpoint.with_suffix(".pt"))
        state = saved
    bar = tqdm(
        total=epochs * per_epoch,
        initial=trainer.steps_done,
        desc=f"{STEM} {setting.name}",
        unit="step",
        leave=False,
        disable=None,
    )
    elapsed = state["rows"][-1]["wall_s"] if state["rows"] else 0.0
    while trainer.steps_done < epochs * per_epoch:
        start = time.perf_counter()
        for _ in range(per_epoch):
            trainer.step()
            bar.update(1)
        elapsed += time.perf_counter() - start
        metric = models.evaluate(
            trainer.model, setting.metric, data.x_test, data.y_test, config.eval_batch
        )
        state["rows"].append(
            {
                "task": setting.dataset,
                "setting": setting.name,
                "private": True,
                "epoch": trainer.steps_done // per_epoch,
                "steps": trainer.steps_done,
                "metric": setting.metric,
                "test_metric": metric,
                **privacy_at(trainer.ledger.event(), setting.delta),
                "wall_s": round(elapsed, 2),
            }
        )
        if checkpoint is not None:
            _save_state(checkpoint, state, trainer.save_checkpoint)
    bar.close()
    return state["rows"], trainer


def train_baseline(
    dataset: str,
    setting: Setting,
    data: TaskData,
    epochs: int,
    config: TrainingConfig,
    checkpoint: Path | None,
) -> list[dict[str, Any]]:
    """Non-private: the same model, plain SGD/Adam (``setting``'s) on shuffled batches of q n."""
    seed = config.seed + 99
    torch.manual_seed(seed)
    model = models.build_model(dataset, data.info)
    optimizer_class = torch.optim.Adam if setting.optimizer == "adam" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=setting.learning_rate)
    generator = torch.Generator().manual_seed(seed)
    batch = max(1, round(sampling_probability(setting) * len(data.x_train)))
    loss_fn = nn.CrossEntropyLoss()
    fingerprint = {"setting": dataclasses.asdict(setting), "epochs": epochs, "baseline": True}
    state: dict[str, Any] = {"rows": [], **fingerprint}
    saved = _load_state(checkpoint, fingerprint) if checkpoint is not None else None
    if saved is not None and checkpoint is not None:
        stored = torch.load(checkpoint.with_suffix(".pt"), weights_only=True)
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])
        generator.set_state(stored["generator"])
        state = saved

    def save_pt(path: Path) -> None:
        payload = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(),
        }
        torch.save(payload, path)

    elapsed = state["rows"][-1]["wall_s"] if state["rows"] else 0.0
    for epoch in range(len(state["rows"]) + 1, epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(data.x_train), generator=generator)
        for first in range(0, len(order) - batch + 1, batch):
            rows = order[first : first + batch]
            optimizer.zero_grad()
            loss_fn(model(data.x_train[rows]), data.y_train[rows]).backward()
            optimizer.step()
        elapsed += time.perf_counter() - start
        state["rows"].append(
            {
                "task": dataset,
                "setting": "non-private",
                "private": False,
                "epoch": epoch,
                "steps": epoch * (len(order) // batch),
                "metric": setting.metric,
                "test_metric": models.evaluate(
                    model, setting.metric, data.x_test, data.y_test, config.eval_batch
                ),
                "mu": None,
                "epsilon_clt": None,
                "epsilon_rdp": None,
                "wall_s": round(elapsed, 2),
            }
        )
        if checkpoint is not None:
            _save_state(checkpoint, state, save_pt)
    rows_done: list[dict[str, Any]] = state["rows"]
    return rows_done
