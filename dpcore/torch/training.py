"""A DP training loop: sampler -> engine -> noisy optimizer step -> ledger, with checkpoints.

:class:`DPTrainer` runs DP-SGD / DP-Adam (and their JL variants, ``engine="jl"``) on an
in-memory dataset. Every step, even on an empty lot, adds noise and records one ledger event;
``save_checkpoint``/``load_checkpoint`` cover model, optimizer, noise, JL directions, sampler and
ledger, so a resumed run reproduces an uninterrupted one exactly on CPU with fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.accountants import accountant_class
from dpcore.atomic import atomic_path
from dpcore.calibration import DEFAULT_ACCOUNTANT, calibrate_noise
from dpcore.errors import DPCoreError, InvalidParameterError, StateError, UnsupportedEventError
from dpcore.torch.arguments import (
    check_betas,
    check_entry_arguments,
    check_model,
    check_momentum,
    derived_seed,
)
from dpcore.torch.batches import Batch, batch_size, take
from dpcore.torch.budget import BUDGET_POLICIES, PrivacyBudget
from dpcore.torch.checkpoint import (
    check_generator_state,
    check_ledger,
    check_model_state,
    require,
    seal,
    snapshot,
    verify,
)
from dpcore.torch.engines import make_engine
from dpcore.torch.ledger import PrivacyLedger, training_statement, write_statement
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import LossFunction, NonFinitePolicy
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.per_example.virtual import clipped_sum_in_parts
from dpcore.torch.samplers import BallsInBinsSampler, PoissonSampler, ShuffledBatchSampler
from dpcore.validation import check_count, check_delta, check_positive

__all__ = ["DPTrainer", "StepResult", "accuracy", "logits"]

Sampler = PoissonSampler | ShuffledBatchSampler | BallsInBinsSampler


def logits(outputs: Any) -> torch.Tensor | None:
    """The score tensor of a model's outputs: a tensor, or a Hugging Face output's ``logits``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    found = outputs.get("logits") if isinstance(outputs, Mapping) else None
    if found is None:
        found = getattr(outputs, "logits", None)
    return found if isinstance(found, torch.Tensor) else None


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction correct: argmax for class scores, sign for a single logit per example."""
    if outputs.shape[0] == 0:
        return math.nan
    if outputs.dim() == 2 and outputs.shape[1] > 1:
        predicted = outputs.argmax(dim=1)
    else:
        predicted = (outputs.reshape(-1) > 0).to(targets.dtype)
    return float((predicted == targets.reshape(-1)).float().mean())


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one step reports (the lot size is for the user's eyes; it is not released)."""

    step: int
    lot_size: int
    loss: float
    accuracy: float


def _check_lr(model: nn.Module, lr: float) -> None:
    """lr > 0 and finite in the parameters' dtype (torch's optimizers refuse it otherwise)."""
    check_model(model)
    check_positive("lr", lr)
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    limit = min((torch.finfo(dtype).max for dtype in dtypes), default=math.inf)
    if lr > limit:
        raise InvalidParameterError(
            "lr", f"<= {limit:.3g}, the largest value of the parameters' dtype", lr
        )


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    check_model(model)
    return [p for p in model.parameters() if p.requires_grad]


def _plan(
    sampler: Sampler,
    *,
    engine: str,
    target_epsilon: float | None,
    target_delta: float | None,
    budget: str,
) -> PrivacyBudget | None:
    """The run's budget (``None`` without ``target_epsilon``), refused where it cannot hold."""
    if budget not in BUDGET_POLICIES:
        raise InvalidParameterError("budget", f"in {BUDGET_POLICIES}", budget)
    if target_epsilon is None:
        return None
    if target_delta is None:
        raise InvalidParameterError("target_delta", "given with target_epsilon", None)
    if engine == "jl" or isinstance(sampler, BallsInBinsSampler):
        raise InvalidParameterError(
            "target_epsilon",
            "not given for the JL engine or balls-in-bins sampling (their steps need the jl "
            "or rdp accountant: pass noise_multiplier and read epsilon from the ledger)",
            target_epsilon,
        )
    return PrivacyBudget(epsilon=target_epsilon, delta=target_delta, policy=budget)


