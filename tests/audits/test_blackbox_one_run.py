"""The one-run black-box audit: inputs refused by name, the bounds it reports, power against an
under-noised training, no bound above a correct claim, and the same rows on every executor."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from audits import results_io
from audits.blackbox import one_run, one_run_report, training
from audits.blackbox.one_run import OneRunSetting, OneRunSpec, Profile, decide
from audits.blackbox.settings import BlackBoxSetting
from dpcore.auditing import one_run_epsilon_lower_bound
from dpcore.auditing.one_run_fdp import one_run_gdp_lower_bound
from dpcore.errors import InvalidParameterError
from dpcore.torch.training import DPTrainer
from tests.audits.saved_results import as_if_written_at

TINY_BASE = BlackBoxSetting(
    name="tiny", subset_size=40, pretrain_size=200, pretrain_steps=20, steps=4
)
TINY = OneRunSetting("tiny", "orthogonal", "least_likely", 20, 2, base=TINY_BASE)
#: The quick profile's first (strongest) setting.
QUICK = one_run.PROFILES["quick"].settings[0]


@pytest.mark.parametrize(
    ("changes", "parameter"),
    [
        ({"design": "blank"}, "design"),
        ({"labels": "true"}, "labels"),
        ({"canaries": 1}, "canaries"),
        ({"canaries": 785, "guesses_each_side": 10}, "canaries"),
        ({"guesses_each_side": 0}, "guesses_each_side"),
        ({"guesses_each_side": 11}, "guesses_each_side"),
        ({"design": "sparse", "pixels": 785}, "pixels"),
        ({"base": dataclasses.replace(TINY_BASE, steps=0)}, "steps"),
    ],
)
def test_bad_settings_are_refused_by_name(changes: dict[str, Any], parameter: str) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        one_run.check_setting(dataclasses.replace(TINY, **changes))
    assert raised.value.parameter == parameter


@pytest.mark.parametrize(
    ("epsilon", "seed", "parameter"),
    [(0.0, 0, "epsilon"), (float("inf"), 0, "epsilon"), (1.0, -1, "seed")],
)
def test_bad_specs_are_refused_before_training(
    epsilon: float, seed: int, parameter: str, audit_run_stores: Path
) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        one_run.audit(TINY, epsilon, seed, run_store=one_run.store())
    assert raised.value.parameter == parameter
    if parameter == "epsilon":
        with pytest.raises(InvalidParameterError) as raised:
            one_run.run(chosen=Profile("bad", (TINY,), (epsilon,)), progress=False)
        assert raised.value.parameter == parameter
    assert not audit_run_stores.exists() or not any(audit_run_stores.rglob("*.json"))


def test_unknown_profiles_are_refused_by_name() -> None:
    with pytest.raises(InvalidParameterError) as raised:
        one_run.run("huge")
    assert raised.value.parameter == "profile"
    with pytest.raises(InvalidParameterError) as raised:
        Profile("no seeds", (TINY,), (1.0,), seeds=0)
    assert raised.value.parameter == "seeds"


@pytest.mark.parametrize(
    ("scores", "bits", "k", "parameter"),
    [
        ([1.0, 2.0], [0, 1, 1], 1, "scores and bits"),
        ([1.0, float("nan")], [0, 1], 1, "scores"),
        ([1.0, 2.0], [0, 2], 1, "bits"),
        ([1.0, 2.0], [0, 1], 2, "guesses_each_side"),
        ([1.0, 2.0], [0, 1], 0, "guesses_each_side"),
    ],
)
def test_bad_outcomes_are_refused_by_name(
    scores: list[float], bits: list[int], k: int, parameter: str
) -> None:
    with pytest.raises(InvalidParameterError) as raised:
        decide(scores, bits, guesses_each_side=k, delta=1e-5, gdp=True)
    assert raised.value.parameter == parameter


def test_decision_counts_guesses_and_gives_the_library_bounds() -> None:
    rng = np.random.default_rng(0)
    bits = rng.random(400) < 0.5
    scores = bits + rng.normal(scale=0.7, size=400)
    row = decide(scores, bits.astype(int), guesses_each_side=40, delta=1e-5, gdp=True)
    order = np.argsort(scores)
    assert row["correct"] == int(bits[order[-40:]].sum() + (~bits[order[:40]]).sum())
    assert row["canaries"] == 400 and row["guesses"] == 80 and row["confidence_each"] == 0.975
    outcome = {"canaries": 400, "guesses": 80, "correct": row["correct"], "delta": 1e-5}
    steinke = one_run_epsilon_lower_bound(**outcome, confidence=0.975)
    gdp = one_run_gdp_lower_bound(**outcome, confidence=0.975)
    assert row["epsilon_lower_steinke"] == steinke.epsilon_lower > 0
    assert row["epsilon_lower_gdp"] == gdp.epsilon_lower > steinke.epsilon_lower
    assert row["mu_lower_gdp"] == gdp.mu_lower
    alone = decide(scores, bits.astype(int), guesses_each_side=40, delta=1e-5, gdp=False)
    assert alone["epsilon_lower_gdp"] is None and alone["confidence_each"] == 0.95
    wider = one_run_epsilon_lower_bound(**outcome, confidence=0.95)
    assert alone["epsilon_lower_steinke"] == wider.epsilon_lower > steinke.epsilon_lower


def test_canaries_are_as_designed_and_bits_are_the_same_at_every_claim() -> None:
    images, labels = one_run.canaries(TINY)
    np.testing.assert_allclose(images @ images.T, 784.0 * np.eye(20), atol=1e-2)
    model = training.make_model(TINY_BASE)
    model.load_state_dict(training.initial_state(TINY_BASE))
    with torch.no_grad():
        assert labels.tolist() == model(torch.from_numpy(images)).argmin(1).tolist()
    sparse, random_labels = one_run.canaries(
        dataclasses.replace(TINY, design="sparse", labels="random", pixels=5)
    )
    assert (sparse.sum(1) == 5).all() and set(np.unique(sparse)) == {0.0, 1.0}
    assert random_labels.min() >= 0 and random_labels.max() <= 9
    dense, _ = one_run.canaries(dataclasses.replace(TINY, design="dense"))
    assert set(np.unique(dense)) == {-1.0, 1.0}
    spec = OneRunSpec(TINY, 1.0, 3)
    bits = one_run.bits(spec)
    assert np.array_equal(bits, one_run.bits(dataclasses.replace(spec, epsilon=8.0)))
    others = [
        dataclasses.replace(spec, seed=4),
        dataclasses.replace(spec, setting=dataclasses.replace(TINY, labels="random")),
        dataclasses.replace(spec, setting=dataclasses.replace(TINY, design="dense")),
    ]
    assert not any(np.array_equal(bits, one_run.bits(other)) for other in others)
    noise = {one_run.noise_seed(s) for s in [spec, dataclasses.replace(spec, epsilon=8.0), *others]}
    assert len(noise) == 5 and all(0 <= seed < 2**63 for seed in noise)
    assert one_run.public_divisor(TINY) == 40 + 20 / 2  # q (subset + m / 2), whatever the bits


def test_the_noisy_sum_is_divided_by_the_public_constant(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs whose bits include different numbers of canaries divide by one constant."""
    seen: list[float] = []
    step = DPTrainer.step

    def recording(self: Any) -> Any:
        seen.append(self.optimizer.expected_batch_size)
        return step(self)

    monkeypatch.setattr(DPTrainer, "step", recording)
    counts = {int(one_run.bits(OneRunSpec(TINY, 4.0, seed)).sum()): seed for seed in range(20)}
    assert len(counts) > 1
    for seed in list(counts.values())[:2]:
        one_run.execute(OneRunSpec(TINY, 4.0, seed))
    assert seen == [one_run.public_divisor(TINY)] * (2 * TINY_BASE.steps)


