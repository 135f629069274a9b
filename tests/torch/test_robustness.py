"""The torch samplers, trainer and checkpoints at the edges: an answer or a typed error.

Sampling probabilities at 0, subnormal and one ulp below 1; seeds up to 2**64; noise
multipliers, clipping norms and learning rates from subnormal to 1e300 and inf/nan; and
checkpoint files that are empty, truncated, random, or of another shape. Small budget by
default, wide in ``nox -s slow``.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import TensorDataset

from dpcore.errors import DPCoreError, InvalidParameterError, ResourceLimitError, StateError
from dpcore.torch import private, training
from dpcore.torch.loaders import LotLoader
from dpcore.torch.private import make_private
from dpcore.torch.samplers import PoissonSampler, ShuffledBatchSampler
from dpcore.torch.training import DPTrainer

REALS = [
    0.0, -0.0, 5e-324, 1e-300, 1e-3, 0.5, 1.0, math.nextafter(1.0, 0.0), 1.0000000000000002,
    2.0, 1e30, 1e300, math.inf, -math.inf, math.nan, -1.0,
]  # fmt: skip
SEEDS = [None, 0, 1, 2**63 - 1, 2**63, 2**64, -1, 1.5]
SIZES = [1, 2, 10, 10**18, 0, -1, 1.5, True]
QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WIDE = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _poisson(size: object, q: float, seed: object) -> None:
    try:
        sampler = PoissonSampler(size, sampling_probability=q, seed=seed)  # type: ignore[arg-type]
    except DPCoreError:
        return
    assert len(sampler) >= 1 and sampler.steps_per_epoch >= 1
    if sampler.dataset_size <= 1000:
        lot = sampler.sample()
        assert lot.dtype == torch.int64 and (lot < sampler.dataset_size).all()


@QUICK
@given(st.sampled_from(SIZES), st.sampled_from(REALS), st.sampled_from(SEEDS))
@example(1, 5e-324, None)  # steps_per_epoch was round(inf): OverflowError
@example(1, 0.5, 2**64)  # the seed was handed to torch unchecked: ValueError
def test_poisson_sampler_answers_or_refuses(size: object, q: float, seed: object) -> None:
    _poisson(size, q, seed)


@QUICK
@given(st.sampled_from(SIZES), st.sampled_from([0, 1, 2, 10**18, -1, 1.5, None]))
def test_shuffled_sampler_answers_or_refuses(size: object, batch: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sampler = ShuffledBatchSampler(size, batch_size=batch, seed=0)  # type: ignore[arg-type]
        except DPCoreError:
            return
    if sampler.dataset_size <= 1000:
        assert len(sampler.sample()) == sampler.batch_size


def _trainer(sigma: float, clip: float, lr: float) -> DPTrainer:
    torch.manual_seed(0)
    inputs, targets = torch.randn(8, 3), torch.randint(0, 2, (8,))
    return DPTrainer.dp_sgd(
        nn.Linear(3, 2),
        lr=lr,
        inputs=inputs,
        targets=targets,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=sigma,
        max_grad_norm=clip,
        sampler=PoissonSampler(8, sampling_probability=0.5, seed=0),
        seed=1,
    )


def _train_one_step(sigma: float, clip: float, lr: float) -> None:
    try:
        trainer = _trainer(sigma, clip, lr)
    except DPCoreError:
        return
    trainer.step()
    for parameter in trainer.model.parameters():
        assert torch.isfinite(parameter).all()


@QUICK
@given(st.sampled_from(REALS), st.sampled_from(REALS), st.sampled_from([1e-3, *REALS]))
@example(1e300, 1e300, 1e-3)  # noise sd 1e600: the step made every parameter inf
@example(5e-324, 5e-324, 1e300)  # lr beyond float32: torch's RuntimeError
def test_trainer_answers_or_refuses(sigma: float, clip: float, lr: float) -> None:
    _train_one_step(sigma, clip, lr)


def test_unrepresentable_noise_is_refused_by_name() -> None:
    with pytest.raises(InvalidParameterError, match="noise_multiplier times max_grad_norm"):
        _trainer(1e20, 1e20, 1e-3)
    with pytest.raises(InvalidParameterError, match="lr"):
        _trainer(1.0, 1.0, 1e300)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda blob: b"",
        lambda blob: blob[:100],
        lambda blob: blob[: len(blob) // 2],
        lambda blob: os.urandom(1000),
        lambda blob: b"{}",
    ],
    ids=["empty", "header only", "half", "random bytes", "json"],
)
def test_malformed_checkpoint_is_a_state_error(tmp_path: Path, corrupt) -> None:  # type: ignore[no-untyped-def]
    trainer = _trainer(1.0, 1.0, 0.1)
    good = tmp_path / "good.pt"
    trainer.save_checkpoint(good)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(corrupt(good.read_bytes()))
    with pytest.raises(StateError):
        trainer.load_checkpoint(bad)
    with pytest.raises(FileNotFoundError):
        trainer.load_checkpoint(tmp_path / "absent.pt")


@pytest.mark.parametrize("field", ["model", "optimizer", "sampler", "ledger", "torch_rng"])
def test_checkpoint_of_another_shape_is_a_state_error(tmp_path: Path, field: str) -> None:
    trainer = _trainer(1.0, 1.0, 0.1)
    path = tmp_path / "state.pt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)
    state[field] = torch.zeros(3, dtype=torch.uint8) if field == "torch_rng" else {"x": 1}
    torch.save(state, path)
    with pytest.raises(StateError):
        trainer.load_checkpoint(path)


def test_checkpoints_are_read_onto_the_cpu_first(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A checkpoint written on a GPU resumes on a machine without one: torch.load is asked to
    map every tensor to the CPU (the model and optimizer then copy them to their devices).
    ``tests/torch/test_cuda.py`` resumes a real CUDA checkpoint on the CPU."""
    trainer = _trainer(1.0, 1.0, 0.1)
    path = tmp_path / "state.pt"
    trainer.save_checkpoint(path)
    seen = {}
    original = torch.load

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    trainer.load_checkpoint(path)
    assert seen.get("map_location") == "cpu"


