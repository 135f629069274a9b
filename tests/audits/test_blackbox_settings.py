"""Black-box audit settings and runs: typed errors for bad fields, specs fit the run layer."""

from __future__ import annotations

import dataclasses

import pytest

from audits.blackbox.profiles import EPSILONS, PROFILES, QUICK_EPSILONS, Profile, profile
from audits.blackbox.settings import BlackBoxRun, BlackBoxSetting, check_run, check_setting
from dpcore.errors import InvalidParameterError
from dpcore.runs import RunStore, check_spec, spec_json, spec_key

BAD_FIELDS = [
    ("subset_size", 0),
    ("model", "resnet"),
    ("implementation", "jax"),
    ("hidden", 0),
    ("init", "pretrained"),
    ("pretrain_size", 0),
    ("pretrain_steps", -1),
    ("target", "gradient"),
    ("target_label", 10),
    ("sampling_probability", 0.0),
    ("sampling_probability", 1.5),
    ("steps", 0),
    ("lr", 0.0),
    ("lr", float("inf")),
    ("max_grad_norm", -1.0),
    ("delta", 1.0),
    ("seed", -1),
    ("name", ""),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_bad_setting_field_is_named(field: str, value: object) -> None:
    bad = dataclasses.replace(BlackBoxSetting(), **{field: value})
    with pytest.raises(InvalidParameterError) as raised:
        check_setting(bad)
    assert raised.value.parameter == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("epsilon", 0.0), ("epsilon", float("nan")), ("world", "both"), ("seed", -3)],
)
def test_bad_run_field_is_named(field: str, value: object) -> None:
    run = dataclasses.replace(BlackBoxRun(BlackBoxSetting(), 1.0, "in", 0), **{field: value})
    with pytest.raises(InvalidParameterError) as raised:
        check_run(run)
    assert raised.value.parameter == field


def test_not_a_setting_is_refused() -> None:
    with pytest.raises(InvalidParameterError):
        check_setting({"steps": 3})  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError):
        check_run(BlackBoxSetting())  # type: ignore[arg-type]


def test_profiles_check_their_settings_and_counts() -> None:
    assert profile("quick") is PROFILES["quick"]
    with pytest.raises(InvalidParameterError):
        profile("huge")
    with pytest.raises(InvalidParameterError):
        Profile("tiny", ((BlackBoxSetting(), 3),))
    with pytest.raises(InvalidParameterError):
        Profile("bad", ((BlackBoxSetting(steps=0), 100),))


def test_profiles_claim_the_issue_grid_and_cover_models_implementations_and_sizes() -> None:
    assert EPSILONS == (1.0, 2.0, 4.0, 8.0, 10.0) == PROFILES["full"].epsilons
    assert PROFILES["quick"].epsilons == QUICK_EPSILONS and set(QUICK_EPSILONS) < set(EPSILONS)
    full = [setting for setting, _ in PROFILES["full"].audits]
    covered = {(s.model, s.implementation, s.subset_size) for s in full}
    for model, size in (("linear", 1000), ("cnn", 1000), ("linear", 60_000)):
        assert {(model, "dpcore", size), (model, "opacus", size)} <= covered
    assert len({s.name for s in full}) == len(full)


def test_run_spec_round_trips_through_json_and_the_store(tmp_path: object) -> None:
    run = BlackBoxRun(BlackBoxSetting(), 4.0, "out", 7)
    check_spec(run)
    fields = spec_json(run)["fields"]
    rebuilt = BlackBoxRun(
        BlackBoxSetting(**fields["setting"]), **{k: v for k, v in fields.items() if k != "setting"}
    )
    assert rebuilt == run and spec_key(rebuilt) == spec_key(run)
    assert spec_key(dataclasses.replace(run, world="in")) != spec_key(run)
    store = RunStore(str(tmp_path), code="blackbox_test")
    store.put(run, {"loss": 0.5, "logit_margin": -1.0})
    assert store.has(run) and store.result(rebuilt) == {"loss": 0.5, "logit_margin": -1.0}
