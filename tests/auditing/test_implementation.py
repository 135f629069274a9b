"""The audit contract: tasks with input-space canaries, claims, the observer."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.auditing.implementation import CANARY_TARGET, Claim, Observer, make_task
from dpcore.errors import InvalidParameterError


def _task(canaries: list[bool], **changes: object):  # type: ignore[no-untyped-def]
    arguments: dict[str, object] = dict(
        real_records=10,
        real_features=3,
        canaries=canaries,
        sampling_probability=0.2,
        noise_multiplier=1.0,
        max_grad_norm=2.0,
        learning_rate=0.1,
        steps=5,
        delta=1e-5,
        seed=0,
    )
    arguments.update(changes)
    return make_task(**arguments)  # type: ignore[arg-type]


def _claim(**changes: object) -> Claim:
    arguments: dict[str, object] = dict(
        implementation="x",
        sampler="poisson",
        accounting_assumes="poisson",
        sampling_probability=0.2,
        noise_multiplier=1.0,
        max_grad_norm=2.0,
        steps=5,
        delta=1e-5,
        divisor=2.0,
    )
    arguments.update(changes)
    return Claim(**arguments)  # type: ignore[arg-type]


def test_canaries_sit_on_features_no_real_record_uses() -> None:
    task = _task([True, False, True])
    assert task.dataset_size == 12 and task.dimension == 6
    rows = list(task.canary_rows)
    real = np.delete(task.features, rows, axis=0)
    assert np.all(real[:, :3] == 0)  # canary features: zero on every real record
    assert np.array_equal(task.features[rows][:, :3], np.array([[1, 0, 0], [0, 0, 1]]))
    assert np.all(task.targets[rows] == CANARY_TARGET * 2.0)
    assert task.features.dtype == np.float32 and task.initial_weight.dtype == np.float32


def test_records_are_shuffled_so_canaries_are_not_found_by_position() -> None:
    positions = {_task([True], seed=seed).canary_rows[0] for seed in range(20)}
    assert len(positions) > 3


def test_canary_scores_read_the_claimed_statistic() -> None:
    task = _task([True])
    observer = Observer(task.initial_weight)
    step = task.learning_rate * task.max_grad_norm / 2.0  # one clipped canary, divisor 2
    for t in range(task.steps):
        weight = task.initial_weight.astype(float).copy()
        weight[0] = (t + 1) * step
        observer.step(weight, [task.canary_rows[0]])
    scores = observer.canary_scores(task, _claim(), [0])
    assert scores.shape == (5, 1)
    assert np.allclose(scores, 1.0)


def test_observer_refuses_wrong_shapes_and_step_counts() -> None:
    task = _task([True])
    observer = Observer(task.initial_weight)
    with pytest.raises(InvalidParameterError, match="weight"):
        observer.step(np.zeros(task.dimension + 1))
    observer.step(np.zeros(task.dimension))
    with pytest.raises(InvalidParameterError, match="observed steps"):
        observer.canary_scores(task, _claim(), [0])


def test_a_step_without_lot_means_no_lots_are_known() -> None:
    observer = Observer(np.zeros(2))
    observer.step(np.zeros(2), [0])
    observer.step(np.zeros(2))
    assert observer.lots is None


@pytest.mark.parametrize(
    ("field", "value"), [("sampler", "random"), ("accounting_assumes", "x"), ("divisor", 0.0)]
)
def test_claims_are_validated(field: str, value: object) -> None:
    with pytest.raises(InvalidParameterError, match=field):
        _claim(**{field: value})
