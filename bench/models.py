"""The models people train (transformers, peft, torch's encoder, timm): dpcore against Opacus.

For each model of :data:`bench.models_zoo.MODELS` whose library is installed (small configs,
random weights, no download; a row whose library is missing says so, with no numbers), every
method of a row in one process (the full profile of ``python -m bench models`` starts a fresh
interpreter for each row, :func:`measure_in_fresh_process`), lot :data:`BATCH_SIZE`, float32,
``threads`` torch threads (1 by default):

- **Step time** of four full optimizer steps on the same fixed lot, each on its own copy of the
  model: ``nonprivate`` (forward, mean loss, backward, SGD step), ``dpcore`` (``engine="auto"``,
  prepared on the lot's first 8 examples before timing; the row records the engine ``auto``
  picked and any fallback warning; ``clipped_sum`` then ``DPOptimizer.step``), ``opacus_hooks``
  and ``opacus_ghost`` (``PrivacyEngine.make_private`` with that ``grad_sample_mode``, see
  :func:`bench.models_peers.opacus_step`; where Opacus refuses the model as given and
  ``ModuleValidator.fix`` leaves its outputs unchanged, ``nn.GRU`` by Opacus' ``DPGRU``, on the
  fixed model, the refusal kept as ``after_fix``: the model a user would train with Opacus).
  Each method takes :data:`WARMUP` untimed steps, then the methods are timed *interleaved*:
  repetition r times one step of every method, starting with method ``r mod 4`` so no method
  always runs first. A method that fails (building or stepping) records its error class and the
  first line of its message, and no number.
- **Ratios**: for each repetition, a method's step time over the non-private step's (or over
  an Opacus step's, for ``dpcore_over_opacus_*``) of that same repetition; the row holds the
  median over repetitions, beside each method's median step time.
- **Exactness** in float64 on a lot of :data:`EXACTNESS_LOT` (the same weights): a
  one-example-at-a-time autograd loop gives every example's gradient; dpcore's ``auto`` engine
  must match its per-example norms and its clipped sum at C = the median loop norm (about half
  the examples clipped), and Opacus' hooks' per-example gradients (``grad_sample``) must match
  the loop's; each records its largest absolute difference, and ``exact`` when it is at most
  :data:`TOLERANCE`. A peer's inexactness is a finding of the row.
- **Opacus' fix**: ``ModuleValidator.fix`` (the replacement Opacus asks for before it trains a
  model with layers its hooks do not support) is applied to a float64 copy and the outputs
  compared on the exactness lot (:func:`bench.models_peers.fix_difference`); a fix that changes
  the outputs is a finding.

Results: ``models.json`` (the commit, machine, library versions, configuration and load
average, and ``rows``: one per model, its headline numbers also as scalar fields,
:func:`summary_fields`), written atomically after every model, and ``models.md``, the
table made from it (:mod:`bench.models_table`). ``quick``: :data:`QUICK_REPETITIONS`
repetitions of the :data:`QUICK_MODELS` only. The full profile measures the
:data:`WIDE_MODELS` a second time at :data:`WIDE_SIZES` (width 512, 64 tokens; rows with
``"sizes": "wide"``, :data:`WIDE_REPETITIONS` repetitions each): at the default sizes a step
takes milliseconds and per-step fixed costs dominate every per-example method's ratio.

``nox -s bench -- models`` runs this in its own environment (``.nox/bench-models``: torch
2.14.1 with torchvision 0.29.1, which timm needs, beside transformers, peft and Opacus; see
``noxfile.py``); elsewhere the timm rows say their library is not installed.

With ``executor`` each model is a run of :func:`dpcore.runs.run_many` (:class:`ModelRun`,
:func:`measure`) handed one at a time (:func:`dpcore.runs.one_at_a_time`): no two timings share
a machine, and each row names the machine that timed it.
"""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import datetime
import json
import multiprocessing
import os
import statistics
import time
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import models_peers, models_table
from bench.models_zoo import (
    DEFAULT_SIZES,
    MODELS,
    SIZES,
    ModelRecipe,
    Sizes,
    mean_loss,
    per_example_loss,
    recipe,
)
from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs import ExecutorChoice, SupportsSubmit, machine, one_at_a_time, run_many
from dpcore.runs.torch_cells import LEARNING_RATE, MAX_GRAD_NORM, NOISE_MULTIPLIER
from dpcore.torch.batches import call_model, take
from dpcore.torch.engines import make_engine
from dpcore.torch.noise import SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer

