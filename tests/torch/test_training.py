"""The trainer: kill-and-resume reproduces a straight run, empty lots, noise drift, statements."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from scipy import stats
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.errors import IncompatibleModelError, NonFiniteGradientError
from dpcore.torch.samplers import (
    BallsInBinsSampler,
    PoissonMismatchWarning,
    PoissonSampler,
    ShuffledBatchSampler,
)
from dpcore.torch.training import DPTrainer, accuracy

FALSE_REJECTION = 1e-5


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(n, 4, generator=generator, dtype=torch.float64)
    targets = (inputs[:, 0] > 0).long()
    return inputs, targets


def _trainer(
    kind: str = "sgd", engine: str = "vmap", q: float = 0.25, **kwargs: object
) -> DPTrainer:
    torch.manual_seed(kwargs.pop("init_seed", 0))  # type: ignore[arg-type]
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    inputs, targets = _data()
    options: dict[str, object] = {
        "inputs": inputs,
        "targets": targets,
        "loss_fn": nn.CrossEntropyLoss(reduction="none"),
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
        "sampler": PoissonSampler(len(targets), sampling_probability=q, seed=3),
        "engine": engine,
        "seed": 11,
    } | kwargs
    if engine == "jl":
        options.setdefault("jl_dimension", 4)
    if kind == "sgd":
        return DPTrainer.dp_sgd(model, lr=0.5, momentum=0.9, **options)  # type: ignore[arg-type]
    return DPTrainer.dp_adam(model, lr=0.01, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "engine"),
    [("sgd", "vmap"), ("sgd", "fast"), ("sgd", "loop"), ("adam", "auto"), ("adam", "jl")],
)
def test_kill_and_resume_matches_a_straight_run(kind: str, engine: str, tmp_path: Path) -> None:
    straight = _trainer(kind, engine)
    straight.train(steps=10, delta=1e-5, progress=False)
    first = _trainer(kind, engine)
    first.train(steps=4, delta=1e-5, progress=False)
    first.save_checkpoint(tmp_path / "run.pt")
    del first  # the process "dies"; a new one is built with a different initialisation
    resumed = _trainer(kind, engine, init_seed=99)
    resumed.load_checkpoint(tmp_path / "run.pt")
    assert resumed.steps_done == 4
    resumed.train(steps=6, delta=1e-5, progress=False)
    assert resumed.ledger == straight.ledger
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_empty_lots_add_noise_and_advance_the_ledger() -> None:
    trainer = _trainer(q=1e-4)  # expected lot size 0.0064: almost every lot is empty
    before = [p.detach().clone() for p in trainer.model.parameters()]
    results = trainer.train(steps=3, delta=1e-5, progress=False)
    assert [r.lot_size for r in results] == [0, 0, 0]
    assert all(math.isnan(r.loss) for r in results)
    assert trainer.ledger.steps == 3
    moved = [not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)]
    assert all(moved)


def test_zero_gradients_drift_by_sigma_c_lr_over_q_n() -> None:
    """A loss with zero gradient: one SGD step moves each coordinate by N(0, (lr s C / qN)^2).

    z-test of the mean and chi-square of the variance over the 8 * 200 + 8 + ... coordinates,
    1e-5 in total."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(200, 8), nn.Linear(8, 2)).double()
    inputs = torch.randn(100, 200, dtype=torch.float64)
    targets = torch.zeros(100, dtype=torch.long)

    def zero_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return 0.0 * outputs.sum(dim=1)

    lr, sigma, clip, q = 0.3, 2.0, 0.7, 0.1
    trainer = DPTrainer.dp_sgd(
        model,
        lr=lr,
        inputs=inputs,
        targets=targets,
        loss_fn=zero_loss,
        noise_multiplier=sigma,
        max_grad_norm=clip,
        sampler=PoissonSampler(100, sampling_probability=q, seed=0),
        engine="vmap",
        seed=5,
    )
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    trainer.step()
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    standardised = (after - before) / (lr * sigma * clip / (q * 100))
    n = standardised.numel()
    assert abs(float(standardised.mean()) * math.sqrt(n)) < stats.norm.isf(FALSE_REJECTION / 4)
    low, high = stats.chi2.ppf([FALSE_REJECTION / 4, 1 - FALSE_REJECTION / 4], df=n)
    assert low < float(standardised.square().sum()) < high


