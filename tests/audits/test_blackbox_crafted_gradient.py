"""The crafted-gradient (hidden-state) audit: the crafted gradient through dpcore's DP-SGD, the
score's epsilon, refusals, soundness and power at a small scale, executors, results and report."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from audits import results_io
from audits.blackbox import crafted_audit, crafted_gradient, training
from audits.blackbox.crafted_audit import CraftedProfile, audit_setting, statistic_epsilon
from audits.blackbox.crafted_gradient import (
    CRAFTED_LABEL,
    PIXEL_VALUE,
    CraftedLoss,
    CraftedRun,
    CraftedSetting,
)
from audits.blackbox.settings import BlackBoxSetting
from dpcore.accountants import PldAccountant
from dpcore.errors import InvalidParameterError
from dpcore.events import dpsgd_event
from dpcore.mechanisms.gaussian import gdp_epsilon
from dpcore.runs import RunStore
from tests.audits.saved_results import as_if_written_at

TINY_BASE = BlackBoxSetting(
    name="tiny",
    subset_size=40,
    pretrain_size=200,
    pretrain_steps=20,
    steps=6,
    lr=0.5,
    max_grad_norm=0.7,
    target_label=3,
)
TINY = CraftedSetting("tiny, every step", base=TINY_BASE)


def _moved(setting: CraftedSetting, world: str, seed: int = 0) -> float:  # linear model
    """How far the crafted weight W[k, j] moved in a noiseless training."""
    model = crafted_gradient.train(CraftedRun(setting, 4.0, world, seed), noise=False)
    k, j = setting.base.target_label, crafted_gradient.zero_pixel(setting.base)
    start = training.initial_state(setting.base)["weight"][k, j]
    return float(model.get_parameter("weight").detach()[k, j] - start)


@pytest.mark.parametrize("period", [1, 4])
def test_a_crafted_gradient_of_norm_10_c_moves_the_weight_by_lr_c_over_the_divisor(
    period: int,
) -> None:
    """Noise off, full batch: each chosen step adds lr C' / (q N) with C' = C PIXEL_VALUE /
    sqrt(PIXEL_VALUE^2 + 1) (C up to 5e-9): the gradient of norm 10 C was clipped to C by the
    engine, summed and divided by the public divisor q N; without it nothing moves."""
    setting = dataclasses.replace(TINY, period=period, norm=10.0)
    base = setting.base
    assert crafted_gradient.zero_pixel(base) == 0  # MNIST's corner pixel is always 0
    step = base.lr * base.max_grad_norm / base.subset_size
    clipped = PIXEL_VALUE / math.sqrt(PIXEL_VALUE**2 + 1)
    chosen = crafted_gradient.inserted_steps(base.steps, period)
    assert chosen == (6 if period == 1 else 2)
    assert _moved(setting, "in") == pytest.approx(chosen * step * clipped, rel=1e-6)
    assert _moved(setting, "out") == 0.0
    unclipped = dataclasses.replace(setting, norm=1.0)
    assert _moved(unclipped, "in") == pytest.approx(chosen * step * clipped, rel=1e-6)


def test_opacus_moves_the_crafted_weight_like_dpcore() -> None:
    """Opacus 1.6 trains the same crafted record through its own hooks, clipping (factor
    C / (||g|| + 1e-6)) and divisor: the weight moves by the same amount to 1e-6."""
    base = dataclasses.replace(TINY_BASE, implementation="opacus")
    setting = dataclasses.replace(TINY, base=base, norm=10.0)
    step = base.lr * base.max_grad_norm / base.subset_size
    clipped = PIXEL_VALUE / math.sqrt(PIXEL_VALUE**2 + 1)
    assert _moved(setting, "in") == pytest.approx(6 * step * clipped, rel=1e-6)
    assert _moved(setting, "out") == 0.0


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "mlp", "hidden": 16},
        {"model": "cnn"},
        {"model": "cnn", "implementation": "opacus"},
    ],
)
def test_on_deeper_models_the_crafted_gradient_moves_the_parameters_along_its_direction(
    changes: dict[str, Any],
) -> None:
    """MLP and CNN (dpcore and Opacus), noise off: the crafted record's gradient has norm
    ``norm * C`` at the initial parameters (so it is clipped to C) and the score -- the move
    along d_0 -- is larger "in" than "out" by up to one clipped step per chosen step: less, as
    its direction drifts (the probe's smallest cosine says how much) and the other records'
    gradients push back on the class-k logit it raises (at this tiny scale, lr 0.5 on 40
    records: 0.96 of it for the MLP, 0.65 for the CNN)."""
    base = dataclasses.replace(TINY_BASE, **changes)
    setting = dataclasses.replace(TINY, base=base, period=2)
    direction = crafted_gradient.crafted_direction(setting)
    assert sum(float(v.pow(2).sum()) for v in direction.values()) == pytest.approx(1.0)
    gap = []
    for world in ("in", "out"):
        model = crafted_gradient.train(CraftedRun(setting, 4.0, world, 0), noise=False)
        gap.append(crafted_gradient.score(setting, model))
    unit = base.lr * base.max_grad_norm / base.subset_size
    chosen = crafted_gradient.inserted_steps(base.steps, 2)
    assert 0.5 * chosen * unit < gap[0] - gap[1] <= 1.001 * chosen * unit
    result = crafted_gradient.execute(CraftedRun(setting, 4.0, "in", 0))
    assert 0.7 < result["cosine"] <= 1.0 + 1e-9 and result["norm"] >= 1.0
    assert math.isfinite(result["projection"])


def test_the_linear_models_crafted_gradient_does_not_drift() -> None:
    result = crafted_gradient.execute(CraftedRun(TINY, 4.0, "in", 0))
    assert result["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert result["norm"] == pytest.approx(TINY.norm, rel=1e-9)


def test_with_poisson_lots_the_weight_moves_by_whole_steps_when_the_record_was_drawn() -> None:
    base = dataclasses.replace(TINY_BASE, sampling_probability=0.5, steps=8)
    setting = dataclasses.replace(TINY, base=base, norm=10.0)
    unit = base.lr * base.max_grad_norm / (0.5 * base.subset_size)
    counts = [_moved(setting, "in", seed) / unit for seed in range(6)]
    rounded = np.round(counts)
    np.testing.assert_allclose(counts, rounded, atol=1e-5)
    assert all(0 <= b <= 8 for b in rounded) and len(set(rounded)) > 1


def test_the_crafted_loss_gives_the_crafted_record_its_crafted_gradient_only() -> None:
    loss = CraftedLoss(class_index=2, scale=0.25)
    outputs = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([4, CRAFTED_LABEL, 7])
    loss(outputs, labels).sum().backward()
    assert outputs.grad is not None
    expected = torch.zeros(10, dtype=torch.float64)
    expected[2] = -0.25
    torch.testing.assert_close(outputs.grad[1], expected)
    real = torch.nn.functional.cross_entropy(outputs[[0, 2]], labels[[0, 2]], reduction="none")
    torch.testing.assert_close(loss(outputs, labels)[[0, 2]], real)
    loss.active = False
    outputs.grad = None
    loss(outputs, labels).sum().backward()
    assert not outputs.grad[1].any()


def test_crafted_record_is_zero_but_at_a_pixel_no_record_touches() -> None:
    image, label = crafted_gradient.crafted_record(TINY)
    assert image.shape == (1, 784) and label.tolist() == [CRAFTED_LABEL]
    assert np.flatnonzero(image).tolist() == [0] and image[0, 0] == PIXEL_VALUE


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"period": 0}, "period"),
        ({"period": 1.5}, "period"),
        ({"norm": 0.5}, "norm"),
        ({"norm": math.inf}, "norm"),
        ({"name": ""}, "name"),
        ({"base": dataclasses.replace(TINY_BASE, model="resnet")}, "model"),
        ({"base": dataclasses.replace(TINY_BASE, steps=0)}, "steps"),
        ({"base": dataclasses.replace(TINY_BASE, implementation="tf")}, "implementation"),
    ],
)
def test_bad_settings_are_refused_by_name(changes: dict[str, Any], parameter: str) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        crafted_gradient.check_crafted_setting(dataclasses.replace(TINY, **changes))
    assert raised.value.parameter == parameter


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [({"world": "both"}, "world"), ({"epsilon": -1.0}, "epsilon"), ({"seed": -1}, "seed")],
)
def test_bad_runs_are_refused_by_name(changes: dict[str, Any], parameter: str) -> None:
    run = dataclasses.replace(CraftedRun(TINY, 4.0, "in", 0), **changes)
    with pytest.raises(InvalidParameterError) as raised:
        crafted_gradient.execute(run)
    assert raised.value.parameter == parameter


@pytest.mark.parametrize(
    ("epsilon", "runs", "parameter"),
    [(4.0, 7, "runs_per_world"), (math.nan, 8, "epsilon"), (-1.0, 8, "epsilon")],
)
def test_bad_audit_arguments_are_refused_before_any_run(
    epsilon: float, runs: int, parameter: str, tmp_path: Path
) -> None:
    store = RunStore(tmp_path, code="refused")
    with pytest.raises(InvalidParameterError) as raised:
        audit_setting(TINY, epsilon, runs, run_store=store, progress=False)
    assert raised.value.parameter == parameter
    assert not any(tmp_path.iterdir())
    with pytest.raises(InvalidParameterError) as profile:
        crafted_audit.run("huge", progress=False)
    assert profile.value.parameter == "profile"


@pytest.mark.parametrize(
    ("keyword", "value"),
    [("sampling_probability", 0.0), ("noise_multiplier", 0.0), ("period", 0), ("delta", 1.0)],
)
def test_statistic_epsilon_refuses_bad_arguments(keyword: str, value: float) -> None:
    arguments: dict[str, Any] = {
        "sampling_probability": 0.5,
        "noise_multiplier": 1.0,
        "steps": 10,
        "period": 1,
        "delta": 1e-5,
    }
    with pytest.raises(InvalidParameterError) as raised:
        statistic_epsilon(**{**arguments, keyword: value})
    assert raised.value.parameter == keyword


def _pld_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    event = dpsgd_event(sampling_probability=q, noise_multiplier=sigma, steps=steps)
    return float(PldAccountant().compose(event).get_epsilon(delta))


def test_statistic_epsilon_is_the_accountants_at_every_step_and_less_otherwise() -> None:
    sigma, steps, delta = 2.0, 50, 1e-5
    every = statistic_epsilon(
        sampling_probability=1.0, noise_multiplier=sigma, steps=steps, period=1, delta=delta
    )
    assert every == pytest.approx(gdp_epsilon(mu=math.sqrt(steps) / sigma, delta=delta))
    assert every == pytest.approx(_pld_epsilon(1.0, sigma, steps, delta), rel=0.01)
    fifth = statistic_epsilon(
        sampling_probability=1.0, noise_multiplier=sigma, steps=steps, period=5, delta=delta
    )
    assert fifth == pytest.approx(gdp_epsilon(mu=10 / (sigma * math.sqrt(steps)), delta=delta))
    # one step of Poisson subsampling: the score is the subsampled Gaussian mechanism itself
    one = statistic_epsilon(
        sampling_probability=0.1, noise_multiplier=0.8, steps=1, period=1, delta=delta
    )
    assert one == pytest.approx(_pld_epsilon(0.1, 0.8, 1, delta), rel=0.01)
    many = statistic_epsilon(
        sampling_probability=0.1, noise_multiplier=0.84, steps=100, period=1, delta=delta
    )
    assert 0 < many < 0.8 * _pld_epsilon(0.1, 0.84, 100, delta)
    tenth = statistic_epsilon(
        sampling_probability=0.1, noise_multiplier=0.84, steps=100, period=10, delta=delta
    )
    assert 0 <= tenth < many
    assert (
        statistic_epsilon(
            sampling_probability=0.01, noise_multiplier=50.0, steps=4, period=1, delta=0.5
        )
        == 0.0
    )


def test_an_under_noised_training_is_flagged(tmp_path: Path) -> None:
    """The tiny setting trained with the noise of eps = 40 while eps = 1 is claimed (a planted
    calibration bug): the bound exceeds the claim."""
    store = RunStore(tmp_path, code="power")
    row = audit_setting(TINY, 40.0, 32, run_store=store, progress=False)
    assert row["epsilon_lower"] > 1.0


def test_correctly_noised_trainings_stay_below_the_certified_epsilon(tmp_path: Path) -> None:
    store = RunStore(tmp_path, code="soundness")
    poisson = dataclasses.replace(TINY_BASE, sampling_probability=0.5)
    for setting, epsilon in [
        (TINY, 1.0),
        (TINY, 10.0),
        (dataclasses.replace(TINY, period=3), 4.0),
        (dataclasses.replace(TINY, base=poisson, period=2), 10.0),
    ]:
        row = audit_setting(setting, epsilon, 24, run_store=store, progress=False)
        assert 0 <= row["epsilon_lower"] <= row["certified_epsilon"] <= epsilon
        assert row["statistic_epsilon"] <= row["certified_epsilon"] * 1.01


def _without_timing(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("run_seconds", "wall_seconds")}


def test_spawned_processes_give_the_same_row(tmp_path: Path) -> None:
    local = audit_setting(
        TINY, 4.0, 8, run_store=RunStore(tmp_path / "local", code="x"), progress=False
    )
    spawned_store = RunStore(tmp_path / "spawned", code="x")
    spawned = audit_setting(
        TINY, 4.0, 8, executor="processes:2", run_store=spawned_store, progress=False
    )
    assert _without_timing(spawned) == _without_timing(local)
    assert all(spawned_store.has(spec) for spec in crafted_audit.runs_of(TINY, 4.0, 8))
    seeds = {crafted_gradient.noise_seed(run) for run in crafted_audit.runs_of(TINY, 4.0, 8)}
    seeds.add(
        crafted_gradient.noise_seed(CraftedRun(dataclasses.replace(TINY, period=2), 4.0, "in", 0))
    )
    assert len(seeds) == 17


def test_the_command_line_runs_the_quick_profile_and_writes_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audits.__main__ import main

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    tiny = CraftedProfile("quick", ((TINY, 8, (4.0,)),))
    monkeypatch.setitem(crafted_audit.PROFILES, "quick", tiny)
    assert main(["--only", "blackbox_crafted", "--profile", "quick"]) == 0
    (row,) = json.loads((tmp_path / "blackbox_crafted_quick.json").read_text())
    assert row["profile"] == "quick" and row["epsilon"] == 4.0 and row["period"] == 1
    assert row["ratio"] == pytest.approx(row["epsilon_lower"] / row["certified_epsilon"])
    meta = json.loads((tmp_path / "blackbox_crafted_quick.meta.json").read_text())
    assert meta["config"]["wall_seconds"] > 0 and "hardware" in meta["config"]
    text = (tmp_path / "blackbox_crafted_quick.md").read_text()
    assert "| tiny, every step | 1 | 1 | 6 | 4 |" in text and "Cebere" in text
    assert not (tmp_path / "blackbox_crafted.json").exists()
    again = crafted_audit.run(chosen=tiny, progress=False)  # read back from the run store
    assert again[0]["epsilon_lower"] == row["epsilon_lower"]


def test_chosen_settings_replace_their_own_rows_and_keep_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``setting_names``: only the matching settings are audited; their rows replace the saved
    ones of the same (setting, claim), the others stay with the commit they were measured at."""
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    other = dataclasses.replace(TINY, name="tiny, every 3rd step", period=3)
    plan = CraftedProfile("quick", ((TINY, 8, (4.0,)), (other, 8, (4.0, 10.0))))
    first = crafted_audit.run(chosen=plan, progress=False)
    assert [row["setting_name"] for row in first] == [TINY.name, other.name, other.name]
    as_if_written_at(tmp_path, "blackbox_crafted_quick", "0" * 40)
    again = crafted_audit.run(chosen=plan, setting_names=["3rd"], progress=False)
    assert [row["epsilon"] for row in again] == [4.0, 10.0]
    saved = json.loads((tmp_path / "blackbox_crafted_quick.json").read_text())
    assert [row["setting_name"] for row in saved] == [TINY.name, other.name, other.name]
    assert saved[0]["commit"] == "0" * 40 and saved[1]["commit"] != "0" * 40
    crafted_audit.write_report("blackbox_crafted_quick")
    text = (tmp_path / "blackbox_crafted_quick.md").read_text()
    assert f"Rows of {TINY.name}: commit `{'0' * 40}`" in text
    with pytest.raises(InvalidParameterError) as unknown:
        crafted_audit.run(chosen=plan, setting_names=["CNN"], progress=False)
    assert unknown.value.parameter == "setting_names"


def test_profiles_refuse_too_few_runs_or_no_claims() -> None:
    with pytest.raises(InvalidParameterError) as few:
        CraftedProfile("bad", ((TINY, 7, (4.0,)),))
    assert few.value.parameter == "runs per world"
    with pytest.raises(InvalidParameterError) as none:
        CraftedProfile("bad", ((TINY, 8, ()),))
    assert none.value.parameter == "epsilons"
    assert set(crafted_audit.PROFILES) == {"quick", "full"}


def test_a_checkpoint_carries_finished_runs_to_a_fresh_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full profile's run bundle (``python -m audits --profile full`` passes
    :data:`crafted_audit.CHECKPOINT`): written after every row, read back into an empty store,
    after which no run is trained again and the rows are the same."""
    import shutil

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    monkeypatch.setattr(results_io, "RUNS", tmp_path / "runs")
    plan = CraftedProfile("tiny", ((TINY, 8, (4.0, 10.0)),))
    bundle = tmp_path / "checkpoints" / "blackbox_crafted.jsonl"
    first = crafted_audit.run(chosen=plan, checkpoint=bundle, progress=False)
    assert len(bundle.read_text().splitlines()) == 2 * 2 * 8
    shutil.rmtree(tmp_path / "runs")  # a fresh checkout: no run store

    def never(run: CraftedRun) -> object:
        raise AssertionError(f"{run} trained again")

    monkeypatch.setattr(crafted_gradient, "execute", never)
    again = crafted_audit.run(chosen=plan, checkpoint=bundle, progress=False)
    timing = ("run_seconds", "wall_seconds", "created")
    assert [{k: v for k, v in row.items() if k not in timing} for row in again] == [
        {k: v for k, v in row.items() if k not in timing} for row in first
    ]
    from audits.__main__ import CHECKPOINTS

    assert CHECKPOINTS["blackbox_crafted"] == crafted_audit.CHECKPOINT