__all__ = [
    "BATCH_SIZE",
    "EXACTNESS_LOT",
    "METHODS",
    "QUICK_MODELS",
    "QUICK_REPETITIONS",
    "REPETITIONS",
    "SIZE_PROFILES",
    "TOLERANCE",
    "WARMUP",
    "WIDE_MODELS",
    "WIDE_REPETITIONS",
    "ModelRun",
    "exactness",
    "measure",
    "model_run",
    "run",
    "save",
]

ROOT = Path(__file__).resolve().parents[1]
BATCH_SIZE = 32
REPETITIONS = 12
QUICK_REPETITIONS = 3
WARMUP = 2
EXACTNESS_LOT = 5
#: Largest absolute difference from the float64 loop counted as exact.
TOLERANCE = 1e-9
#: Examples of the lot ``auto`` chooses its engine on (before timing).
TRIAL_EXAMPLES = 8
METHODS = ("nonprivate", "dpcore", "opacus_hooks", "opacus_ghost")
OPACUS_METHODS = ("opacus_hooks", "opacus_ghost")
QUICK_MODELS = ("bert", "transformer_encoder")
LOT_SEED = 1
EXACTNESS_SEED = 2
VERSIONED = ("torch", "torchvision", "transformers", "peft", "opacus", "timm")
#: A realistic width for the same recipes: BERT-small-like transformers (width 512, 8 heads,
#: feed-forward 2,048, 64 tokens of a 1,000-token vocabulary), a ViT on 64 x 64 images in 8 x 8
#: patches (64 positions), LoRA of rank 8; two layers, so that a step stays about a second on
#: one CPU thread. At the default sizes (width 64, 16 tokens) a step takes milliseconds and the
#: per-step fixed costs of any per-example method dominate its ratio.
WIDE_SIZES = Sizes(
    vocabulary=1000,
    sequence_length=64,
    width=512,
    heads=8,
    feed_forward=2048,
    layers=2,
    image_size=64,
    patch_size=8,
    lora_rank=8,
)
#: The sizes a row can be measured at, by name (the name is what a :class:`ModelRun` holds).
SIZE_PROFILES = {"default": DEFAULT_SIZES, "wide": WIDE_SIZES}
#: The models measured again at :data:`WIDE_SIZES` in the full profile.
WIDE_MODELS = ("bert", "gpt2", "llama", "opt", "vit", "lora_bert", "lora_llama", "gru", "lstm")
#: Interleaved repetitions of a wide row (each step about a second).
WIDE_REPETITIONS = 9


@dataclasses.dataclass(frozen=True)
class ModelRun:
    """One model's measurement, as a picklable spec for :func:`dpcore.runs.run_many`."""

    model: str
    repetitions: int = REPETITIONS
    warmup: int = WARMUP
    threads: int = 1
    #: a key of :data:`SIZE_PROFILES`
    sizes: str = "default"


def model_run(entry: str, repetitions: int, threads: int) -> ModelRun:
    """The :class:`ModelRun` of ``entry``: a model's name (at the default sizes, with
    ``repetitions``), or ``"name:sizes"`` (``"gru:wide"``: at :data:`WIDE_SIZES`, with
    :data:`WIDE_REPETITIONS`).

    Raises:
        InvalidParameterError: an unknown model or sizes.
    """
    name, _, sizes = entry.partition(":")
    recipe(name)
    if not sizes or sizes == "default":
        return ModelRun(name, repetitions, WARMUP, threads)
    size_profile(sizes)
    return ModelRun(
        name, WIDE_REPETITIONS if sizes == "wide" else repetitions, WARMUP, threads, sizes
    )


def size_profile(name: str) -> Sizes:
    """The sizes called ``name`` in :data:`SIZE_PROFILES`.

    Raises:
        InvalidParameterError: no such name.
    """
    if name not in SIZE_PROFILES:
        raise InvalidParameterError("sizes", f"one of {sorted(SIZE_PROFILES)}", name)
    return SIZE_PROFILES[name]