class DPTrainer:
    """Differentially private training of ``model`` on ``(inputs, targets)``.

    Args:
        model: the model; its examples must be independent (no BatchNorm).
        inputs: all training inputs, first dimension N: a tensor, or a tuple/list/dict of
            tensors (the model is called as ``model(x)``, ``model(*x)`` or ``model(**x)``).
        targets: all training targets, first dimension N (a tensor or such a structure).
        loss_fn: per-example losses (``reduction="none"``).
        optimizer: a torch optimizer over the model's trainable parameters (SGD for DP-SGD,
            Adam for DP-Adam).
        noise_multiplier: sigma > 0; or ``None`` with ``target_epsilon``, ``target_delta`` and
            ``epochs``: the smallest sigma (to 1 %) whose certified PLD upper bound after
            ``epochs`` epochs (``len(sampler)`` lots each) meets the target.
        max_grad_norm: the clipping norm C > 0.
        sampler: a :class:`PoissonSampler` (default analysis), a :class:`BallsInBinsSampler`
            (analysed per epoch as random allocation) or a :class:`ShuffledBatchSampler` (no
            valid upper bound; its statement carries a certified lower bound).
        engine: ``"auto"``, ``"fast"``, ``"vmap"``, ``"loop"`` or ``"jl"``; every engine is
            checked on trial lots built from the first examples at construction (``auto``
            chooses there).
        jl_dimension: r for ``engine="jl"``.
        noise: the noise source (default seeded from ``seed``).
        seed: seeds the noise and the JL directions when their sources are not given.
        nonfinite: ``"raise"`` or ``"zero"`` for NaN/inf per-example gradients.
        max_physical_batch_size: clip each lot this many examples at a time (virtual lots:
            memory follows this size, the noise and the ledger event stay one per lot);
            ``None`` processes a lot in one batch.
        target_epsilon: the planned epsilon: kept as :attr:`budget` and checked before every
            step, resumed runs included (with ``noise_multiplier=None`` also calibrated for).
        target_delta: the planned delta (required with ``target_epsilon``).
        epochs: the planned epochs, to calibrate ``noise_multiplier`` for.
        budget: ``"warn"`` (a :class:`~dpcore.torch.budget.BudgetExceededWarning`, once) or
            ``"stop"`` (a :class:`~dpcore.torch.budget.BudgetExceededError` before the step,
            nothing changed) when a step would take the ledger past the plan.

    Raises:
        InvalidParameterError: before anything is built, on a bad argument; among them
            neither ``noise_multiplier`` nor a full plan (``target_epsilon``, ``target_delta``,
            ``epochs``), a plan for the JL engine or balls-in-bins sampling (their steps need
            other accountants than the certified PLD one), or a ``budget`` not in
            ``("warn", "stop")``.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        inputs: Batch,
        targets: Batch,
        loss_fn: LossFunction,
        optimizer: torch.optim.Optimizer,
        noise_multiplier: float | None = None,
        max_grad_norm: float,
        sampler: Sampler,
        engine: str = "auto",
        jl_dimension: int | None = None,
        noise: NoiseSource | None = None,
        seed: int | None = None,
        nonfinite: NonFinitePolicy = "raise",
        max_physical_batch_size: int | None = None,
        target_epsilon: float | None = None,
        target_delta: float | None = None,
        epochs: int | None = None,
        budget: str = "warn",
    ) -> None:
        check_entry_arguments(
            model=model,
            optimizer=optimizer,
            loss_fn=loss_fn,
            seed=seed,
            noise=noise,
            engine=engine,
            jl_dimension=jl_dimension,
        )
        size = batch_size(inputs)
        if batch_size(targets, "targets") != size:
            raise InvalidParameterError(
                "targets", f"to have {size} rows like inputs", batch_size(targets, "targets")
            )
        if not isinstance(sampler, PoissonSampler | ShuffledBatchSampler | BallsInBinsSampler):
            raise InvalidParameterError(
                "sampler",
                "to be a PoissonSampler, BallsInBinsSampler or ShuffledBatchSampler",
                sampler,
            )
        if sampler.dataset_size != size:
            raise InvalidParameterError(
                "sampler", f"to sample from {size} examples", sampler.dataset_size
            )
        self.budget = _plan(
            sampler,
            engine=engine,
            target_epsilon=target_epsilon,
            target_delta=target_delta,
            budget=budget,
        )
        if noise_multiplier is None:
            if target_epsilon is None or target_delta is None or epochs is None:
                raise InvalidParameterError(
                    "noise_multiplier",
                    "given, or None with target_epsilon, target_delta and epochs",
                    None,
                )
            noise_multiplier = calibrate_noise(
                target_epsilon=target_epsilon,
                target_delta=target_delta,
                sampling_probability=sampler.sampling_probability,
                steps=check_count("epochs", epochs, minimum=1) * sampler.steps_per_epoch,
                accountant=DEFAULT_ACCOUNTANT,
            )
        self.max_physical_batch_size = (
            None
            if max_physical_batch_size is None
            else check_count("max_physical_batch_size", max_physical_batch_size, minimum=1)
        )
        self.model = model
        self.inputs = inputs
        self.targets = targets
        self.loss_fn = loss_fn
        self.sampler = sampler
        directions = None if seed is None else SeededGaussianNoise(derived_seed(seed))
        self.engine = make_engine(
            model,
            engine=engine,
            max_grad_norm=max_grad_norm,
            jl_dimension=jl_dimension,
            directions=directions,
            nonfinite=nonfinite,
        )
        pool = slice(0, min(size, self.engine.TRIAL_POOL))
        if size:  # refuse an incompatible model now, not at some later lot
            self.engine.prepare(take(inputs, pool), take(targets, pool), loss_fn)
        self.optimizer = DPOptimizer(
            optimizer,
            engine=self.engine,
            noise_multiplier=noise_multiplier,
            expected_batch_size=sampler.expected_lot_size,
            noise=noise if noise is not None else SeededGaussianNoise(seed),
        )
        self.ledger = PrivacyLedger(
            dataset_size=sampler.dataset_size,
            sampler=sampler.kind,
            steps_per_epoch=None if sampler.kind == "poisson" else sampler.steps_per_epoch,
            first_lot=sampler.lots_drawn,  # a sampler's epochs count from its own first lot
        )
        self.jl_dimension = self.engine.jl_dimension if isinstance(self.engine, JLEngine) else None

    @classmethod
    def dp_sgd(
        cls, model: nn.Module, *, lr: float, momentum: float = 0.0, **kwargs: Any
    ) -> DPTrainer:
        """DP-SGD (Abadi et al. 2016, Alg. 1); DP-SGD-JL with ``engine="jl", jl_dimension=r``.

        Raises:
            InvalidParameterError: before anything is built, for ``lr`` not > 0 and finite,
                ``momentum`` not >= 0 and finite, or a bad shared argument (see
                :func:`dpcore.torch.arguments.check_entry_arguments`).
        """
        _check_lr(model, lr)
        momentum = check_momentum(momentum)
        check_entry_arguments(**kwargs)  # refused before the optimizer is built
        optimizer = torch.optim.SGD(_trainable(model), lr=lr, momentum=momentum)
        return cls(model, optimizer=optimizer, **kwargs)

    @classmethod
    def dp_adam(
        cls,
        model: nn.Module,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        **kwargs: Any,
    ) -> DPTrainer:
        """DP-Adam: Adam's update of the noisy gradient (post-processing); -JL as for DP-SGD.

        Raises:
            InvalidParameterError: before anything is built, for ``lr`` not > 0 and finite,
                ``betas`` not two numbers each in [0, 1) (the bad one named ``betas[i]``), or a
                bad shared argument (see :func:`dpcore.torch.arguments.check_entry_arguments`).
        """
        _check_lr(model, lr)
        betas = check_betas(betas)
        check_entry_arguments(**kwargs)  # refused before the optimizer is built
        optimizer = torch.optim.Adam(_trainable(model), lr=lr, betas=betas)
        return cls(model, optimizer=optimizer, **kwargs)

    @property
    def steps_done(self) -> int:
        """Noisy steps taken so far (equal to the ledger's count)."""
        return self.ledger.steps

    def step(self) -> StepResult:
        """Draw a lot, clip, add noise, step, record the event.

        Everything that could stop the step from being recorded is checked first, before the
        sampler draws, noise is drawn or a parameter moves, and again right before the noisy
        step; an error while the lot is clipped (e.g. a non-finite gradient) puts the sampler
        (and JL directions) back, so the ledger and the sampler stay in step.

        Raises:
            InvalidParameterError: the optimizer's trainable parameters are no longer the
                engine's (:meth:`~dpcore.torch.optimizers.DPOptimizer.check_parameters`), or
                the ledger would refuse the step (e.g. ``noise_multiplier`` changed under
                balls-in-bins sampling, or the sampler drew lots outside the trainer).
            BudgetExceededError: with ``target_epsilon`` and ``budget="stop"``, when this
                step would take the ledger past the plan (``budget="warn"``: a
                :class:`~dpcore.torch.budget.BudgetExceededWarning`, and the step runs).
        """
        self.optimizer.check_parameters()
        number = self.sampler.lots_drawn
        self._check_event(number)
        if self.budget is not None:  # warn, or stop before anything changes
            self.budget.check(
                self.ledger,
                sampling_probability=self.sampler.sampling_probability,
                noise_multiplier=self.optimizer.noise_multiplier,
                jl_dimension=self.jl_dimension,
            )
        self.model.train()
        drawn_from = self.sampler.state_dict()  # a snapshot: sampling replaces, never mutates
        directions = (
            self.engine.directions.state_dict() if isinstance(self.engine, JLEngine) else None
        )
        try:
            lot = self.sampler.sample()
            inputs, targets = take(self.inputs, lot), take(self.targets, lot)
            if self.max_physical_batch_size is None:
                clipped = self.engine.clipped_sum(inputs, targets, self.loss_fn)
            else:
                clipped = clipped_sum_in_parts(
                    self.engine,
                    inputs,
                    targets,
                    self.loss_fn,
                    max_physical_batch_size=self.max_physical_batch_size,
                )
            # Again right before the noisy step: the loss function and audit hooks ran since.
            self.optimizer.check_parameters()
            self._check_event(number)
        except BaseException:
            # Nothing was released: the next step draws this lot (and JL directions) again.
            self.sampler.load_state_dict(drawn_from)
            if isinstance(self.engine, JLEngine) and directions is not None:
                self.engine.directions.load_state_dict(directions)
            raise
        self.optimizer.step(clipped)
        self.ledger.record(
            sampling_probability=self.sampler.sampling_probability,
            noise_multiplier=self.optimizer.noise_multiplier,
            jl_dimension=self.jl_dimension,
            lot=number,
        )
        loss = float(clipped.losses.mean()) if len(lot) else math.nan
        scores = logits(clipped.outputs)
        correct = (
            accuracy(scores, targets)
            if scores is not None and isinstance(targets, torch.Tensor)
            else math.nan
        )
        return StepResult(self.ledger.steps, len(lot), loss, correct)

    def _check_event(self, lot: int) -> None:
        """Raise what recording the step on sampler lot ``lot`` would raise (records nothing)."""
        self.ledger.check(
            sampling_probability=self.sampler.sampling_probability,
            noise_multiplier=self.optimizer.noise_multiplier,
            jl_dimension=self.jl_dimension,
            lot=lot,
        )

    def epsilon(self, *, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """Epsilon spent so far, from the named accountant (default: PLD's certified bound)."""
        return self.ledger.epsilon(delta=delta, accountant=accountant)

    def train(
        self,
        *,
        steps: int | None = None,
        delta: float,
        epochs: int | None = None,
        progress: bool = True,
        accountant: str = DEFAULT_ACCOUNTANT,
        on_step: Callable[[StepResult], None] | None = None,
    ) -> list[StepResult]:
        """Take ``steps`` more steps, showing loss, accuracy and epsilon spent in a progress bar.

        ``epochs=E`` instead of ``steps`` takes E ``len(sampler)`` steps (round(1 / q) lots per
        epoch for Poisson sampling). The bar's epsilon comes from ``accountant`` (by default the
        PLD accountant's certified upper bound, the number :meth:`epsilon` returns) and is
        labelled with its name, ``eps(pld)=...``; it shows ``n/a`` when that accountant cannot
        analyse the steps (JL steps need the JL accountant).

        Raises:
            InvalidParameterError: before any step, both or neither of ``steps`` and
                ``epochs``, a bad count, delta or accountant name.
        """
        if (steps is None) == (epochs is None):
            raise InvalidParameterError("steps", "given exactly when epochs is not", steps)
        if epochs is not None:
            steps = check_count("epochs", epochs) * len(self.sampler)
        count = check_count("steps", steps)
        target = check_delta("delta", delta)
        accountant_class(accountant)  # an unknown name fails now, not after the first steps
        results = []
        for result in self._bar(count, progress, delta=target, accountant=accountant):
            results.append(result)
            if on_step is not None:
                on_step(result)
        return results

    def _bar(
        self, steps: int, progress: bool, *, delta: float, accountant: str
    ) -> Iterator[StepResult]:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # pragma: no cover - the progress extra is not installed
            progress = False
        bar = tqdm(total=steps, desc="DP training", unit="step") if progress else None
        running_loss = math.nan
        for taken in range(1, steps + 1):
            result = self.step()
            if not math.isnan(result.loss):
                running_loss = (
                    result.loss
                    if math.isnan(running_loss)
                    else 0.9 * running_loss + 0.1 * result.loss
                )
            if bar is not None:
                bar.update(1)
                if taken % 10 == 0 or taken == steps:
                    bar.set_postfix(
                        {
                            "loss": f"{running_loss:.3f}",
                            "acc": f"{result.accuracy:.3f}",
                            f"eps({accountant})": self._epsilon_text(delta, accountant),
                        }
                    )
            yield result
        if bar is not None:
            bar.close()

    def _epsilon_text(self, delta: float, accountant: str) -> str:
        try:
            return f"{self.epsilon(delta=delta, accountant=accountant):.3g}"
        except UnsupportedEventError:
            return "n/a"

    def privacy_statement(
        self, *, delta: float, accountants: tuple[str, ...] = ("rdp", "pld"), **extra: Any
    ) -> dict[str, Any]:
        """The ledger's statement with the engine, clipping norm, noise and JL dimension."""
        return training_statement(
            self.ledger,
            delta,
            accountants,
            self.optimizer,
            self.sampler,
            self.jl_dimension,
            **extra,
        )

    def save_statement(self, path: str | Path, *, delta: float, **extra: Any) -> dict[str, Any]:
        """Write :meth:`privacy_statement` as JSON to ``path``; returns it."""
        return write_statement(path, self.privacy_statement(delta=delta, **extra))

    # ------------------------------------------------------------------ checkpoints
    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "ledger": self.ledger.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if isinstance(self.engine, JLEngine):
            state["directions"] = self.engine.directions.state_dict()
        return state

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer (with noise), JL directions, sampler, ledger and torch's RNG state.

        A snapshot (tensors copied, so training on does not change it), sealed with an
        integrity digest: the sha256 of every entry, tensors by dtype, shape and bytes
        (:mod:`dpcore.torch.checkpoint`). It detects corruption and accidental edits, not a
        deliberate forger, who can recompute it.
        """
        return seal(snapshot(self._state()))

    def check_state_dict(self, state: Any) -> PrivacyLedger:
        """Refuse a state that does not belong to this trainer; changes nothing.

        Checked, in order: the integrity digest; every entry present; the model's keys, shapes
        and dtypes; the optimizer's class, groups and buffer shapes; the noise source's kind and
        state; the sampler's kind, dataset size, rate (or batch size, or steps per epoch) and
        state; the JL directions' state; torch's RNG state; the ledger: well formed, of this
        dataset size, sampler kind and steps per epoch, and ending at the sampler's lot count.

        Returns:
            The saved ledger, rebuilt.

        Raises:
            StateError: naming the first entry that does not fit.
        """
        verify(state)
        jl = isinstance(self.engine, JLEngine)
        require(state, ("model", "optimizer", "sampler", "ledger", "torch_rng"), "checkpoint")
        if jl != ("directions" in state):
            raise StateError(
                "The checkpoint is of a run "
                + ("without" if jl else "with")
                + " JL directions; this trainer's engine is "
                + ("" if jl else "not ")
                + "the JL engine."
            )
        try:
            check_model_state(self.model, state["model"])
            self.optimizer.check_state_dict(state["optimizer"])
            self.sampler.check_state_dict(state["sampler"])
            if isinstance(self.engine, JLEngine):
                self.engine.directions.check_state_dict(state["directions"])
            check_generator_state(state["torch_rng"], "torch_rng")
            return check_ledger(state["ledger"], self.ledger, state["sampler"]["lots_drawn"])
        except (RuntimeError, TypeError, ValueError, AttributeError, KeyError) as error:
            if isinstance(error, DPCoreError):
                raise
            raise StateError(f"Checkpoint does not fit this trainer: {error!r}") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (of a trainer built with the same arguments).

        Everything is checked first (:meth:`check_state_dict`); only then are the model,
        optimizer, noise, sampler, JL directions, RNG and ledger assigned. On error nothing has
        changed: the trainer goes on as if the load had not been tried.

        Raises:
            StateError: see :meth:`check_state_dict`.
        """
        ledger = self.check_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        if isinstance(self.engine, JLEngine):
            self.engine.directions.load_state_dict(state["directions"])
        torch.set_rng_state(state["torch_rng"])
        self.ledger = ledger

    def save_checkpoint(self, path: str | Path) -> None:
        """Save the sealed state (:meth:`state_dict`) with ``torch.save``, atomically.

        A reader, or a process killed mid-save, sees the previous checkpoint or this one
        (:mod:`dpcore.atomic`). The state is hashed and saved at once, without a copy.
        """
        state = seal(self._state())
        with atomic_path(path) as temporary:
            torch.save(state, temporary)

    def load_checkpoint(self, path: str | Path) -> None:
        """Resume from a file written by :meth:`save_checkpoint`, on any device.

        Tensors are read onto the CPU first (a checkpoint written on a GPU resumes on a machine
        without one); the model and optimizer copy them to their own devices. A file that is not
        such a checkpoint (truncated, another format, other keys or shapes, a failed integrity
        check, another run's sampler or ledger) raises :class:`~dpcore.errors.StateError`
        before anything changes (:meth:`load_state_dict`); a missing one ``FileNotFoundError``.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"No checkpoint at {path}.")
        try:
            state = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as error:  # torch raises EOFError, RuntimeError, UnpicklingError, ...
            raise StateError(f"{path} is not a readable checkpoint ({error}).") from None
        if not isinstance(state, dict):
            raise StateError(f"{path} holds {type(state).__name__}, not a trainer checkpoint.")
        self.load_state_dict(state)