@pytest.mark.slow
@WIDE
@given(
    st.one_of(st.sampled_from(SIZES), st.integers(-5, 10**6)),
    st.one_of(st.sampled_from(REALS), st.floats()),
    st.one_of(st.sampled_from(SEEDS), st.integers(-(2**65), 2**65)),
)
def test_poisson_sampler_answers_or_refuses_wide(size: object, q: float, seed: object) -> None:
    _poisson(size, q, seed)


@pytest.mark.slow
@WIDE
@given(
    st.one_of(st.sampled_from(REALS), st.floats()),
    st.one_of(st.sampled_from(REALS), st.floats()),
    st.one_of(st.sampled_from(REALS), st.floats(min_value=0, max_value=1e3)),
)
def test_trainer_answers_or_refuses_wide(sigma: float, clip: float, lr: float) -> None:
    _train_one_step(sigma, clip, lr)


@QUICK
@given(
    st.sampled_from(REALS),
    st.sampled_from(SEEDS),
    st.sampled_from([None, 0, 1, 3, 10**18, -1, 1.5]),
)
@example(5e-324, 0, None)  # queued empty lots without end before yielding the first one
def test_lot_loader_answers_or_refuses(q: float, seed: object, physical: object) -> None:
    """A user's Dataset through LotLoader: every lot it yields is a valid subset, or the
    constructor names the bad parameter."""
    from torch.utils.data import TensorDataset

    from dpcore.torch.loaders import LotLoader

    data = TensorDataset(torch.arange(10.0).reshape(10, 1), torch.arange(10))
    try:
        loader = LotLoader(
            data,
            sampling_probability=q,
            seed=seed,  # type: ignore[arg-type]
            max_physical_batch_size=physical,  # type: ignore[arg-type]
        )
    except DPCoreError:
        return
    for micro in loader:
        assert 0 <= micro.size <= micro.lot_size <= 10
        if micro.data is not None:
            inputs, labels = micro.data
            assert len(inputs) == len(labels) == micro.size
        break


# Item 11: typed errors at the torch entry points, raised before anything is built.

_NOT_BUILT = "nothing may be built for refused arguments"