def error_record(error: BaseException, stage: str) -> dict[str, Any]:
    """``{"stage", "type", "message"}``: the error's class and the first line of its message
    (``reasons``, the first line of each engine's reason, where the error lists them)."""
    lines = str(error).strip().splitlines()
    record: dict[str, Any] = {
        "stage": stage,
        "type": type(error).__name__,
        "message": lines[0] if lines else "",
    }
    reasons = getattr(error, "reasons", None)
    if isinstance(reasons, dict):
        record["reasons"] = {
            str(name): (str(reason).strip().splitlines() or [""])[0]
            for name, reason in reasons.items()
        }
    return record


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _nonprivate_step(model: nn.Module, inputs: Any, targets: torch.Tensor) -> Callable[[], None]:
    optimizer = torch.optim.SGD(_trainable(model), lr=LEARNING_RATE)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        mean_loss(call_model(model, inputs), targets).backward()
        optimizer.step()

    return step


def _dpcore_step(
    model: nn.Module, inputs: Any, targets: torch.Tensor, facts: dict[str, Any]
) -> Callable[[], None]:
    """dpcore's step with ``engine="auto"``, prepared here; ``facts`` gets the engine's name
    and the messages of the warnings ``auto`` gave while choosing."""
    engine = make_engine(model, engine="auto", max_grad_norm=MAX_GRAD_NORM)
    trial = slice(0, TRIAL_EXAMPLES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.prepare(take(inputs, trial), take(targets, trial), per_example_loss)
    facts["engine"] = engine.name
    facts["warnings"] = sorted(
        {f"{w.category.__name__}: {(str(w.message).splitlines() or [''])[0]}" for w in caught}
    )
    optimizer = torch.optim.SGD(_trainable(model), lr=LEARNING_RATE)
    private = DPOptimizer(
        optimizer,
        engine=engine,
        noise_multiplier=NOISE_MULTIPLIER,
        expected_batch_size=len(targets),
    )

    def step() -> None:
        private.step(engine.clipped_sum(inputs, targets, per_example_loss))

    return step


def _build_steps(
    model: nn.Module, inputs: Any, targets: torch.Tensor, facts: dict[str, dict[str, Any]]
) -> dict[str, Callable[[], None]]:
    """Every method's step on its own copy of ``model``; a method that cannot be built gets an
    ``error`` in ``facts[method]`` and no step."""
    steps: dict[str, Callable[[], None]] = {}
    for method in METHODS:
        own = copy.deepcopy(model)
        try:
            if method == "nonprivate":
                steps[method] = _nonprivate_step(own, inputs, targets)
            elif method == "dpcore":
                steps[method] = _dpcore_step(own, inputs, targets, facts[method])
            else:
                steps[method] = _opacus_step(method, own, inputs, targets, facts[method])
        except Exception as error:  # a peer's refusal is a result, not a crash
            facts[method]["error"] = error_record(error, "build")
    return steps


def _opacus_step(
    method: str, model: nn.Module, inputs: Any, targets: torch.Tensor, facts: dict[str, Any]
) -> Callable[[], None]:
    """Opacus' step on ``model``; where Opacus refuses it and ``ModuleValidator.fix`` gives the
    same function (:func:`bench.models_peers.exactly_fixed`: ``nn.GRU`` by ``DPGRU``), its step
    on the fixed model, with the refusal kept in ``facts["after_fix"]``."""

    def step(own: nn.Module) -> Callable[[], None]:
        return models_peers.opacus_step(
            method.removeprefix("opacus_"),
            own,
            inputs,
            targets,
            noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=MAX_GRAD_NORM,
            learning_rate=LEARNING_RATE,
        )

    original = copy.deepcopy(model)
    try:
        return step(model)
    except Exception as refused:
        fixed = models_peers.exactly_fixed(original, inputs)
        if fixed is None:
            raise
        made = step(fixed)
        facts["after_fix"] = error_record(refused, "build")
        return made


def time_interleaved(
    steps: dict[str, Callable[[], None]], *, repetitions: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, dict[str, Any]]]:
    """Warm every step up, then time them interleaved (:mod:`bench.models`' module doc).

    Returns:
        ``(seconds, errors)``: each method's step time per repetition (a method that failed
        has none), and the error record of each method that failed (stage ``"step"``).
    """
    errors: dict[str, dict[str, Any]] = {}
    live = dict(steps)
    for method, step in steps.items():
        try:
            for _ in range(warmup):
                step()
        except Exception as error:
            errors[method] = error_record(error, "step")
            del live[method]
    seconds: dict[str, list[float]] = {method: [] for method in live}
    order = list(live)
    for r in range(repetitions):
        shift = r % len(order) if order else 0
        for method in order[shift:] + order[:shift]:
            if method not in live:  # failed in an earlier repetition
                continue
            started = time.perf_counter()
            try:
                live[method]()
            except Exception as error:
                errors[method] = error_record(error, "step")
                del live[method]
                seconds.pop(method)
                continue
            seconds[method].append(time.perf_counter() - started)
    return seconds, errors