@pytest.mark.parametrize(
    "changes",
    [{"implementation": "opacus"}, {"model": "cnn"}, {"model": "cnn", "implementation": "opacus"}],
)
def test_opacus_and_the_cnn_train_the_same_canaries_and_bits(changes: dict[str, Any]) -> None:
    """The base setting's implementation and model train the run: same bits, canaries and
    sigma as dpcore's linear run, its own final model (so its own scores); an under-noised run
    (eps = 40 claimed as its sigma) separates the worlds."""
    setting = dataclasses.replace(TINY, base=dataclasses.replace(TINY_BASE, **changes))
    spec, ours = OneRunSpec(setting, 4.0, 0), OneRunSpec(TINY, 4.0, 0)
    result, reference = one_run.execute(spec), one_run.execute(ours)
    assert result["bits"] == reference["bits"]
    assert result["noise_multiplier"] == reference["noise_multiplier"]
    assert result["scores"] != reference["scores"] and np.all(np.isfinite(result["scores"]))
    assert result == {**one_run.execute(spec), "seconds": result["seconds"]}  # reproducible


def test_the_profiles_give_costly_settings_fewer_seeds() -> None:
    full = one_run.PROFILES["full"]
    seeds = {setting.name: full.seeds_of(setting) for setting in full.settings}
    assert seeds["Opacus, 60,000 records: dense, least-likely labels, full batch"] == 2
    assert seeds["dense, least-likely labels, full batch"] == full.seeds == 20
    with pytest.raises(InvalidParameterError) as unknown:
        Profile("bad", (TINY,), (4.0,), fewer_seeds=(("other", 1),))
    assert unknown.value.parameter == "fewer_seeds"
    with pytest.raises(InvalidParameterError) as zero:
        Profile("bad", (TINY,), (4.0,), fewer_seeds=(("tiny", 0),))
    assert zero.value.parameter == "seeds"


