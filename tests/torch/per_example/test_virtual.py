"""Virtual lots equal one-batch lots; lots of tuples and dicts work on every engine."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.engines import make_engine
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.per_example.virtual import clipped_sum_in_parts
from dpcore.torch.samplers import PoissonSampler
from dpcore.torch.training import DPTrainer
from tests.torch.reference import loop_clipped_sum, loop_norms
from tests.torch.zoo import ZOO

CROSS_ENTROPY = nn.CrossEntropyLoss(reduction="none")
ENGINES: dict[str, dict[str, object]] = {
    "fast": {},
    "vmap": {},
    "loop": {},
    "jl": {"jl_dimension": 3},
}


@pytest.mark.parametrize("name", ["positional_gpt", "cls_token_encoder", "tied_embedding_lm"])
@pytest.mark.parametrize("engine_name", sorted(ENGINES))
@pytest.mark.parametrize("physical", [1, 3, 7])
def test_micro_batches_equal_one_batch(name: str, engine_name: str, physical: int) -> None:
    torch.manual_seed(0)
    model = ZOO[name]()
    options = ENGINES[engine_name]
    inputs, targets = model.make_batch(10, seed=4)
    results = []
    for split in (None, physical):
        if engine_name == "jl":  # the same directions for both runs
            options = {**options, "directions": SeededGaussianNoise(11)}
        engine = make_engine(model, engine=engine_name, max_grad_norm=0.5, **options)  # type: ignore[arg-type]
        engine.prepare(inputs, targets, CROSS_ENTROPY)
        if split is None:
            with engine.one_lot():
                results.append(engine.clipped_sum(inputs, targets, CROSS_ENTROPY))
        else:
            results.append(
                clipped_sum_in_parts(
                    engine, inputs, targets, CROSS_ENTROPY, max_physical_batch_size=split
                )
            )
    whole, parts = results
    torch.testing.assert_close(parts.norms, whole.norms, atol=1e-10, rtol=0)
    torch.testing.assert_close(parts.clip_factors, whole.clip_factors, atol=1e-10, rtol=0)
    for found, expected in zip(parts.summed, whole.summed, strict=True):
        torch.testing.assert_close(found, expected, atol=1e-10, rtol=0)


def test_micro_batch_size_must_be_positive() -> None:
    model = ZOO["positional_gpt"]()
    engine = make_engine(model, engine="fast", max_grad_norm=1.0)
    inputs, targets = model.make_batch(4)
    for bad in (0, -1, 1.5):
        with pytest.raises(InvalidParameterError, match="max_physical_batch_size"):
            clipped_sum_in_parts(
                engine,
                inputs,
                targets,
                CROSS_ENTROPY,
                max_physical_batch_size=bad,  # type: ignore[arg-type]
            )


def test_trainer_with_virtual_lots_takes_the_same_steps() -> None:
    parameters = []
    for physical in (None, 3):
        torch.manual_seed(0)
        model = ZOO["prompt_tuned"]()
        inputs, targets = model.make_batch(40, seed=2)
        trainer = DPTrainer.dp_sgd(
            model,
            lr=0.1,
            inputs=inputs,
            targets=targets,
            loss_fn=CROSS_ENTROPY,
            noise_multiplier=1.0,
            max_grad_norm=0.5,
            sampler=PoissonSampler(40, sampling_probability=0.3, seed=3),
            seed=4,
            max_physical_batch_size=physical,
        )
        results = trainer.train(steps=8, delta=1e-5, progress=False)
        assert trainer.ledger.steps == 8 and max(r.lot_size for r in results) > 3
        parameters.append([p.detach().clone() for p in model.parameters()])
    for found, expected in zip(*parameters, strict=True):
        torch.testing.assert_close(found, expected, atol=1e-10, rtol=0)


class _TwoInputs(nn.Module):
    """``model(tokens, features)`` and ``model(tokens=..., mask=...)``-style inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(7, 4, dtype=torch.float64)
        self.features = nn.Linear(3, 4, dtype=torch.float64)
        self.head = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(tokens) * mask.unsqueeze(-1)
        return self.head(torch.tanh(hidden.sum(1) + self.features(mask[:, :3])))


def _structured_lot(kind: str, size: int) -> tuple[object, torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    tokens = torch.randint(0, 7, (size, 5), generator=generator)
    mask = torch.rand(size, 5, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 3, (size,), generator=generator)
    if kind == "tuple":
        return (tokens, mask), targets
    return {"tokens": tokens, "mask": mask}, targets


def _loop(model: nn.Module, inputs: object, targets: torch.Tensor) -> list[list[torch.Tensor]]:
    parameters = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(targets.shape[0]):
        if isinstance(inputs, dict):
            out = model(**{k: v[i : i + 1] for k, v in inputs.items()})
        else:
            out = model(*(t[i : i + 1] for t in inputs))  # type: ignore[attr-defined]
        loss = CROSS_ENTROPY(out, targets[i : i + 1]).sum()
        rows.append(list(torch.autograd.grad(loss, parameters)))
    return rows


@pytest.mark.parametrize("kind", ["tuple", "dict"])
@pytest.mark.parametrize("engine_name", ["fast", "vmap", "loop"])
def test_tuple_and_dict_inputs_are_exact(kind: str, engine_name: str) -> None:
    torch.manual_seed(0)
    model = _TwoInputs()
    engine = make_engine(model, engine=engine_name, max_grad_norm=0.3)
    for size in (0, 1, 3, 5, 7):
        inputs, targets = _structured_lot(kind, size)
        lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
        if size == 0:
            assert lot.norms.shape == (0,)
            continue
        gradients = _loop(model, inputs, targets)
        torch.testing.assert_close(lot.norms, loop_norms(gradients), atol=1e-10, rtol=0)
        for found, expected in zip(lot.summed, loop_clipped_sum(gradients, 0.3), strict=True):
            torch.testing.assert_close(found, expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kind", ["tuple", "dict"])
def test_jl_projections_of_structured_inputs(kind: str) -> None:
    torch.manual_seed(0)
    model = _TwoInputs()
    engine = make_engine(model, engine="jl", max_grad_norm=0.3, jl_dimension=2)
    inputs, targets = _structured_lot(kind, 5)
    engine.prepare(inputs, targets, CROSS_ENTROPY)  # projections checked against the loop
    lot = engine.clipped_sum(inputs, targets, CROSS_ENTROPY)
    assert lot.norms.shape == (5,) and bool(torch.isfinite(lot.norms).all())


def test_a_lot_whose_tensors_disagree_on_its_size_is_refused() -> None:
    engine = make_engine(_TwoInputs(), engine="fast", max_grad_norm=1.0)
    bad = {"tokens": torch.zeros(4, 5, dtype=torch.long), "mask": torch.zeros(3, 5)}
    with pytest.raises(InvalidParameterError, match="inputs"):
        engine.clipped_sum(bad, torch.zeros(4, dtype=torch.long), CROSS_ENTROPY)