def median_ratio(numerator: list[float], denominator: list[float]) -> float | None:
    """Median over repetitions of ``numerator[r] / denominator[r]`` (None if either is empty)."""
    pairs = [a / b for a, b in zip(numerator, denominator, strict=False) if b > 0]
    return statistics.median(pairs) if pairs else None


# ----------------------------------------------------------------------------- exactness


def loop_gradients(
    model: nn.Module, inputs: Any, targets: torch.Tensor
) -> dict[str, list[torch.Tensor]]:
    """Each example's gradient alone (plain autograd), by trainable parameter name."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    found: dict[str, list[torch.Tensor]] = {name: [] for name, _ in named}
    for i in range(len(targets)):
        one = slice(i, i + 1)
        loss = per_example_loss(call_model(model, take(inputs, one)), targets[one]).sum()
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (name, p), grad in zip(named, grads, strict=True):
            found[name].append(torch.zeros_like(p) if grad is None else grad.detach())
    return found


def _norms(gradients: dict[str, list[torch.Tensor]], size: int) -> torch.Tensor:
    return torch.stack(
        [
            torch.sqrt(sum((rows[i].double() ** 2).sum() for rows in gradients.values()))  # type: ignore[arg-type]
            for i in range(size)
        ]
    )


def _dpcore_exactness(
    model: nn.Module, inputs: Any, targets: torch.Tensor, gradients: dict[str, list[torch.Tensor]]
) -> dict[str, Any]:
    size = len(targets)
    engine = make_engine(model, engine="auto", max_grad_norm=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.prepare(inputs, targets, per_example_loss)
    norms = _norms(gradients, size)
    engine.max_grad_norm = float(norms.median())
    lot = engine.clipped_sum(inputs, targets, per_example_loss)
    factors = torch.clamp(engine.max_grad_norm / norms, max=1.0)
    norm_difference = float((lot.norms - norms).abs().max())
    sum_difference = 0.0
    for (name, _), summed in zip(engine.named_parameters, lot.summed, strict=True):
        expected = sum(float(c) * g for c, g in zip(factors, gradients[name], strict=True))
        sum_difference = max(sum_difference, float((summed - expected).abs().max()))
    largest = max(norm_difference, sum_difference)
    return {
        "engine": engine.name,
        "norms_max_abs_diff": norm_difference,
        "clipped_sum_max_abs_diff": sum_difference,
        "max_abs_diff": largest,
        "exact": largest <= TOLERANCE,
        "error": None,
    }


def _opacus_exactness(
    model: nn.Module, inputs: Any, targets: torch.Tensor, gradients: dict[str, list[torch.Tensor]]
) -> dict[str, Any]:
    recorded = models_peers.opacus_gradients(model, inputs, targets)
    missing = sorted(name for name, sample in recorded.items() if sample is None)
    wrong_shape = []
    differences = {}
    for name, sample in recorded.items():
        expected = torch.stack(gradients[name])
        if sample is None:
            continue
        if sample.shape != expected.shape:  # e.g. one row for a lot (an input without batch)
            wrong_shape.append(f"{name} {list(sample.shape)} for {list(expected.shape)}")
            continue
        differences[name] = float((sample - expected).abs().max())
    largest = max(differences.values(), default=0.0)
    worst = sorted(differences, key=differences.__getitem__, reverse=True)
    return {
        "max_abs_diff": largest,
        "worst_parameters": [name for name in worst[:3] if differences[name] > TOLERANCE],
        "missing": missing,
        "wrong_shape": wrong_shape,
        "exact": largest <= TOLERANCE and not missing and not wrong_shape,
        "error": None,
    }


def _opacus_exactness_as_trained(
    model: nn.Module, inputs: Any, targets: torch.Tensor, gradients: dict[str, list[torch.Tensor]]
) -> dict[str, Any]:
    """Opacus' hooks on the model it trains: ``model``, or the exactly fixed one (compared with
    the loop on that model; its parameters have other names), marked ``after_fix``."""
    fixed = models_peers.exactly_fixed(model, inputs)
    if fixed is None:
        return _opacus_exactness(model, inputs, targets, gradients)
    own = loop_gradients(fixed, inputs, targets)
    return {**_opacus_exactness(fixed, inputs, targets, own), "after_fix": True}


def exactness(model_recipe: ModelRecipe, sizes: Sizes = DEFAULT_SIZES) -> dict[str, Any]:
    """dpcore's and Opacus' per-example gradients against the float64 loop, and Opacus' fix,
    for the model built at ``sizes``.

    Returns:
        ``{"lot", "dtype", "dpcore", "opacus_hooks", "opacus_fix"}``; a part that failed holds
        its ``error`` record (stage ``"exactness"``) instead of numbers.
    """
    model = model_recipe.model(dtype=torch.float64, sizes=sizes)
    inputs, targets = model_recipe.make_lot(
        EXACTNESS_LOT, EXACTNESS_SEED, torch.float64, sizes=sizes
    )
    gradients = loop_gradients(model, inputs, targets)
    result: dict[str, Any] = {"lot": EXACTNESS_LOT, "dtype": "float64", "tolerance": TOLERANCE}
    parts: dict[str, Callable[[nn.Module], dict[str, Any]]] = {
        "dpcore": lambda own: _dpcore_exactness(own, inputs, targets, gradients),
        "opacus_hooks": lambda own: _opacus_exactness_as_trained(own, inputs, targets, gradients),
        "opacus_fix": lambda own: models_peers.fix_difference(own, inputs),
    }
    for part, check in parts.items():
        try:
            result[part] = check(copy.deepcopy(model))
        except Exception as error:
            result[part] = {"error": error_record(error, "exactness")}
    return result


def findings(row: dict[str, Any]) -> list[str]:
    """What a row shows beyond its numbers: inexact per-example gradients, a fix that changes
    the model's outputs, an engine ``auto`` fell back to."""
    found = []
    checks = row.get("exactness") or {}
    for part, who in (("dpcore", "dpcore"), ("opacus_hooks", "Opacus hooks")):
        check = checks.get(part) or {}
        if check.get("exact") is not False:
            continue
        if check.get("missing") or check.get("wrong_shape"):
            details = [f"{shape}" for shape in check.get("wrong_shape") or []]
            details += [f"{name} none" for name in check.get("missing") or []]
            found.append(
                f"{who}: per-example gradients are not per example on a lot of "
                f"{checks['lot']}: grad_sample of {'; '.join(details)} (the other parameters "
                f"within {check['max_abs_diff']:.2g} of the loop)"
            )
        else:
            worst = ", ".join(check.get("worst_parameters") or [])
            found.append(
                f"{who}: per-example gradients differ from the float64 loop by up to "
                f"{check['max_abs_diff']:.3g}" + (f" (most in {worst})" if worst else "")
            )
    fix = checks.get("opacus_fix") or {}
    difference = fix.get("max_abs_output_difference")
    if difference is not None and difference > TOLERANCE:
        found.append(
            f"Opacus' ModuleValidator.fix replaces {', '.join(fix['replaced'])} by "
            f"{', '.join(fix['replaced_by'])}; the outputs then differ by up to {difference:.3g}"
        )
    dpcore = row.get("methods", {}).get("dpcore", {})
    if dpcore.get("engine") not in (None, "fast"):
        found.append(f"engine='auto' picked {dpcore['engine']}")
    return found


