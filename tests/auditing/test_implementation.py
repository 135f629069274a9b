"""The audit contract: tasks with input-space canaries, claims, the observer."""

from __future__ import annotations

import numpy as np
import pytest

from dpcore.auditing.implementation import (
    CANARY_TARGET,
    MLP_CANARY_SCALE,
    Claim,
    Observer,
    derived_divisor,
    make_mlp_task,
    make_task,
)
from dpcore.auditing.models import per_example_gradients
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
        observer.step(weight)  # no lots: the claim's divisor (2) is used
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
    ("field", "value"),
    [
        ("sampler", "random"),
        ("accounting_assumes", "x"),
        ("divisor", 0.0),
        ("divisor", float("nan")),
        ("divisor", True),
    ],
)
def test_claims_are_validated(field: str, value: object) -> None:
    with pytest.raises(InvalidParameterError, match=field):
        _claim(**{field: value})


def _mlp(canaries: list[bool], **changes: object):  # type: ignore[no-untyped-def]
    arguments: dict[str, object] = dict(
        real_records=19,
        real_features=4,
        hidden=4,
        classes=3,
        canaries=canaries,
        sampling_probability=0.2,
        noise_multiplier=1.0,
        max_grad_norm=2.0,
        learning_rate=0.05,
        steps=5,
        delta=1e-5,
        seed=0,
    )
    arguments.update(changes)
    return make_mlp_task(**arguments)  # type: ignore[arg-type]


def test_mlp_task_has_biases_a_rare_class_and_canaries_of_that_class() -> None:
    task = _mlp([True, False])
    assert task.spec.names == ("W1", "b1", "W2", "b2")
    assert task.spec.shapes == ((6, 6), (6,), (3, 6), (3,))
    assert [p.shape for p in task.initial_parameters] == list(task.spec.shapes)
    rows = list(task.canary_rows)
    assert task.canary_slots == (0,)
    assert np.array_equal(task.features[rows][0], [MLP_CANARY_SCALE, 0, 0, 0, 0, 0])
    real = np.delete(np.arange(task.dataset_size), rows)
    assert np.all(task.features[real][:, :2] == 0)
    assert np.sum(task.targets[real] == 2) == 1 and task.targets[rows[0]] == 2  # rare class


def test_mlp_canary_gradient_is_large_in_every_tensor_and_real_records_never_drive_its_unit() -> (
    None
):
    task = _mlp([True])
    grads = per_example_gradients(task.spec, task.initial_parameters, task.features, task.targets)
    row = task.canary_rows[0]
    norms = [float(np.linalg.norm(g[row])) for g in grads]
    assert all(norm > 0.5 * task.max_grad_norm for norm in norms)  # every tensor, biases too
    assert np.sqrt(sum(n**2 for n in norms)) > 10 * task.max_grad_norm  # clipping binds
    real = [i for i in range(task.dataset_size) if i != row]
    w1, b1, w2, _ = grads
    assert np.all(w1[real][:, 0] == 0) and np.all(b1[real][:, 0] == 0)  # unit 0: canary's own
    assert np.all(w2[real][:, :, 0] == 0)


def test_observer_takes_the_parameter_tuple_or_one_vector() -> None:
    task = _mlp([True])
    observer = Observer(task.initial_parameters, task.spec)
    observer.step(task.initial_parameters, [0])
    observer.step(task.initial_weight, [1])
    assert np.array_equal(observer.weights[1], observer.weights[2])
    with pytest.raises(InvalidParameterError, match="W1"):
        observer.step((np.zeros((2, 2)), *task.initial_parameters[1:]))
    with pytest.raises(InvalidParameterError, match="weight"):
        observer.step(np.full(task.spec.size, np.nan))


def test_divisor_is_read_from_the_lots() -> None:
    task = _task([True])  # n = 11, q = 0.2: q n = 2.2
    fixed = Observer(task.initial_weight)
    varying = Observer(task.initial_weight)
    for t in range(task.steps):
        fixed.step(task.initial_weight, [t, t + 1])
        varying.step(task.initial_weight, list(range(t % 3)))
    typed = _claim(divisor=7.0)
    assert derived_divisor(task, typed, fixed) == 2.0  # fixed-size lots: B, whatever is typed
    assert derived_divisor(task, typed, varying) == 7.0
    assert derived_divisor(task, _claim(divisor=None), varying) == pytest.approx(2.2)
    unknown = Observer(task.initial_weight)
    unknown.step(task.initial_weight)  # no lots reported
    assert derived_divisor(task, _claim(divisor=None, sampler="shuffle"), unknown) == (
        pytest.approx(2.2)
    )
