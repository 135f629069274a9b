"""The models people train, built by their libraries (transformers, peft, torch, timm; tiny
configs, random weights: :mod:`tests.torch.library_models`, the models benchmark's recipes) on
dpcore's exact engines.

``auto`` must pick the fast engine for each (torch's ``nn.GRU`` through its decomposed
recurrence; the loop engine for Mixtral, whose experts run on the tokens routed to them; the
vmap engine for Mamba and RWKV, which use operations the fast path has no rule for), and its
per-example norms and clipped sums equal a one-example-at-a-time autograd loop in float64; the
vmap engine drops the outputs' cache objects and refuses, with a typed error, a model it cannot
run (BERT's attention-mask checks branch on the data).

timm is not installed beside the project's torch (its torchvision needs another torch build), so
the timm models are tested here only where timm is installed: they run in the models benchmark's own
environment (``.nox/bench-models/bin/python -m pytest
tests/torch/per_example/test_library_models.py``), and the timm constructs the fast path needed
a rule for are checked in every environment by torch stand-ins
(``tests/torch/per_example/test_timm_constructs.py``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpcore.torch.engines import make_engine
from dpcore.torch.errors import EngineFallbackWarning, IncompatibleModelError
from dpcore.torch.per_example.base import PerExampleEngine
from dpcore.torch.per_example.vmap import VmapEngine
from tests.torch.library_models import LIBRARY_MODELS, LibraryModel
from tests.torch.reference import loop_clipped_sum, loop_gradients, loop_norms

TOLERANCE = 1e-10

#: The engine ``auto`` picks for each model.
AUTO_PICKS = dict.fromkeys(LIBRARY_MODELS, "fast") | {
    "mixtral": "loop",
    "mamba": "vmap",
    "rwkv": "vmap",
}
#: Models tested in training mode (their dropout is 0): RWKV's and Mamba's eval-mode forwards
#: write their cache in place (RWKV's cannot be differentiated there even by plain autograd, and
#: vmap can run neither), their training-mode forwards keep no cache.
TRAINING_MODE = {"rwkv", "mamba"}


#: The models whose library imports here: timm's only in the models benchmark's environment.
INSTALLED = sorted(name for name, spec in LIBRARY_MODELS.items() if spec.installed())


def test_every_library_but_timm_is_installed_in_the_test_environment() -> None:
    """The default suite covers every transformers, peft and torch model (a missing test
    dependency must fail here, not thin the list silently)."""
    missing = {spec.library for name, spec in LIBRARY_MODELS.items() if name not in INSTALLED}
    assert missing <= {"timm"}, missing


def _assert_matches_loop(
    engine: PerExampleEngine, model: nn.Module, spec: LibraryModel, size: int
) -> None:
    inputs, targets = spec.lot(size, size)
    gradients = loop_gradients(model, inputs, targets, spec.loss)
    norms = loop_norms(gradients)
    engine.max_grad_norm = float(norms.median())  # clips about half of the examples
    lot = engine.clipped_sum(inputs, targets, spec.loss)
    torch.testing.assert_close(lot.norms, norms, atol=TOLERANCE, rtol=0)
    expected = loop_clipped_sum(gradients, engine.max_grad_norm)
    for (name, _), found, wanted in zip(engine.named_parameters, lot.summed, expected, strict=True):
        torch.testing.assert_close(found, wanted, atol=TOLERANCE, rtol=0, msg=name)


@pytest.mark.parametrize("name", INSTALLED)
def test_auto_picks_an_exact_engine_that_matches_the_loop(name: str) -> None:
    spec = LIBRARY_MODELS[name]
    model = spec.model() if name in TRAINING_MODE else spec.model().eval()
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EngineFallbackWarning)
        engine.prepare(*spec.lot(8, 1), spec.loss)
    assert engine.name == AUTO_PICKS[name]
    for size in (1, 7):
        _assert_matches_loop(engine, model, spec, size)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_vmap_engine_drops_the_cache_and_keeps_the_logits(name: str) -> None:
    spec = LIBRARY_MODELS[name]
    model = spec.model().eval()
    engine = VmapEngine(model, max_grad_norm=1.0)
    _assert_matches_loop(engine, model, spec, 5)
    inputs, targets = spec.lot(4, 9)
    lot = engine.clipped_sum(inputs, targets, spec.loss)
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(lot.outputs.logits, expected)
    assert lot.outputs.past_key_values is None  # the cache object is not a tensor: dropped


def test_vmap_engine_refuses_a_model_vmap_cannot_run_with_a_typed_error() -> None:
    spec = LIBRARY_MODELS["bert"]
    engine = VmapEngine(spec.model(), max_grad_norm=1.0)
    with pytest.raises(IncompatibleModelError, match="cannot run this model under") as refused:
        engine.prepare(*spec.lot(6, 1), spec.loss)
    assert isinstance(refused.value.__cause__, RuntimeError)
