"""Bu, Dong, Long, Su (2019/2020), Sec. 5: DP training of the four tasks, accounted with the CLT.

For every :class:`~reproductions.bu2019_gdp.settings.Setting` (the paper's noise multiplier sigma,
lot size, learning rate, clipping norm, optimizer and epochs), the task's model
(:mod:`~reproductions.bu2019_gdp.models`) is trained with :class:`~dpcore.torch.training.DPTrainer`
on Poisson lots (exact per-example clipping, engine ``"fast"``). After every epoch we record the
test accuracy (RMSE for MovieLens), the CLT's mu (Bu et al. Thm 5 / Cor. 5: mu = q sqrt(T
(e^{1/sigma^2} - 1))), the epsilon of mu-GDP at the setting's delta (an approximation, not a
bound) and the RDP epsilon; at the end the certified PLD interval. A non-private baseline (same
model, plain SGD/Adam with the same learning rate on shuffled batches, same epochs) is trained per
task.

Sampling rate: the setting's rate on our data, q = ``local_lot_size / local_n``. MNIST and IMDb
are the paper's data; Adult is the UCI split (32,561 rows, lot 256, so q is 256/32,561 instead of
the paper's 256/29,305); MovieLens-100K (80,000 training ratings) replaces ML-1M with a lot of
1,000, which keeps the paper's q = 0.0125, hence its mu per epoch, but puts ten times the paper's
relative noise on the averaged gradient.

Profiles: ``full`` runs every setting for the paper's epochs (resumable from checkpoints under
``reproductions/checkpoints/bu2019_training/``); ``quick`` runs the first setting of each task
for a few epochs (labelled "quick" in the table). :func:`compute` saves ``figures/
bu2019_training.{json,csv}`` and ``figures/bu2019_training_<task>_privacy.json``; :func:`plot`
(:mod:`~reproductions.bu2019_gdp.training_report`) draws from the saved JSON only.
"""

from __future__ import annotations

import dataclasses
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.accountants import GdpCltAccountant, RdpAccountant
from dpcore.accountants.pld import PldAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import DpEvent, dpsgd_event
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from reproductions.bu2019_gdp import models
from reproductions.bu2019_gdp.data import LOADERS, TaskData, subsample
from reproductions.bu2019_gdp.settings import SETTINGS, Setting
from reproductions.common import FIGURES, ROOT, finite_or_none, save_results

STEM = "bu2019_training"
CHECKPOINTS = ROOT / "reproductions" / "checkpoints" / STEM

#: Task order in tables and figures, with what one training record is (the privacy unit).
PRIVACY_UNITS = {
    "mnist": "one image",
    "imdb": "one review",
    "adult": "one person's census record",
    "movielens": "one rating (rating-level privacy, as in the paper; a user's ratings together "
    "are not protected as one unit)",
}
#: Non-private results the paper prints: Table 4's "non-private networks", RMSE 0.893 after
#: 20 epochs on ML-1M. No non-private number of the other tasks is transcribed in
#: :mod:`~reproductions.bu2019_gdp.settings`, so they show as n/a.
PAPER_NON_PRIVATE: dict[str, float] = {"movielens": 0.893}


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """One profile.

    Attributes:
        profile: ``"quick"`` or ``"full"`` (or a test's name).
        settings: names of the settings to run; ``None``: all (full) or the first per task.
        epochs: epochs run per dataset; a dataset absent here runs each setting's paper epochs.
        train_subset / test_subset: rows kept per dataset (random, fixed seed); absent = all.
        baseline: whether to train the non-private baseline of each task.
        seed: base seed of models, samplers and noise.
        checkpoint: save after every epoch and resume (the full profile).
        eval_batch: rows per evaluation batch.
    """

    profile: str = "quick"
    settings: tuple[str, ...] | None = None
    epochs: dict[str, int] = dataclasses.field(default_factory=dict)
    train_subset: dict[str, int] = dataclasses.field(default_factory=dict)
    test_subset: dict[str, int] = dataclasses.field(default_factory=dict)
    baseline: bool = True
    seed: int = 0
    checkpoint: bool = False
    eval_batch: int = 4096


PROFILES = {
    # The first setting of each task for a few epochs: about 4 minutes on 2 shared CPU cores.
    "quick": TrainingConfig(epochs={"mnist": 2, "imdb": 2, "adult": 3, "movielens": 3}),
    "full": TrainingConfig(profile="full", checkpoint=True),
}


def selected_settings(
    config: TrainingConfig, catalogue: Sequence[Setting] = SETTINGS
) -> list[Setting]:
    """The settings run: the named ones, else all (full) or the first of each task."""
    if config.settings is not None:
        known = {setting.name for setting in catalogue}
        unknown = sorted(set(config.settings) - known)
        if unknown or not config.settings:
            raise InvalidParameterError("settings", f"names among {sorted(known)}", unknown)
        return [setting for setting in catalogue if setting.name in config.settings]
    if config.profile == "full":
        return list(catalogue)
    first: dict[str, Setting] = {}
    for setting in catalogue:
        first.setdefault(setting.dataset, setting)
    return list(first.values())


def epochs_run(config: TrainingConfig, setting: Setting) -> int:
    """Epochs this profile runs for ``setting`` (the paper's unless the profile overrides)."""
    epochs = config.epochs.get(setting.dataset, setting.epochs)
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise InvalidParameterError("epochs", "a positive integer per dataset", epochs)
    return epochs