def test_chosen_settings_replace_their_own_rows_and_keep_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    other = dataclasses.replace(TINY, name="tiny, dense", design="dense")
    plan = Profile("tiny", (TINY, other), (4.0,), seeds=2, fewer_seeds=(("tiny, dense", 1),))
    first = one_run.run(chosen=plan, progress=False)
    assert [(row["setting_name"], row["seed"]) for row in first] == [
        ("tiny", 0),
        ("tiny", 1),
        ("tiny, dense", 0),
    ]
    as_if_written_at(tmp_path, "blackbox_one_run_tiny", "0" * 40)
    again = one_run.run(chosen=plan, setting_names=["dense"], progress=False)
    assert [row["setting_name"] for row in again] == ["tiny, dense"]
    saved = json.loads((tmp_path / "blackbox_one_run_tiny.json").read_text())
    assert [(row["setting_name"], row["seed"]) for row in saved] == [
        ("tiny", 0),
        ("tiny", 1),
        ("tiny, dense", 0),
    ]
    assert [row["commit"] == "0" * 40 for row in saved] == [True, True, False]
    text = one_run_report.table(
        saved, json.loads((tmp_path / "blackbox_one_run_tiny.meta.json").read_text())
    )
    assert f"Rows of tiny: commit `{'0' * 40}`" in text
    with pytest.raises(InvalidParameterError) as unknown:
        one_run.run(chosen=plan, setting_names=["CNN"], progress=False)
    assert unknown.value.parameter == "setting_names"


def test_an_under_noised_training_is_caught() -> None:
    """The quick configuration trained with the noise of eps = 40 while eps = 1 is claimed (a
    planted calibration bug): both bounds are far above the claim."""
    row = one_run.audit(QUICK, 40.0, seed=0)
    assert row["correct"] >= 0.95 * row["guesses"]
    assert row["epsilon_lower_steinke"] > 2.0 and row["epsilon_lower_gdp"] > 4.0


def test_a_correct_training_at_a_small_claim_stays_below_it() -> None:
    for seed in range(3):
        row = one_run.audit(QUICK, 1.0, seed=seed)
        assert one_run_report.best_bound(row) <= 1.0
        assert row["included"] == sum(one_run.bits(OneRunSpec(QUICK, 1.0, seed)))


def _without_timing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in row.items() if k not in ("run_seconds", "wall_seconds", "created")}
        for row in rows
    ]


def test_rows_are_the_same_in_process_and_on_spawned_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    plan = Profile("tiny", (TINY,), (4.0,), seeds=2)
    monkeypatch.setattr(results_io, "RUNS", tmp_path / "local")
    local = one_run.run(chosen=plan, progress=False)
    monkeypatch.setattr(results_io, "RUNS", tmp_path / "spawned")
    spawned = one_run.run(chosen=plan, executor="processes:2", progress=False)
    assert len(local) == 2 and _without_timing(spawned) == _without_timing(local)
    store = one_run.store()
    assert all(store.has(OneRunSpec(TINY, 4.0, seed)) for seed in range(2))
    assert _without_timing(one_run.run(chosen=plan, progress=False)) == _without_timing(local)


def test_the_command_line_runs_and_reports_the_chosen_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audits.__main__ import main

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    monkeypatch.setitem(one_run.PROFILES, "quick", Profile("quick", (TINY,), (4.0,), seeds=2))
    assert main(["--only", "blackbox_one_run"]) == 0
    rows = json.loads((tmp_path / "blackbox_one_run_quick.json").read_text())
    assert [row["seed"] for row in rows] == [0, 1] and rows[0]["profile"] == "quick"
    text = (tmp_path / "blackbox_one_run_quick.md").read_text()
    first = rows[0]
    assert f"| tiny | 4 | {first['noise_multiplier']:.3g} | 20 | 2 |" in text
    assert f"{first['correct']} / 4 |" in text and "Panda" in text
    assert not (tmp_path / "blackbox_one_run.json").exists()


def test_the_ideal_game_spans_no_signal_to_perfect_guesses() -> None:
    perfect = {"canaries": 200, "guesses": 40, "correct": 40, "delta": 1e-5, "confidence": 0.975}
    steinke, gdp = one_run_report.ideal_game(200, 20, 1, 1.0, 0.02, 1e-5)  # mu = 50
    assert steinke == one_run_epsilon_lower_bound(**perfect).epsilon_lower
    assert gdp == one_run_gdp_lower_bound(**perfect).epsilon_lower
    steinke, gdp = one_run_report.ideal_game(200, 20, 1, 1.0, 1e6, 1e-5)  # mu = 1e-6
    assert steinke < 0.1 and gdp is not None and gdp < 0.1
    low, high = one_run_report.ideal_game(1000, 100, 50, 1.0, 7.66, 1e-5)  # eps = 4
    assert high is not None and 1.0 < low < high < 2.5
    poisson, none = one_run_report.ideal_game(784, 78, 100, 0.1, 1.39, 1e-5)  # eps = 4
    assert none is None and 0.3 < poisson < 2.0