def test_training_learns_and_reports_epsilon(tmp_path: Path) -> None:
    trainer = _trainer(q=0.5, noise_multiplier=0.5)
    results = trainer.train(steps=40, delta=1e-5, progress=True)
    assert results[-1].step == 40
    assert accuracy(trainer.model(trainer.inputs), trainer.targets) > 0.8
    statement = trainer.save_statement(tmp_path / "privacy.json", delta=1e-5)
    saved = json.loads((tmp_path / "privacy.json").read_text())
    assert saved == json.loads(json.dumps(statement))
    assert saved["sampler"] == "poisson" and saved["matches_poisson_analysis"] is True
    assert saved["steps"] == 40 and saved["jl"] is False
    rdp, pld = saved["epsilon"]["rdp"]["epsilon"], saved["epsilon"]["pld"]["epsilon"]
    assert 0 < pld <= rdp * (1 + 1e-9)
    assert saved["run"]["max_grad_norm"] == 1.0 and saved["run"]["engine"] == "vmap"
    assert saved["library_commit"]


def test_shuffled_batches_are_flagged_in_the_statement() -> None:
    with pytest.warns(PoissonMismatchWarning):
        sampler = ShuffledBatchSampler(64, batch_size=16, seed=0)
    trainer = _trainer(sampler=sampler)
    trainer.train(steps=2, delta=1e-5, progress=False)
    statement = trainer.privacy_statement(delta=1e-5)
    assert statement["matches_poisson_analysis"] is False
    assert "epsilon" not in statement
    assert statement["epsilon_if_poisson_sampled"]["rdp"]["epsilon"] > 0
    lower = statement["shuffled_epsilon_lower_bound"]
    assert lower["kind"] == "lower_bound" and lower["epsilon"] > 0


def test_balls_in_bins_is_accounted_per_epoch_and_resumes(tmp_path: Path) -> None:
    def build() -> DPTrainer:
        return _trainer(sampler=BallsInBinsSampler(64, steps_per_epoch=4, seed=0))

    straight = build()
    straight.train(steps=6, delta=1e-5, progress=False)
    first = build()
    first.train(steps=3, delta=1e-5, progress=False)
    first.save_checkpoint(tmp_path / "run.pt")
    resumed = build()
    resumed.load_checkpoint(tmp_path / "run.pt")
    resumed.train(steps=3, delta=1e-5, progress=False)
    assert resumed.ledger == straight.ledger
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.equal(a, b)
    statement = straight.privacy_statement(delta=1e-5)
    assert statement["sampler"] == "balls_in_bins"
    assert statement["epsilon"]["rdp"]["epsilon"] > 0
    assert "unsupported" in statement["epsilon"]["pld"]  # named, not silently skipped


