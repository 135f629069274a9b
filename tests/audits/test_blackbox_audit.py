"""The black-box audit end to end on a tiny setting: runs, store, rows, report, soundness."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from audits import results_io
from audits.blackbox import audit, data, report, training
from audits.blackbox.profiles import Profile
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting
from dpcore.errors import InvalidParameterError
from dpcore.runs import RunStore

TINY = BlackBoxSetting(
    name="tiny",
    subset_size=40,
    pretrain_size=200,
    pretrain_steps=20,
    steps=4,
    lr=1.0,
)


def test_data_subset_pretraining_and_target_are_disjoint_and_fixed() -> None:
    x, y = data.subset(TINY)
    px, _ = data.pretraining_records(TINY)
    assert x.shape == (40, 784) and y.shape == (40,) and px.shape == (200, 784)
    assert not {row.tobytes() for row in x} & {row.tobytes() for row in px}
    np.testing.assert_array_equal(data.subset(TINY)[0], x)
    blank, label = data.target(TINY)
    assert blank.shape == (1, 784) and not blank.any() and label.tolist() == [0]
    image, wrong = data.target(dataclasses.replace(TINY, target="mislabelled", target_label=3))
    assert image.any() and wrong.tolist() == [3]
    with pytest.raises(InvalidParameterError):
        data.pretraining_records(dataclasses.replace(TINY, init="random"))
    with pytest.raises(InvalidParameterError):
        data.subset(dataclasses.replace(TINY, subset_size=60_000))


def test_runs_are_reproducible_and_worlds_differ() -> None:
    run = BlackBoxRun(TINY, 10.0, "in", 3)
    first, again = training.execute(run), training.execute(run)
    assert first["loss"] == again["loss"] and first["logit_margin"] == again["logit_margin"]
    other = training.execute(dataclasses.replace(run, world="out"))
    assert other["loss"] != first["loss"]
    seeds = {
        training.run_seed(changed)
        for changed in (
            run,
            dataclasses.replace(run, world="out"),
            dataclasses.replace(run, epsilon=4.0),
            dataclasses.replace(run, seed=4),
            dataclasses.replace(run, setting=dataclasses.replace(TINY, seed=1)),
        )
    }
    assert len(seeds) == 5 and all(0 <= seed < 2**63 for seed in seeds)
    assert first["noise_multiplier"] > 0 and first["seconds"] > 0


def test_tiny_audit_end_to_end_resumes_from_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    plan = Profile("tiny", ((TINY, 10),), epsilons=(10.0,))
    rows = audit.run(chosen=plan, progress=False)
    (row,) = rows
    assert row["runs"] == 20 and row["runs_per_world"] == 10
    assert 0 <= row["epsilon_lower"] <= row["certified_epsilon"] <= 10.0
    assert row["ratio"] == pytest.approx(row["epsilon_lower"] / 10.0)
    assert row["decision"]["tests"] == 6
    store = audit.store()
    assert all(store.has(spec) for spec in audit.runs_of(TINY, 10.0, 10))
    assert audit.run(chosen=plan, progress=False)[0]["epsilon_lower"] == row["epsilon_lower"]
    saved = json.loads((tmp_path / "blackbox_tiny.json").read_text())
    assert saved[0]["epsilon_lower"] == row["epsilon_lower"]
    assert not (tmp_path / "blackbox.json").exists()
    report.write_report("blackbox_tiny")
    text = (tmp_path / "blackbox_tiny.md").read_text()
    assert "| tiny | linear | dpcore | 40 | 10 |" in text and "Annamalai" in text
    assert report.OLD_ROWS not in text
    old = {**row, "setting": {k: v for k, v in row["setting"].items() if k != "implementation"}}
    marked = report.table([old])
    assert "| tiny | linear | dpcore* | 40 | 10 |" in marked and report.OLD_ROWS in marked


def test_soundness_over_seeds_on_a_cheap_setting(tmp_path: Path) -> None:
    """20 seeds (subset, initial parameters and runs), worst-case init, blank target, full
    batch, eps = 1 with 16 runs per world: exceedances of the certified epsilon stay within
    the binomial 99.9 % tail of 20 trials at the 5 % level."""
    store = RunStore(tmp_path, code="soundness")
    over = 0
    for seed in range(20):
        setting = dataclasses.replace(TINY, seed=seed, steps=2)
        row = audit.audit_setting(setting, 1.0, 16, run_store=store, progress=False)
        over += row["epsilon_lower"] > row["certified_epsilon"]
    assert over <= stats.binom.ppf(0.999, 20, 0.05)


def test_power_under_noised_training_is_caught(tmp_path: Path) -> None:
    """The same cheap setting trained with the noise of eps = 40 while eps = 1 is claimed
    (a planted calibration bug): the bound exceeds the claim in at least 4 of 5 seeds."""
    store = RunStore(tmp_path, code="power")
    caught = 0
    for seed in range(5):
        setting = dataclasses.replace(TINY, seed=seed, steps=2)
        row = audit.audit_setting(setting, 40.0, 16, run_store=store, progress=False)
        caught += row["epsilon_lower"] > 1.0
    assert caught >= 4


def _without_timing(row: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in row.items() if k not in ("run_seconds", "wall_seconds")}


def test_spawned_processes_give_the_same_row(tmp_path: Path) -> None:
    local = audit.audit_setting(
        TINY, 4.0, 8, run_store=RunStore(tmp_path / "local", code="x"), progress=False
    )
    spawned_store = RunStore(tmp_path / "spawned", code="x")
    spawned = audit.audit_setting(
        TINY, 4.0, 8, executor="processes:2", run_store=spawned_store, progress=False
    )
    assert _without_timing(spawned) == _without_timing(local)
    assert all(spawned_store.has(spec) for spec in audit.runs_of(TINY, 4.0, 8))


def test_the_command_line_runs_the_chosen_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audits.__main__ import main
    from audits.blackbox import profiles

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    tiny = Profile("quick", ((TINY, 8),), epsilons=(4.0,))
    monkeypatch.setitem(profiles.PROFILES, "quick", tiny)
    assert main(["--only", "blackbox", "--profile", "quick"]) == 0
    (row,) = json.loads((tmp_path / "blackbox_quick.json").read_text())
    assert row["profile"] == "quick" and row["epsilon"] == 4.0
    assert "| tiny | linear | dpcore | 40 | 4 |" in (tmp_path / "blackbox_quick.md").read_text()
    assert not (tmp_path / "blackbox.json").exists()
    with pytest.raises(SystemExit):
        main(["--only", "blackbox", "--profile", "huge"])


def test_soundness_record_counts_exceedances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audits.blackbox.soundness import soundness

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    result = soundness(dataclasses.replace(TINY, steps=2), 1.0, 8, 3, progress=False)
    assert result["seeds"] == 3 and len(result["epsilon_lower"]) == 3
    over = sum(
        a > b for a, b in zip(result["epsilon_lower"], result["certified_epsilon"], strict=True)
    )
    assert result["exceedances"] == over
    assert result["p_value"] == pytest.approx(stats.binom.sf(over - 1, 3, 0.05))
    saved = json.loads((tmp_path / "blackbox_soundness.json").read_text())
    assert saved[0]["exceedances"] == over
    audit.run(chosen=Profile("full", ((TINY, 8),), epsilons=(1.0,)), progress=False)
    report.write_report()
    assert f"in {over} of 3" in (tmp_path / "blackbox.md").read_text()
    with pytest.raises(InvalidParameterError):
        soundness(TINY, 1.0, 8, 0, progress=False)


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "mlp", "hidden": 8},
        {"model": "cnn", "hidden": 8},
        {"implementation": "opacus"},
        {"implementation": "opacus", "model": "cnn", "sampling_probability": 0.5},
        {"init": "random"},
        {"target": "natural"},
        {"target": "constant", "sampling_probability": 0.5},
    ],
)
def test_every_option_trains_and_scores(changes: dict[str, object]) -> None:
    setting = dataclasses.replace(TINY, **changes)  # type: ignore[arg-type]
    result = training.execute(BlackBoxRun(setting, 4.0, "in", 0))
    assert np.isfinite(result["loss"]) and result["loss"] >= 0
    assert np.isfinite(result["logit_margin"])
    if setting.init == "random":
        assert not training.initial_state(setting)["weight"].equal(
            training.initial_state(TINY)["weight"]
        )


@pytest.mark.parametrize(
    ("epsilon", "runs", "parameter"),
    [(4.0, 7, "runs_per_world"), (4.0, 0, "runs_per_world"), (-1.0, 8, "epsilon")],
)
def test_bad_audit_arguments_are_refused_before_any_run(
    epsilon: float, runs: int, parameter: str, tmp_path: Path
) -> None:
    store = RunStore(tmp_path, code="refused")
    with pytest.raises(InvalidParameterError) as raised:
        audit.audit_setting(TINY, epsilon, runs, run_store=store, progress=False)
    assert raised.value.parameter == parameter
    assert not any(tmp_path.iterdir())


def test_chosen_settings_replace_their_rows_and_keep_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile audited setting by setting: each call replaces its own rows only, the kept rows
    are stamped with the commit of the file they came from, and the table names that commit."""
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    other = dataclasses.replace(TINY, name="other: random init", init="random")
    plan = Profile("tiny", ((TINY, 8), (other, 8)), epsilons=(4.0,))
    audit.run(chosen=plan, setting_names=["RANDOM"], progress=False)
    (only,) = json.loads((tmp_path / "blackbox_tiny.json").read_text())
    assert only["setting_name"] == "other: random init" and only["commit"]
    meta_path = tmp_path / "blackbox_tiny.meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "commit": "earlier"}))  # as if measured before
    saved = json.loads((tmp_path / "blackbox_tiny.json").read_text())
    (tmp_path / "blackbox_tiny.json").write_text(
        json.dumps(
            [{k: v for k, v in row.items() if k not in ("commit", "created")} for row in saved]
        )
    )
    (new,) = audit.run(chosen=plan, setting_names=["tiny"], progress=False)[:1]
    rows = json.loads((tmp_path / "blackbox_tiny.json").read_text())
    assert [row["setting_name"] for row in rows] == ["tiny", "other: random init"]  # profile order
    assert rows[1]["commit"] == "earlier" and rows[0]["commit"] == new["commit"]
    assert rows[1]["epsilon_lower"] == only["epsilon_lower"]
    report.write_report("blackbox_tiny")
    assert (
        "Rows of other: random init: commit `earlier`"
        in (tmp_path / "blackbox_tiny.md").read_text()
    )
    with pytest.raises(InvalidParameterError, match="setting_names"):
        audit.run(chosen=plan, setting_names=["no such setting"], progress=False)