def _forbid_building(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make building an engine or a torch optimizer fail the test (not a typed error)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(_NOT_BUILT)

    monkeypatch.setattr(training, "make_engine", refuse)
    monkeypatch.setattr(private, "make_engine", refuse)
    monkeypatch.setattr(torch.optim, "SGD", refuse)
    monkeypatch.setattr(torch.optim, "Adam", refuse)


def _data() -> dict[str, object]:
    torch.manual_seed(0)
    inputs, targets = torch.randn(8, 3), torch.randint(0, 2, (8,))
    return {
        "inputs": inputs,
        "targets": targets,
        "loss_fn": nn.CrossEntropyLoss(reduction="none"),
        "noise_multiplier": 1.0,
        "max_grad_norm": 1.0,
        "sampler": PoissonSampler(8, sampling_probability=0.5, seed=0),
    }


BAD_SEEDS = [2**64, 2**63, 2**64 - 1, -1, 1.5, True, "7"]
BAD_SHARED = [
    *[({"seed": seed}, "seed") for seed in BAD_SEEDS],
    ({"loss_fn": None}, "loss_fn"),
    ({"loss_fn": "cross_entropy"}, "loss_fn"),
    ({"noise": "secure"}, "noise"),
]


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        *BAD_SHARED,
        ({"model": None}, "model"),
        ({"model": "resnet"}, "model"),
        ({"momentum": -0.1}, "momentum"),
        ({"momentum": math.nan}, "momentum"),
        ({"momentum": math.inf}, "momentum"),
        ({"lr": math.nan}, "lr"),
        ({"lr": math.inf}, "lr"),
        ({"lr": -math.inf}, "lr"),
    ],
)
def test_dp_sgd_refuses_bad_arguments_by_name_before_building(
    kwargs: dict[str, object], parameter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = {"model": nn.Linear(3, 2), "lr": 0.1, **_data(), **kwargs}
    _forbid_building(monkeypatch)
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter} ") as info:
        DPTrainer.dp_sgd(**arguments)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    ("betas", "parameter"),
    [
        ((1.0, 0.999), "betas[0]"),
        ((0.9, 1.0), "betas[1]"),
        ((-0.1, 0.999), "betas[0]"),
        ((0.9, -1e-9), "betas[1]"),
        ((math.nan, 0.999), "betas[0]"),
        ((0.9, math.nan), "betas[1]"),
        ((0.9, math.inf), "betas[1]"),
        ((True, 0.999), "betas[0]"),
        ((0.9,), "betas"),
        ((0.9, 0.99, 0.999), "betas"),
        ("ab", "betas"),
        (None, "betas"),
    ],
)
def test_dp_adam_refuses_each_bad_beta_by_name_before_building(
    betas: object, parameter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid_building(monkeypatch)
    with pytest.raises(InvalidParameterError, match=f"Expected {re.escape(parameter)} ") as info:
        DPTrainer.dp_adam(nn.Linear(3, 2), lr=0.1, betas=betas, **_data())  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        *BAD_SHARED,
        ({"model": None}, "model"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"optimizer": None}, "optimizer"),
    ],
)
def test_dp_trainer_refuses_bad_arguments_by_name_before_building(
    kwargs: dict[str, object], parameter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    arguments = {"model": model, "optimizer": sgd, **_data(), **kwargs}
    _forbid_building(monkeypatch)
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter} ") as info:
        DPTrainer(**arguments)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        *BAD_SHARED,
        ({"model": None}, "model"),
        ({"optimizer": object()}, "optimizer"),
        ({"split": None}, "split"),
        ({"split": "pair"}, "split"),
    ],
)
def test_make_private_refuses_bad_arguments_by_name_before_building(
    kwargs: dict[str, object], parameter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Linear(3, 2)
    data = _data()
    loader = LotLoader(
        TensorDataset(data["inputs"], data["targets"]),  # type: ignore[arg-type]
        sampler=PoissonSampler(8, sampling_probability=0.5, seed=0),
    )
    arguments = {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loader": loader,
        "loss_fn": data["loss_fn"],
        "max_grad_norm": 1.0,
        "noise_multiplier": 1.0,
        **kwargs,
    }
    _forbid_building(monkeypatch)
    with pytest.raises(InvalidParameterError, match=f"Expected {parameter} ") as info:
        make_private(**arguments)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


def test_largest_seed_seeds_noise_and_directions() -> None:
    # 2**63 - 1 is the largest seed of the one rule; the JL directions take seed + 1 wrapped
    # into the same range (0 here), so it builds and steps like any other seed.
    largest = 2**63 - 1
    trainer = DPTrainer.dp_sgd(
        nn.Linear(3, 2), lr=0.1, engine="jl", jl_dimension=2, seed=largest, **_data()
    )
    assert trainer.optimizer.noise.state_dict()["seed"] == largest
    trainer.step()
    assert all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())


def test_jl_dimension_beyond_memory_is_refused_before_building(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # r = 10^18 directions over 8 parameters built, then failed at the first step with torch's
    # raw "Storage size calculation overflowed"; now a ResourceLimitError naming jl_dimension.
    _forbid_building(monkeypatch)
    model = nn.Linear(3, 2)
    with pytest.raises(ResourceLimitError, match="Expected jl_dimension small enough"):
        DPTrainer(
            model,
            optimizer=torch.optim.Optimizer(model.parameters(), {"lr": 0.1}),
            engine="jl",
            jl_dimension=10**18,
            **_data(),  # type: ignore[arg-type]
        )