def sampling_probability(setting: Setting) -> float:
    """The Poisson rate on our data, ``local_lot_size / local_n`` (see the module docstring)."""
    return setting.local_sampling_probability


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


def load_task(
    dataset: str, config: TrainingConfig, loaders: dict[str, Callable[[], TaskData]] | None
) -> TaskData:
    """The dataset (a test may pass its own loaders), subsampled as the profile says."""
    loader = (loaders or LOADERS)[dataset]
    return subsample(
        loader(),
        train=config.train_subset.get(dataset),
        test=config.test_subset.get(dataset),
        seed=config.seed,
    )


def compute(
    profile: str = "quick",
    *,
    config: TrainingConfig | None = None,
    loaders: dict[str, Callable[[], TaskData]] | None = None,
    catalogue: Sequence[Setting] = SETTINGS,
) -> None:
    """Train every selected setting and each task's baseline; save results and statements.

    ``config``, ``loaders`` and ``catalogue`` replace the profile, the data loaders and
    :data:`~reproductions.bu2019_gdp.settings.SETTINGS` (tests use tiny ones).
    """
    if config is None:
        if profile not in PROFILES:
            raise InvalidParameterError("profile", f"in {sorted(PROFILES)}", profile)
        config = PROFILES[profile]
    settings = selected_settings(config, catalogue)
    wall = time.perf_counter()
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    FIGURES.mkdir(parents=True, exist_ok=True)
    for dataset in [d for d in PRIVACY_UNITS if any(s.dataset == d for s in settings)]:
        data = load_task(dataset, config, loaders)
        mine = [s for s in settings if s.dataset == dataset]
        statements: dict[str, Any] = {}
        for setting in mine:
            slug = setting.name.lower().replace(" ", "_")
            checkpoint = CHECKPOINTS / config.profile / slug if config.checkpoint else None
            run_rows, trainer = train_private(setting, data, config, checkpoint)
            rows += run_rows
            # The paper's schedule on the paper's data (comparable with its printed mu), and
            # the paper's epochs on our data (what the full profile spends).
            paper_event = dpsgd_event(
                sampling_probability=setting.sampling_probability,
                noise_multiplier=setting.noise_multiplier,
                steps=setting.steps,
            )
            full_event = dpsgd_event(
                sampling_probability=sampling_probability(setting),
                noise_multiplier=setting.noise_multiplier,
                steps=setting.epochs * trainer.sampler.steps_per_epoch,
            )
            statement = trainer.privacy_statement(
                delta=setting.delta,
                accountants=("rdp", "pld", "gdp_clt"),
                task=dataset,
                setting=setting.name,
                model=f"{setting.model} ({models.parameter_count(trainer.model):,} parameters)",
                optimizer=setting.optimizer,
                learning_rate=setting.learning_rate,
                privacy_unit=PRIVACY_UNITS[dataset],
            )
            final = privacy_at(trainer.ledger.event(), setting.delta, rdp=False, pld=True)
            final["epsilon_rdp"] = finite_or_none(float(statement["epsilon"]["rdp"]["epsilon"]))
            statement["clt_mu"] = final["mu"]
            statement["pld_interval"] = [final["epsilon_pld_lower"], final["epsilon_pld_upper"]]
            statements[setting.name] = statement
            summary[setting.name] = {
                "task": dataset,
                "setting": dataclasses.asdict(setting),
                "epochs_run": run_rows[-1]["epoch"],
                "lot_size_ours": trainer.sampler.expected_lot_size,
                "dataset_size_ours": len(data.x_train),
                "test_size_ours": len(data.x_test),
                "parameters": models.parameter_count(trainer.model),
                "test_metric": run_rows[-1]["test_metric"],
                "privacy_run": final,
                "privacy_paper_schedule": privacy_at(paper_event, setting.delta, rdp=False),
                "privacy_paper_epochs_ours": privacy_at(
                    full_event, setting.delta, rdp=False, pld=True
                ),
            }
            print(f"{STEM} {setting.name}: {run_rows[-1]['test_metric']:.4f}", flush=True)
        path = FIGURES / f"{STEM}_{dataset}_privacy.json"
        path.write_text(json.dumps(statements, indent=2, sort_keys=True, default=str) + "\n")
        if config.baseline:
            epochs = max(epochs_run(config, s) for s in mine)
            checkpoint = CHECKPOINTS / config.profile / f"{dataset}_baseline"
            base = train_baseline(
                dataset, mine[0], data, epochs, config, checkpoint if config.checkpoint else None
            )
            rows += base
            summary[f"{dataset}:non-private"] = {
                "task": dataset,
                "epochs_run": epochs,
                "test_metric": base[-1]["test_metric"],
                "paper_metric": PAPER_NON_PRIVATE.get(dataset),
            }
    save_results(
        STEM,
        config=config,
        rows=rows,
        extra={
            "seed": config.seed,
            "hardware": f"{torch.get_num_threads()} torch threads, CPU",
            "torch": torch.__version__,
            "wall_time_s": round(time.perf_counter() - wall, 1),
            "summary": summary,
        },
    )


def plot() -> None:
    """Figures and README table from the saved JSON (see :mod:`.training_report`)."""
    from reproductions.bu2019_gdp.training_report import plot as draw

    draw()