# ----------------------------------------------------------------------------- one model


def measure(run: ModelRun) -> dict[str, Any]:
    """One model's row: timings, ratios, errors, exactness and findings (module doc).

    Raises:
        InvalidParameterError: ``run.model`` is not a model of :data:`MODELS`.
    """
    model_recipe = recipe(run.model)
    size_profile(run.sizes)
    row: dict[str, Any] = {
        "model": model_recipe.name,
        "title": model_recipe.title,
        "library": model_recipe.library,
        "sizes": run.sizes,
        "batch_size": BATCH_SIZE,
        "repetitions": run.repetitions,
        "threads": run.threads,
        "hardware": machine(),
    }
    if not model_recipe.installed():
        row["status"] = f"not installed: {model_recipe.library}"
        return row
    previous = torch.get_num_threads()
    torch.set_num_threads(run.threads)
    # the peers' warnings (Opacus' hooks warn on every backward) are not results; dpcore's
    # engine choice records its own (``warnings`` of the dpcore method)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _measure(run, model_recipe, row)
        finally:
            torch.set_num_threads(previous)


def measure_in_fresh_process(run: ModelRun) -> dict[str, Any]:
    """:func:`measure` in a new (spawned) interpreter that measures this model only.

    In one process a model's steps are timed in memory the models before it have used: at
    width 512, Llama's dpcore step took 1.25 s and Opacus' hooks step 3.12 s after the other
    models, 1.07 s and 2.29 s alone (the non-private step 0.86 s and 0.82 s; 1 thread, 5
    repetitions). A fresh interpreter per model makes each row independent of the others.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        row: dict[str, Any] = pool.submit(measure, run).result()
    return row


def _measure(run: ModelRun, model_recipe: ModelRecipe, row: dict[str, Any]) -> dict[str, Any]:
    sizes = size_profile(run.sizes)
    try:
        model = model_recipe.model(sizes=sizes)
    except Exception as error:  # e.g. a library version that refuses the config
        row["status"] = "not built"
        row["error"] = error_record(error, "build")
        return row
    inputs, targets = model_recipe.make_lot(BATCH_SIZE, LOT_SEED, sizes=sizes)
    row["status"] = "measured"
    row["trainable_parameters"] = sum(p.numel() for p in _trainable(model))
    facts: dict[str, dict[str, Any]] = {method: {} for method in METHODS}
    steps = _build_steps(model, inputs, targets, facts)
    seconds, errors = time_interleaved(steps, repetitions=run.repetitions, warmup=run.warmup)
    reference = seconds.get("nonprivate", [])
    methods: dict[str, Any] = {}
    for method in METHODS:
        timed = seconds.get(method, [])
        entry = {
            "step_seconds": statistics.median(timed) if timed else None,
            "ratio_to_nonprivate": (
                median_ratio(timed, reference) if method != "nonprivate" and timed else None
            ),
            "error": facts[method].get("error") or errors.get(method),
            **{key: value for key, value in facts[method].items() if key != "error"},
        }
        methods[method] = entry
    row["methods"] = methods
    row["dpcore_over"] = {
        method: median_ratio(seconds.get("dpcore", []), seconds.get(method, []))
        for method in OPACUS_METHODS
    }
    row["noise"] = noise_draw(model, run.repetitions, reference)
    row["exactness"] = exactness(model_recipe, sizes)
    row["findings"] = findings(row)
    row.update(summary_fields(row))
    return row


def noise_draw(model: nn.Module, repetitions: int, nonprivate: list[float]) -> dict[str, Any]:
    """Seconds to draw one step's Gaussian noise for the trainable parameters with dpcore's
    default source (:class:`~dpcore.torch.noise.SeededGaussianNoise`: float64 draws rounded to
    the parameters' dtype), median of ``repetitions``, and its share of the non-private step:
    the part of dpcore's ratio that does not depend on the lot size (Opacus draws float32
    normals, whose tails stop at 5.77 sigma)."""
    source = SeededGaussianNoise(0)
    parameters = _trainable(model)
    seconds = []
    for _ in range(max(repetitions, 1)):
        start = time.perf_counter()
        for parameter in parameters:
            source.standard_normal(parameter.shape, dtype=parameter.dtype, device=parameter.device)
        seconds.append(time.perf_counter() - start)
    draw = statistics.median(seconds)
    step = statistics.median(nonprivate) if nonprivate else None
    return {
        "seconds": draw,
        "values": sum(p.numel() for p in parameters),
        "over_nonprivate_step": draw / step if step else None,
    }


def summary_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The row's headline numbers as scalar fields (what a generic table of the JSON shows):
    the non-private step time, the engine ``auto`` picked, each method's ratio to non-private,
    dpcore's ratios to Opacus, whether dpcore's and Opacus' per-example gradients are exact,
    and the class of each method's error."""
    methods = row["methods"]
    checks = row["exactness"]
    fields: dict[str, Any] = {
        "nonprivate_step_seconds": methods["nonprivate"]["step_seconds"],
        "engine": methods["dpcore"].get("engine"),
    }
    for method in METHODS[1:]:
        fields[f"{method}_ratio"] = methods[method]["ratio_to_nonprivate"]
    fields["noise_over_nonprivate_step"] = row.get("noise", {}).get("over_nonprivate_step")
    for method in OPACUS_METHODS:
        fields[f"dpcore_over_{method}"] = row["dpcore_over"][method]
    for part in ("dpcore", "opacus_hooks"):
        fields[f"{part}_exact"] = checks[part].get("exact")
    for method in METHODS:
        error = methods[method]["error"]
        fields[f"{method}_error"] = None if error is None else error["type"]
    return fields