def test_jl_steps_are_recorded_and_not_accounted_as_gaussian() -> None:
    trainer = _trainer(engine="jl", jl_dimension=5)
    trainer.train(steps=2, delta=1e-5, progress=True)
    statement = trainer.privacy_statement(delta=1e-5)
    assert statement["jl"] is True and statement["run"]["jl_dimension"] == 5
    assert statement["epsilon"]["rdp"]["epsilon"] is None
    assert "JLGaussianEvent" in statement["epsilon"]["rdp"]["unsupported"]
    assert statement["events"]["events"][0]["event"]["event"]["jl_dimension"] == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_multiplier": 0.0}, "Expected noise_multiplier > 0"),
        ({"max_grad_norm": -1.0}, "Expected max_grad_norm > 0"),
        ({"engine": "jl", "jl_dimension": 0}, "Expected jl_dimension"),
        ({"engine": "vmap", "jl_dimension": 3}, "Expected jl_dimension to be given exactly"),
        ({"engine": "ghost"}, "Expected engine in"),
        ({"sampler": PoissonSampler(10, sampling_probability=0.5)}, "Expected sampler to sample"),
    ],
)
def test_bad_trainer_input(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        _trainer(**kwargs)


def test_bad_learning_rate() -> None:
    with pytest.raises(InvalidParameterError, match="Expected lr > 0"):
        DPTrainer.dp_sgd(nn.Linear(2, 2), lr=0.0)
    with pytest.raises(InvalidParameterError, match="Expected lr > 0"):
        DPTrainer.dp_adam(nn.Linear(2, 2), lr=-1.0)


def test_batch_norm_is_rejected_when_wrapping() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    inputs, targets = _data()
    with pytest.raises(IncompatibleModelError, match="Module '1' is BatchNorm1d"):
        DPTrainer.dp_sgd(
            model,
            lr=0.1,
            inputs=inputs,
            targets=targets,
            loss_fn=nn.CrossEntropyLoss(reduction="none"),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            sampler=PoissonSampler(64, sampling_probability=0.1),
        )


def test_nan_gradients_raise_by_default() -> None:
    trainer = _trainer(q=1.0)
    trainer.inputs = trainer.inputs.clone()
    trainer.inputs[0, 0] = math.nan
    with pytest.raises(NonFiniteGradientError):
        trainer.step()
    assert trainer.ledger.steps == 0  # nothing was released


def test_a_process_killed_by_sigkill_resumes_to_the_same_run(tmp_path: Path) -> None:
    """Three processes: uninterrupted; killed (SIGKILL) after a checkpoint at step 4; resumed."""
    import subprocess
    import sys

    worker = Path(__file__).with_name("resume_worker.py")
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    for mode in ("straight", "crash", "resume"):
        done = subprocess.run(
            [sys.executable, str(worker), str(tmp_path), mode], env=env, capture_output=True
        )
        assert done.returncode == (-9 if mode == "crash" else 0), done.stderr.decode()[-2000:]
    straight = torch.load(tmp_path / "straight.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resume.pt", weights_only=True)
    assert resumed["ledger"] == straight["ledger"]
    for a, b in zip(resumed["parameters"], straight["parameters"], strict=True):
        assert torch.equal(a, b)


def test_train_validates_its_arguments_before_stepping() -> None:
    trainer = _trainer()
    with pytest.raises(InvalidParameterError, match="Expected delta"):
        trainer.train(steps=3, delta=0.0, progress=False)
    with pytest.raises(InvalidParameterError, match="Expected accountant in"):
        trainer.train(steps=3, delta=1e-5, accountant="moments_v2", progress=False)
    with pytest.raises(InvalidParameterError, match="Expected steps"):
        trainer.train(steps=-1, delta=1e-5, progress=False)
    assert trainer.ledger.steps == 0


def test_progress_bar_reads_the_requested_accountant(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trainer()
    trainer.train(steps=10, delta=1e-3, progress=True, accountant="pld")
    expected = f"eps(pld)={trainer.epsilon(delta=1e-3, accountant='pld'):.3g}"
    assert expected in capsys.readouterr().err


def _bins_trainer(drawn: int) -> DPTrainer:
    """N = 40, T = 2, sigma = 0.5 on a balls-in-bins sampler that already drew ``drawn`` lots."""
    sampler = BallsInBinsSampler(40, steps_per_epoch=2, seed=0)
    for _ in range(drawn):
        sampler.sample()
    inputs, targets = _data(40)
    return _trainer(sampler=sampler, inputs=inputs, targets=targets, noise_multiplier=0.5)


def _two_full_epochs_epsilon() -> float:
    from dpcore.torch.ledger import PrivacyLedger

    ledger = PrivacyLedger(dataset_size=40, sampler="balls_in_bins", steps_per_epoch=2)
    for _ in range(4):
        ledger.record(sampling_probability=0.5, noise_multiplier=0.5)
    return ledger.epsilon(delta=1e-5, accountant="rdp")


def test_item1_balls_in_bins_on_a_sampler_that_drew_a_lot_counts_both_started_epochs(
    tmp_path: Path,
) -> None:
    trainer = _bins_trainer(drawn=1)
    trainer.train(steps=2, delta=1e-5, progress=False)  # lots 1 and 2: epochs 0 and 1
    two_epochs = _two_full_epochs_epsilon()
    assert trainer.ledger.epochs == 2
    # balls-in-bins has the RDP rule only (the default PLD accountant refuses it)
    assert trainer.epsilon(delta=1e-5, accountant="rdp") == pytest.approx(two_epochs, rel=1e-12)
    assert two_epochs > 15  # was reported as one epoch: 10.1
    first = _bins_trainer(drawn=1)  # a resumed run counts the same
    first.step()
    first.save_checkpoint(tmp_path / "run.pt")
    resumed = _bins_trainer(drawn=1)
    resumed.load_checkpoint(tmp_path / "run.pt")
    resumed.step()
    assert resumed.ledger == trainer.ledger
    assert resumed.epsilon(delta=1e-5, accountant="rdp") == trainer.epsilon(
        delta=1e-5, accountant="rdp"
    )


def _snapshot(trainer: DPTrainer) -> tuple[object, ...]:
    import copy

    return (
        [p.detach().clone() for p in trainer.model.parameters()],
        copy.deepcopy(trainer.optimizer.optimizer.state_dict()),
        copy.deepcopy(trainer.sampler.state_dict()),
        trainer.ledger.state_dict(),
        trainer.optimizer.noise.state_dict(),
    )


def _assert_unchanged(before: tuple[object, ...], after: tuple[object, ...]) -> None:
    from tests.torch.test_misuse import assert_same

    assert_same(before, after)


def test_item4_parameters_added_or_frozen_after_construction_are_refused_before_the_step() -> None:
    trainer = _trainer()
    trainer.step()
    extra = nn.Linear(2, 2).double()
    trainer.optimizer.optimizer.add_param_group({"params": list(extra.parameters())})
    before = _snapshot(trainer)
    with pytest.raises(InvalidParameterError, match="added since"):
        trainer.step()
    _assert_unchanged(before, _snapshot(trainer))
    with pytest.raises(InvalidParameterError, match="added since"):  # DPOptimizer.step as well
        trainer.optimizer.step(trainer.engine.clipped_sum(*_data(3), trainer.loss_fn))
    _assert_unchanged(before, _snapshot(trainer))
    trainer.optimizer.optimizer.param_groups.pop()
    before = _snapshot(trainer)
    first = trainer.model[0].weight  # type: ignore[index]
    first.requires_grad_(False)
    with pytest.raises(InvalidParameterError, match=r"frozen since: \['0.weight'\]"):
        trainer.step()
    _assert_unchanged(before, _snapshot(trainer))
    first.requires_grad_(True)
    trainer.step()
    assert trainer.ledger.steps == 2


def test_item5_a_noise_multiplier_changed_under_balls_in_bins_is_refused_before_the_step() -> None:
    trainer = _bins_trainer(drawn=0)
    trainer.step()
    trainer.optimizer.noise_multiplier = 2.0
    before = _snapshot(trainer)
    with pytest.raises(InvalidParameterError, match="to stay as recorded"):
        trainer.step()
    _assert_unchanged(before, _snapshot(trainer))  # no noise drawn, no lot drawn, no step
    trainer.optimizer.noise_multiplier = 0.5
    trainer.step()
    assert trainer.ledger.steps == 2 and trainer.sampler.lots_drawn == 2


def test_item5_a_lot_whose_clipping_fails_is_drawn_again_so_ledger_and_sampler_agree() -> None:
    trainer = _trainer(q=1.0)
    clean = trainer.inputs
    trainer.inputs = clean.clone()
    trainer.inputs[0, 0] = math.nan
    before = _snapshot(trainer)
    with pytest.raises(NonFiniteGradientError):
        trainer.step()
    _assert_unchanged(before, _snapshot(trainer))
    trainer.inputs = clean
    trainer.step()
    assert trainer.ledger.steps == 1 and trainer.ledger.next_lot == trainer.sampler.lots_drawn


def test_one_default_accountant_names_pld_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    """The bar, epsilon() and the statement all report the PLD certified bound, named."""
    trainer = _trainer()
    trainer.train(steps=10, delta=1e-3, progress=True)
    spent = trainer.epsilon(delta=1e-3)
    assert spent == trainer.ledger.epsilon(delta=1e-3, accountant="pld")
    assert spent < trainer.epsilon(delta=1e-3, accountant="rdp")
    assert f"eps(pld)={spent:.3g}" in capsys.readouterr().err
    statement = trainer.privacy_statement(delta=1e-3)
    assert statement["default_accountant"] == "pld"
    assert statement["epsilon"]["pld"]["epsilon"] == spent


def _planned_trainer(policy: str) -> DPTrainer:
    """Calibrated to epsilon = 2 over 2 epochs of 4 lots."""
    return _trainer(
        noise_multiplier=None, target_epsilon=2.0, target_delta=1e-5, epochs=2, budget=policy
    )


def test_budget_resumed_at_an_epochs_last_lot_stops_or_warns_a_third_epoch(
    tmp_path: Path,
) -> None:
    from dpcore.calibration import calibrate_noise
    from dpcore.torch.budget import BudgetExceededError, BudgetExceededWarning

    trainer = _planned_trainer("stop")
    assert len(trainer.sampler) == 4
    assert trainer.optimizer.noise_multiplier == calibrate_noise(
        target_epsilon=2.0, target_delta=1e-5, sampling_probability=0.25, steps=8
    )
    trainer.train(steps=8, delta=1e-5, progress=False)  # the plan: no warning
    trainer.save_checkpoint(tmp_path / "run.pt")
    resumed = _planned_trainer("stop")
    resumed.load_checkpoint(tmp_path / "run.pt")
    before = _snapshot(resumed)
    with pytest.raises(BudgetExceededError, match="Step 9 would take epsilon"):
        resumed.train(steps=4, delta=1e-5, progress=False)
    _assert_unchanged(before, _snapshot(resumed))  # nothing drawn, moved or recorded
    warned = _planned_trainer("warn")
    warned.load_checkpoint(tmp_path / "run.pt")
    with pytest.warns(BudgetExceededWarning, match=r"past the planned target_epsilon = 2"):
        warned.train(steps=4, delta=1e-5, progress=False)
    assert warned.ledger.steps == 12
    assert warned.epsilon(delta=1e-5) > 2.0


@pytest.mark.parametrize(
    ("options", "parameter"),
    [
        ({"noise_multiplier": None}, "noise_multiplier"),
        ({"target_epsilon": 2.0}, "target_delta"),
        ({"target_epsilon": 2.0, "target_delta": 1e-5, "engine": "jl"}, "target_epsilon"),
        ({"budget": "halt"}, "budget"),
    ],
)
def test_budget_arguments_are_refused_before_anything_is_built(
    options: dict[str, object], parameter: str
) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        _trainer(**options)
    assert caught.value.parameter == parameter


def test_train_takes_epochs_of_len_sampler_lots() -> None:
    trainer = _trainer()  # q = 0.25: 4 lots per epoch
    results = trainer.train(epochs=2, delta=1e-5, progress=False)
    assert len(results) == trainer.ledger.steps == 2 * len(trainer.sampler) == 8
    for arguments in ({}, {"steps": 1, "epochs": 1}):
        with pytest.raises(InvalidParameterError, match="given exactly when epochs is not"):
            trainer.train(delta=1e-5, progress=False, **arguments)  # type: ignore[arg-type]
    assert trainer.ledger.steps == 8