def test_a_checkpoint_carries_finished_runs_to_a_fresh_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full profile's run bundle: written after every row, read back into an empty store
    (a fresh checkout), after which no run is trained again."""
    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    monkeypatch.setattr(results_io, "RUNS", tmp_path / "runs")
    plan = Profile("tiny", ((TINY, 8),), epsilons=(4.0, 10.0))
    bundle = tmp_path / "checkpoints" / "blackbox.jsonl"
    first = audit.run(chosen=plan, checkpoint=bundle, progress=False)
    assert len(bundle.read_text().splitlines()) == 2 * 2 * 8
    for folder in (tmp_path / "runs").iterdir():  # a fresh checkout: no run store
        import shutil

        shutil.rmtree(folder)

    def never(spec: BlackBoxRun) -> object:
        raise AssertionError(f"{spec} trained again")

    monkeypatch.setattr(training, "execute", never)
    again = audit.run(chosen=plan, checkpoint=bundle, progress=False)
    assert [_without_timing(row) for row in again] == [
        {**_without_timing(row), "created": again[0]["created"]} for row in first
    ]


def test_the_command_line_passes_settings_and_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audits import __main__ as cli
    from audits.blackbox import profiles

    monkeypatch.setattr(results_io, "RESULTS", tmp_path)
    other = dataclasses.replace(TINY, name="other: random init", init="random")
    monkeypatch.setitem(profiles.PROFILES, "full", Profile("full", ((TINY, 8), (other, 8)), (4.0,)))
    bundle = tmp_path / "checkpoints" / "blackbox.jsonl"
    monkeypatch.setitem(cli.CHECKPOINTS, "blackbox", bundle)
    assert cli.main(["--only", "blackbox", "--profile", "full", "--settings", "random"]) == 0
    (row,) = json.loads((tmp_path / "blackbox.json").read_text())
    assert row["setting_name"] == "other: random init"
    assert len(bundle.read_text().splitlines()) == 16
    with pytest.raises(SystemExit):
        cli.main(["--only", "mechanisms", "--settings", "random"])