# ----------------------------------------------------------------------------- the benchmark


def versions() -> dict[str, str | None]:
    """Installed versions of torch and the libraries (None where absent)."""
    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def save(results_dir: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write ``models.json`` (``meta``'s fields, ``models_measured`` and ``rows``) then
    ``models.md`` from it, atomically.

    Returns:
        the path of ``models.json``.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    document = {**meta, "models_measured": len(rows), "rows": rows}
    path = results_dir / "models.json"
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")
    models_table.write(path, results_dir / "models.md")
    return path


def _saved_for_adding(results_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The saved ``models.json``, checked to have been measured as this run will be.

    Raises:
        InvalidParameterError: no saved file, or one whose configuration differs.
    """
    path = results_dir / "models.json"
    try:
        document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InvalidParameterError("add", f"a saved, readable {path} to add to", True) from error
    same = ("batch_size", "dtype", "threads", "repetitions", "warmup_steps", "sizes", "methods")
    differing = [key for key in same if document.get("config", {}).get(key) != config[key]]
    if differing or not isinstance(document.get("rows"), list):
        raise InvalidParameterError(
            "add", f"{path} measured with this configuration (differs in {differing})", True
        )
    return document


def added_to(
    saved: dict[str, Any], rows: list[dict[str, Any]], meta: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(document, rows)`` of a saved ``models.json`` with ``rows`` added: a saved row of the
    same model and sizes is replaced, the others kept in place, new ones appended; each added
    row carries ``commit`` and ``date``, and ``document["added"]`` lists every addition."""
    stamped = [{**row, "commit": meta["commit"], "date": meta["date"]} for row in rows]
    fresh = {(row["model"], row.get("sizes")): row for row in stamped}
    kept = [fresh.pop((row["model"], row.get("sizes")), row) for row in saved["rows"]]
    kept += list(fresh.values())
    addition = {
        key: meta[key]
        for key in ("commit", "date", "load_average_at_start", "load_average_at_end")
        if key in meta
    }
    # the rows measured (a run stopped early lists fewer than it was asked for)
    addition["models"] = [
        row["model"] + ("" if row.get("sizes", "default") == "default" else f":{row['sizes']}")
        for row in rows
    ]
    document = {k: v for k, v in saved.items() if k not in ("rows", "models_measured")}
    document["added"] = [*saved.get("added", []), addition]
    return document, kept


def run(
    results_dir: Path,
    *,
    quick: bool = False,
    models: tuple[str, ...] | None = None,
    threads: int = 1,
    executor: str | ExecutorChoice | SupportsSubmit | None = None,
    fresh_process: bool = False,
    add: bool = False,
) -> list[dict[str, Any]]:
    """Measure every model (or ``models``), write ``models.json`` and ``models.md``.

    Args:
        results_dir: where the files go.
        quick: :data:`QUICK_REPETITIONS` repetitions, and only :data:`QUICK_MODELS` unless
            ``models`` is given.
        models: names of :data:`bench.models_zoo.MODELS` (default: all, or the quick ones);
            ``"name:wide"`` measures that model at :data:`WIDE_SIZES` (:func:`model_run`).
        threads: torch intra-op threads while measuring.
        executor: None or ``"local"``: one model after another in this process, the results
            saved after each. Else a :func:`dpcore.runs.run_many` executor handed one model at
            a time (:func:`dpcore.runs.one_at_a_time`), saved when all are done.
        fresh_process: without ``executor``, measure each model in a new interpreter
            (:func:`measure_in_fresh_process`; ``python -m bench models`` does for the full
            profile).
        add: with ``models``, add their rows to the saved ``models.json`` (replacing rows of
            the same models at the same sizes, keeping the others) instead of replacing the
            file; each added row records its commit and date, and the file lists the
            additions (:func:`added_to`). The saved file's configuration must be this run's.

    Raises:
        InvalidParameterError: an unknown model, ``threads`` < 1, or an invalid executor.
    """
    from dpcore.provenance import git_commit, provenance

    names = models if models is not None else (QUICK_MODELS if quick else tuple(MODELS))
    repetitions = QUICK_REPETITIONS if quick else REPETITIONS
    specs = [model_run(name, repetitions, threads) for name in names]
    if add and models is None:
        raise InvalidParameterError("add", "given with models (the rows to add)", add)
    if threads < 1:
        raise InvalidParameterError("threads", "an integer >= 1", threads)
    commit = git_commit(ROOT)  # before the first save changes the tracked results
    started = time.perf_counter()
    if not quick and models is None:  # the same recipes again at a realistic width
        specs += [ModelRun(name, WIDE_REPETITIONS, WARMUP, threads, "wide") for name in WIDE_MODELS]
    meta = provenance(
        root=ROOT,
        commit=commit,
        benchmark="models",
        date=datetime.date.today().isoformat(),
        hardware=machine(),
        versions=versions(),
        quick=quick,
        models=list(names),
        load_average_at_start=list(os.getloadavg()),
        config={
            "batch_size": BATCH_SIZE,
            "dtype": "float32",
            "threads": threads,
            "repetitions": repetitions,
            "warmup_steps": WARMUP,
            "statistic": "median over repetitions (ratios: of the per-repetition ratios)",
            "interleaved": True,
            "methods": list(METHODS),
            "noise_multiplier": NOISE_MULTIPLIER,
            "max_grad_norm": MAX_GRAD_NORM,
            "learning_rate": LEARNING_RATE,
            "dpcore_engine": "auto",
            "opacus_modes": ["hooks", "ghost"],
            "exactness_lot": EXACTNESS_LOT,
            "exactness_dtype": "float64",
            "tolerance": TOLERANCE,
            "sizes": SIZES,
            "wide_sizes": dataclasses.asdict(WIDE_SIZES),
            "wide_repetitions": WIDE_REPETITIONS,
            "fresh_process_per_model": fresh_process and executor in (None, "local"),
        },
    )

    saved = _saved_for_adding(results_dir, meta["config"]) if add else None

    def finish(rows: list[dict[str, Any]]) -> None:
        meta["wall_seconds"] = time.perf_counter() - started
        meta["load_average_at_end"] = list(os.getloadavg())
        if saved is None:
            save(results_dir, rows, meta)
        else:
            document, kept = added_to(saved, rows, meta)
            save(results_dir, kept, document)

    with one_at_a_time(executor) as chosen:
        if chosen is not None:
            rows: list[dict[str, Any]] = run_many(measure, specs, executor=chosen)
            finish(rows)
            return rows
    rows = []
    for spec in specs:
        rows.append(measure_in_fresh_process(spec) if fresh_process else measure(spec))
        print(models_table.summary(rows[-1]), flush=True)
        finish(rows)  # a run stopped early keeps what it measured
    return rows
