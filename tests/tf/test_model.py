"""DPModel: model.fit over Poisson lots records one ledger event per noisy step, prints the same
statement as the torch trainer, shows epsilon in Keras's logs, and refuses what is not private."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from dpcore.errors import IncompatibleModelError, InvalidParameterError, StateError
from dpcore.ledger import PrivacyLedger
from dpcore.tf import DPModel, PoissonLots
from tests.tf.models import build

DELTA = 1e-5


def _data(n: int = 120) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def _model(**kwargs: object) -> DPModel:
    keras.utils.set_random_seed(0)
    net = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, "relu"), keras.layers.Dense(2)]
    )
    model = DPModel(net, max_grad_norm=1.0, noise_multiplier=1.2, seed=0, **kwargs)  # type: ignore[arg-type]
    model.compile(
        optimizer=keras.optimizers.SGD(0.2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class _Logs(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[dict] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches.append(dict(logs or {}))


def test_fit_records_one_event_per_step_and_the_torch_statement() -> None:
    model = _model()
    lots = PoissonLots(_data(), expected_lot_size=12, seed=0)
    seen = _Logs()
    history = model.fit(lots, epochs=2, delta=DELTA, callbacks=[seen], verbose=0)
    assert model.ledger.steps == 2 * lots.steps_per_epoch == 20
    reference = PrivacyLedger(dataset_size=120)
    for _ in range(20):
        reference.record(sampling_probability=0.1, noise_multiplier=1.2)
    assert model.ledger == reference
    statement = model.privacy_statement(delta=DELTA)
    assert statement["events"] == reference.event().to_dict()
    assert statement["sampler"] == "poisson" and statement["matches_poisson_analysis"]
    assert statement["run"]["framework"] == "tensorflow" and statement["run"]["engine"] == "ghost"
    assert statement["run"]["expected_lot_size"] == pytest.approx(12.0)
    epsilon = reference.epsilon(delta=DELTA, accountant="rdp")
    assert statement["epsilon"]["rdp"]["epsilon"] == pytest.approx(epsilon)
    assert history.history["epsilon"][-1] == pytest.approx(epsilon)
    assert history.history["epsilon"][0] < history.history["epsilon"][1]
    assert "accuracy" in history.history and np.isfinite(history.history["loss"]).all()
    # the progress bar reads the same logs: epsilon appears batch by batch once computed
    assert [b.get("epsilon") is not None for b in seen.batches].count(True) >= 1


def test_steps_outside_fit_reach_the_ledger() -> None:
    """The counter lives in the compiled step: a later fit with other lots keeps both rates."""
    model = _model()
    x, y = _data()
    model.fit(PoissonLots((x, y), expected_lot_size=12, seed=0), epochs=1, verbose=0)
    model.fit(PoissonLots((x, y), expected_lot_size=24, seed=1), epochs=1, verbose=0)
    events = model.ledger.state_dict()["runs"]
    assert [run["count"] for run in events] == [10, 5]
    assert [run["event"]["sampling_probability"] for run in events] == [0.1, 0.2]


def test_jl_model_trains_and_is_accounted_by_the_jl_accountant() -> None:
    model = _model(jl_dimension=5)
    history = model.fit(PoissonLots(_data(), expected_lot_size=12, seed=0), epochs=1, verbose=0)
    assert "epsilon" not in history.history  # no delta given: no accounting during fit
    assert model.clipping_method == "jl" and model.ledger.uses_jl and model.ledger.steps == 10
    # RDP has no JL rule: the statement says so instead of a number (the JL accountant's own
    # tests cover its epsilon; it takes tens of seconds, so it is not run again here)
    statement = model.privacy_statement(delta=DELTA, accountants=("rdp",))
    assert statement["jl"] and statement["run"]["jl_dimension"] == 5
    assert statement["epsilon"]["rdp"]["epsilon"] is None
    assert statement["epsilon"]["rdp"]["unsupported"]
    reference = PrivacyLedger(dataset_size=120)
    for _ in range(10):
        reference.record(sampling_probability=0.1, noise_multiplier=1.2, jl_dimension=5)
    assert statement["events"] == reference.event().to_dict()


@pytest.mark.parametrize("clipping", ["ghost", "jacobian"])
def test_empty_lots_train_without_nan(clipping: str) -> None:
    """q N = 0.5: about 60 % of lots are empty; ghost and Jacobian paths both take them."""
    net = build("mlp", dtype="float32")
    model = DPModel(net, max_grad_norm=1.0, noise_multiplier=1.0, clipping=clipping, seed=1)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)).astype("float32")
    lots = PoissonLots((x, rng.integers(0, 3, 40)), expected_lot_size=0.5, seed=2)
    model.fit(lots, epochs=1, steps_per_epoch=12, verbose=0)
    assert model._clipper_for().resolved_method() == clipping
    assert model.ledger.steps == 12
    assert all(np.isfinite(w.numpy()).all() for w in net.trainable_weights)


def test_what_is_not_poisson_is_refused() -> None:
    model = _model()
    x, y = _data()
    with pytest.raises(InvalidParameterError, match=r"Expected x to be dpcore\.tf\.PoissonLots"):
        model.fit(x, y)
    lots = PoissonLots((x, y), expected_lot_size=12, seed=0)
    with pytest.raises(InvalidParameterError, match="Expected batch_size"):
        model.fit(lots, batch_size=12)
    with pytest.raises(InvalidParameterError, match="Expected y"):
        model.fit(lots, y)
    with pytest.raises(InvalidParameterError, match="train_on_batch"):
        model.train_on_batch(x, y)
    with pytest.raises(StateError, match="No lots yet"):
        _ = model.ledger
    with pytest.raises(InvalidParameterError, match="Expected x to be lots over the same 120"):
        model.fit(lots, epochs=1, verbose=0)
        model.fit(PoissonLots((x[:60], y[:60]), expected_lot_size=6, seed=0), verbose=0)


def test_bad_settings_are_named() -> None:
    net = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    for kwargs, parameter in (
        ({"noise_multiplier": 0.0, "max_grad_norm": 1.0}, "noise_multiplier"),
        ({"noise_multiplier": 1.0, "max_grad_norm": -1.0}, "max_grad_norm"),
        ({"noise_multiplier": 1.0, "max_grad_norm": 1.0, "jl_dimension": 0}, "jl_dimension"),
    ):
        with pytest.raises(InvalidParameterError, match=f"Expected {parameter}"):
            DPModel(net, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="Expected model"):
        DPModel("net", max_grad_norm=1.0, noise_multiplier=1.0)  # type: ignore[arg-type]
    bn = keras.Sequential(
        [keras.Input((2,)), keras.layers.BatchNormalization(), keras.layers.Dense(2)]
    )
    model = DPModel(bn, max_grad_norm=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(IncompatibleModelError, match="BatchNormalization"):
        _ = model.clipping_method


def test_evaluate_and_predict_use_the_wrapped_network() -> None:
    model = _model()
    x, y = _data()
    model.fit(PoissonLots((x, y), expected_lot_size=12, seed=0), epochs=1, verbose=0)
    np.testing.assert_allclose(model.predict(x, verbose=0), model.network(x).numpy(), rtol=1e-6)
    results = model.evaluate(x, y, verbose=0, return_dict=True)
    assert set(results) >= {"loss", "accuracy"}
    assert tf.reduce_all(tf.math.is_finite(results["loss"]))
