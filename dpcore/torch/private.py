"""Keep your own training loop: ``make_private`` turns a model, an optimizer and a loader of
Poisson lots into a DP-SGD / DP-Adam step that your loop calls once per micro-batch.

::

    model, optimizer, loader = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), LotLoader(dataset, sampler=...,
        max_physical_batch_size=256), loss_fn=nn.CrossEntropyLoss(reduction="none"),
        max_grad_norm=1.0, target_epsilon=3.0, target_delta=1e-5, epochs=10)
    for epoch in range(10):
        for micro in loader:
            result = optimizer.step(micro)   # None until the lot's last micro-batch
            if result is not None: ...       # one noisy step taken: log, schedule, evaluate

:meth:`PrivateOptimizer.step` clips the micro-batch's per-example gradients with the engine (its
losses must be per example: the engine computes them itself, which is what makes exact clipping
at the cost of one backward possible), adds them to the lot's clipped sum, and after the lot's last
micro-batch adds the Gaussian noise once, steps the wrapped optimizer and records one event in the
ledger (an empty lot too). The JL engine draws its directions once per lot.

The optimizer knows which lots it has stepped: it takes only micro-batches of the loader given to
``make_private`` (whose sampler and sampling probability must stay as they were), lot after lot
from the loader's position then (or a loaded checkpoint's), each lot's micro-batches in order, each
once; an empty lot must be stepped too. When a lot's first micro-batch comes again (the loader
redraws a lot whose loading failed, :class:`~dpcore.torch.loaders.LotLoadError`), its partial sum
is discarded and the lot starts again: nothing of it was released. Every check runs before
anything changes, and before the noisy step the optimizer's trainable parameters must still be
exactly those the engine clips, and the ledger must accept the step.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dpcore.calibration import DEFAULT_ACCOUNTANT, calibrate_noise
from dpcore.errors import DPCoreError, InvalidParameterError, StateError
from dpcore.torch.arguments import check_entry_arguments, derived_seed
from dpcore.torch.batches import batch_size
from dpcore.torch.budget import BUDGET_POLICIES, PrivacyBudget
from dpcore.torch.checkpoint import check_ledger, require, seal, snapshot, verify
from dpcore.torch.engines import make_engine
from dpcore.torch.errors import LoopUsageError
from dpcore.torch.ledger import PrivacyLedger, training_statement, write_statement
from dpcore.torch.loaders import LotLoader, MicroBatch, Split, SplitByKey, split_pair
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise
from dpcore.torch.optimizers import DPOptimizer
from dpcore.torch.per_example.base import LossFunction, NonFinitePolicy
from dpcore.torch.per_example.jl import JLEngine
from dpcore.torch.per_example.virtual import LotSum
from dpcore.torch.training import StepResult, accuracy, logits
from dpcore.validation import check_count, check_delta, check_positive

__all__ = ["PrivateOptimizer", "make_private"]


class PrivateOptimizer(torch.optim.Optimizer):
    """A torch optimizer made differentially private, stepped once per logical lot.

    Built by :func:`make_private`; :meth:`step` takes the loader's :class:`MicroBatch` objects.
    It is a ``torch.optim.Optimizer`` whose ``param_groups``, ``state`` and ``defaults`` are the
    wrapped optimizer's own (read and written through), so torch's learning-rate schedulers and
    other code written for an optimizer work with it: ``StepLR(optimizer, ...)``, then
    ``scheduler.step()`` after a step that returned a result (one per lot, as in plain torch
    one per batch). Two things differ from a plain optimizer: :meth:`step` takes a micro-batch
    (not a closure), and :meth:`state_dict` is the checkpoint of the whole private state.
    """

    #: Marks an optimizer that is already private (``make_private`` refuses to wrap it again).
    is_private = True

    def __init__(
        self,
        dp: DPOptimizer,
        *,
        loader: LotLoader,
        loss_fn: LossFunction,
        split: Split,
        jl_dimension: int | None,
        budget: PrivacyBudget | None = None,
    ) -> None:
        # torch.optim.Optimizer.__init__ would build new parameter groups; only its hook tables
        # are set up here (the groups, state and defaults are the wrapped optimizer's).
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self.dp = dp
        self.engine = dp.engine
        self.loader = loader
        self.loss_fn = loss_fn
        self.split = split
        self.jl_dimension = jl_dimension
        #: The planned (epsilon, delta) checked before every lot (``None``: no plan).
        self.budget = budget
        sampler = loader.sampler
        # What the micro-batches must keep coming from (see _check_source).
        self._token = loader.token
        self._sampler = sampler
        self._sampling_probability = sampler.sampling_probability
        self._dataset_size = sampler.dataset_size
        self.ledger = PrivacyLedger(
            dataset_size=sampler.dataset_size,
            sampler=sampler.kind,
            first_lot=loader.lots_consumed,  # the next lot stepped is the ledger's next_lot
        )
        self._sum: LotSum | None = None
        self._correct = 0.0  # correct predictions in the lot so far (NaN when not measurable)
        self._lot: int | None = None
        self._index = 0  # the next micro-batch expected in the lot in progress
        self._lot_ledger: PrivacyLedger | None = None  # the ledger the lot in progress is for
        self._lot_scope: contextlib.ExitStack | None = None
        self._directions: dict[str, Any] | None = None  # JL directions' state at the lot's start

    @property
    def noise_multiplier(self) -> float:
        return self.dp.noise_multiplier

    def __getstate__(self) -> dict[str, Any]:
        """All attributes (torch's Optimizer would keep only its groups, state and defaults)."""
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def max_grad_norm(self) -> float:
        """The clipping norm C (Opacus' ``optimizer.max_grad_norm``)."""
        return self.engine.max_grad_norm

    @property
    def expected_batch_size(self) -> float:
        """q N, the divisor of the noisy sum (Opacus' ``optimizer.expected_batch_size``)."""
        return self.dp.expected_batch_size

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped torch optimizer (its ``param_groups`` are yours to schedule)."""
        return self.dp.optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (a scheduler's ``lr`` changes reach it)."""
        return self.dp.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.dp.optimizer.param_groups = groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state (momentum buffers, Adam moments)."""
        return self.dp.optimizer.state

    @state.setter
    def state(self, state: Any) -> None:
        self.dp.optimizer.state = state

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's defaults (``lr``, ``momentum`` or ``betas``, ...)."""
        return self.dp.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self.dp.optimizer.defaults = defaults

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the wrapped optimizer's gradients (``step`` sets them; nothing accumulates).

        ``set_to_none`` is accepted for torch's signature; the gradients are always set to None.
        """
        del set_to_none
        self.dp.zero_grad()

    def step(self, micro: MicroBatch | None = None) -> StepResult | None:  # type: ignore[override]
        """Clip ``micro``'s examples into its lot's sum; at the lot's end, noise and step.

        Lots must come one after the other from the loader's position when ``make_private`` was
        called (or a loaded checkpoint's), each lot's micro-batches in order (``micro.index``
        0, 1, ...), each once; an empty lot (``micro.data is None``) too. A lot's first
        micro-batch arriving again restarts that lot (its partial sum is discarded: nothing of
        it was released), which is how a lot redrawn after a
        :class:`~dpcore.torch.loaders.LotLoadError` is counted once.

        Returns:
            ``None`` for a micro-batch that does not end its lot, else the step's
            :class:`~dpcore.torch.training.StepResult` (lot size, mean loss, accuracy).

        Raises:
            InvalidParameterError: before anything changes, when ``micro`` is not a
                :class:`MicroBatch` of this loader, the loader's sampler or sampling probability
                changed, a lot or micro-batch comes again, out of order or after a skipped lot,
                the optimizer's trainable parameters are no longer the engine's, or the ledger
                would refuse the step (e.g. ``noise_multiplier`` no longer > 0).
            BudgetExceededError: at a lot's first micro-batch, when the run was planned with
                ``target_epsilon`` and ``budget="stop"`` and this lot would exceed the plan
                (with ``budget="warn"``, a :class:`~dpcore.torch.budget.BudgetExceededWarning`).
        """
        if micro is None:
            raise LoopUsageError(
                "micro",
                "given: optimizer.step(micro) for each micro-batch of the loader (no "
                "loss.backward() before it: the optimizer computes the per-example gradients)",
                None,
            )
        self._check_source(micro)
        restart = self._check_order(micro)
        self._check_step(micro)
        if restart and self.budget is not None:  # before the lot: warn, or stop unchanged
            self.budget.check(
                self.ledger,
                sampling_probability=self._sampling_probability,
                noise_multiplier=self.dp.noise_multiplier,
                jl_dimension=self.jl_dimension,
            )
        inputs: Any = None
        targets: Any = None
        if micro.size:
            inputs, targets = self.split(micro.data)
            if batch_size(inputs) != micro.size:
                raise InvalidParameterError(
                    "split", f"to return inputs of {micro.size} examples", batch_size(inputs)
                )
        if restart:
            self._begin_lot(micro)
        part = self.engine.clipped_sum(inputs, targets, self.loss_fn) if micro.size else None
        if micro.last:  # again right before the noisy step: the loss function and hooks ran
            self._check_step(micro)
        assert self._sum is not None
        if part is not None:
            self._sum.add(part)
            outputs = logits(part.outputs)
            if outputs is not None and isinstance(targets, torch.Tensor):
                self._correct += accuracy(outputs, targets) * micro.size
            else:
                self._correct = math.nan
        self._index += 1
        if not micro.last:
            return None
        clipped = self._sum.result()
        correct = self._correct / micro.lot_size if micro.lot_size else math.nan
        self._end_lot()
        self.dp.step(clipped)
        self.ledger.record(
            sampling_probability=self._sampling_probability,
            noise_multiplier=self.dp.noise_multiplier,
            jl_dimension=self.jl_dimension,
            lot=micro.lot,
        )
        loss = float(clipped.losses.mean()) if clipped.losses.numel() else math.nan
        return StepResult(self.ledger.steps, micro.lot_size, loss, correct)

    def _check_source(self, micro: MicroBatch) -> None:
        """``micro`` comes from the loader given to make_private, whose sampling is unchanged."""
        if not isinstance(micro, MicroBatch):
            raise InvalidParameterError(
                "micro", "a MicroBatch yielded by the LotLoader given to make_private", micro
            )
        if micro.source is not self._token:
            raise InvalidParameterError(
                "micro",
                "a micro-batch of the LotLoader given to make_private (the optimizer records "
                "that loader's sampling probability; make another loader private on its own)",
                f"a micro-batch of lot {micro.lot} from "
                + ("no LotLoader" if micro.source is None else "another LotLoader"),
            )
        sampler = self.loader.sampler
        if sampler is not self._sampler or self.loader.batch_sampler.sampler is not sampler:
            raise InvalidParameterError(
                "loader.sampler",
                "to stay the sampler the loader had when it was made private",
                f"another sampler ({type(sampler).__name__})",
            )
        if (
            sampler.sampling_probability != self._sampling_probability
            or sampler.dataset_size != self._dataset_size
        ):
            raise InvalidParameterError(
                "loader.sampler.sampling_probability",
                f"to stay {self._sampling_probability!r} over {self._dataset_size} records, "
                "as when the loader was made private (the noise is divided by q N and the "
                "ledger records q)",
                f"{sampler.sampling_probability!r} over {sampler.dataset_size} records",
            )

    def _check_order(self, micro: MicroBatch) -> bool:
        """Whether ``micro`` starts (or restarts) the next lot; raises if it is out of order."""
        expected = self.ledger.next_lot
        in_lot = self._lot is not None and self._lot_ledger is self.ledger
        if micro.lot == expected and micro.index == 0:
            return True  # the next lot's start, or its retry (nothing of it was released)
        if in_lot and micro.lot == self._lot and micro.index == self._index:
            return False
        got = f"micro-batch {micro.index} of lot {micro.lot}"
        if micro.lot < expected:
            raise InvalidParameterError(
                "micro",
                f"a micro-batch of lot {expected} (lot {micro.lot} was already stepped and "
                "recorded: each lot is stepped once, in order)",
                got,
            )
        if micro.lot > expected and not in_lot:
            skipped = (
                f"lot {expected}"
                if micro.lot == expected + 1
                else f"lots {expected}..{micro.lot - 1}"
            )
            raise InvalidParameterError(
                "micro",
                f"micro-batch 0 of lot {expected}: {skipped} never reached step(). Every lot "
                "the loader yields must be stepped, an empty one (micro.data is None, size 0) "
                "too: its noise is added and the step counted, as the accounting assumes. "
                "Step every micro-batch (do not 'continue' past empty ones); to go on, load a "
                "state saved before the skipped lot",
                got,
            )
        wanted = f"micro-batch {self._index if in_lot else 0} of lot {expected}"
        raise InvalidParameterError(
            "micro",
            f"{wanted} next (a lot's micro-batches are stepped in order, each once; its "
            "micro-batch 0 again restarts it)",
            got,
        )

    def _check_step(self, micro: MicroBatch) -> None:
        """The parameters are the engine's and the ledger accepts the step (else it cannot run)."""
        self.dp.check_parameters()
        self.ledger.check(
            sampling_probability=self._sampling_probability,
            noise_multiplier=self.dp.noise_multiplier,
            jl_dimension=self.jl_dimension,
            lot=micro.lot,
        )

    def _begin_lot(self, micro: MicroBatch) -> None:
        """Start ``micro``'s lot afresh (a retried lot draws the same JL directions again)."""
        retry = self._lot == micro.lot and self._lot_ledger is self.ledger
        self._end_lot()
        if isinstance(self.engine, JLEngine):
            if retry and self._directions is not None:
                self.engine.directions.load_state_dict(copy.deepcopy(self._directions))
            else:
                self._directions = copy.deepcopy(self.engine.directions.state_dict())
        self._lot, self._index, self._lot_ledger = micro.lot, 0, self.ledger
        self._sum = LotSum(self.engine.parameters, keep_outputs=False, size=micro.lot_size)
        self._correct = 0.0
        self._lot_scope = contextlib.ExitStack()
        self._lot_scope.enter_context(self.engine.one_lot())

    def _end_lot(self) -> None:
        """Forget the lot in progress (its sum is used or discarded)."""
        self._sum, self._correct = None, 0.0
        self._lot, self._index, self._lot_ledger = None, 0, None
        if self._lot_scope is not None:
            self._lot_scope.close()
            self._lot_scope = None

    def epsilon(self, *, delta: float, accountant: str = DEFAULT_ACCOUNTANT) -> float:
        """Epsilon spent so far, from the named accountant (default: PLD's certified bound)."""
        return self.ledger.epsilon(delta=delta, accountant=accountant)

    def privacy_statement(
        self, *, delta: float, accountants: tuple[str, ...] = ("rdp", "pld"), **extra: Any
    ) -> dict[str, Any]:
        """The ledger's statement with the engine, clipping norm, noise and lot sizes."""
        return training_statement(
            self.ledger,
            delta,
            accountants,
            self.dp,
            self.loader.sampler,
            self.jl_dimension,
            max_physical_batch_size=self.loader.max_physical_batch_size,
            **extra,
        )

    def save_statement(self, path: str | Path, *, delta: float, **extra: Any) -> dict[str, Any]:
        """Write :meth:`privacy_statement` as JSON to ``path``; returns it."""
        return write_statement(path, self.privacy_statement(delta=delta, **extra))

    def _check_between_lots(self, action: str) -> None:
        if self._lot is not None:
            raise StateError(
                f"Lot {self._lot} is half processed; {action} after a step (when step() returns "
                "a result), not between micro-batches."
            )

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, noise, JL directions, loader (lots consumed) and ledger, between lots.

        A snapshot (tensors copied), sealed with an integrity digest: the sha256 of every entry,
        tensors by dtype, shape and bytes (:mod:`dpcore.torch.checkpoint`; the model's state is
        the user's to save). It detects corruption and accidental edits, not a deliberate
        forger, who can recompute it.

        Raises:
            StateError: in the middle of a lot (its clipped sum is not part of any state).
        """
        self._check_between_lots("save")
        state = {
            "optimizer": self.dp.state_dict(),
            "loader": self.loader.state_dict(),
            "ledger": self.ledger.state_dict(),
        }
        if isinstance(self.engine, JLEngine):
            state["directions"] = self.engine.directions.state_dict()
        return seal(snapshot(state))

    def check_state_dict(self, state: Any) -> PrivacyLedger:
        """Refuse a state that does not belong to this optimizer and loader; changes nothing.

        Checked: the integrity digest; every entry present; the optimizer's class, groups and
        buffer shapes; the noise source's kind and state; the loader's sampler kind, dataset
        size, rate and state; the JL directions' state; the ledger: well formed, of this
        dataset size and sampler kind, and ending at the loader's lot count.

        Returns:
            The saved ledger, rebuilt.

        Raises:
            StateError: naming the first entry that does not fit.
        """
        verify(state, "optimizer checkpoint")
        jl = isinstance(self.engine, JLEngine)
        require(state, ("optimizer", "loader", "ledger"), "optimizer checkpoint")
        if jl != ("directions" in state):
            raise StateError(
                "The checkpoint is of a run "
                + ("without" if jl else "with")
                + " JL directions; this optimizer's engine is "
                + ("" if jl else "not ")
                + "the JL engine."
            )
        try:
            self.dp.check_state_dict(state["optimizer"])
            self.loader.check_state_dict(state["loader"])
            if isinstance(self.engine, JLEngine):
                self.engine.directions.check_state_dict(state["directions"])
            return check_ledger(state["ledger"], self.ledger, state["loader"]["lots_drawn"])
        except (RuntimeError, TypeError, ValueError, AttributeError, KeyError) as error:
            if isinstance(error, DPCoreError):
                raise
            raise StateError(f"Checkpoint does not fit this optimizer: {error!r}") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (the model's own state is saved by the user).

        Everything is checked first (:meth:`check_state_dict`); only then are the optimizer,
        noise, loader, JL directions and ledger assigned. On error nothing has changed.

        Raises:
            StateError: see :meth:`check_state_dict`; also in the middle of a lot.
        """
        self._check_between_lots("load")
        ledger = self.check_state_dict(state)
        self.dp.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["loader"])
        if isinstance(self.engine, JLEngine):
            self.engine.directions.load_state_dict(state["directions"])
        self.ledger = ledger


def _trial_examples(loader: LotLoader, split: Split) -> tuple[Any, Any]:
    """The first few records of the dataset, collated and split, to prepare the engine on."""
    count = min(len(loader.dataset), 16)
    collate = loader.loader.collate_fn
    return split(collate([loader.dataset[i] for i in range(count)]))


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: LotLoader,
    *,
    loss_fn: LossFunction,
    max_grad_norm: float,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    target_delta: float | None = None,
    epochs: int | None = None,
    engine: str = "auto",
    jl_dimension: int | None = None,
    split: Split = split_pair,
    target_key: str | None = None,
    noise: NoiseSource | None = None,
    seed: int | None = None,
    nonfinite: NonFinitePolicy = "raise",
    budget: str = "warn",
) -> tuple[nn.Module, PrivateOptimizer, LotLoader]:
    """DP-SGD / DP-Adam in your own loop (the optimizer's update rule is kept).

    Args:
        model: the model (its examples must be independent).
        optimizer: a torch optimizer over exactly the model's trainable parameters.
        loader: a :class:`~dpcore.torch.loaders.LotLoader` (Poisson lots, micro-batched).
        loss_fn: per-example losses, ``loss_fn(outputs, targets)`` of shape ``(batch,)``.
        max_grad_norm: the clipping norm C > 0.
        noise_multiplier: sigma > 0; or give ``target_epsilon`` instead.
        target_epsilon: calibrate sigma for this epsilon at ``target_delta`` after ``epochs``
            epochs (``len(loader)`` lots each), with the certified PLD accountant: the smallest
            sigma (to 1 %) whose certified upper bound meets the target, never above it.
        target_delta: delta for ``target_epsilon``.
        epochs: planned epochs, for ``target_epsilon``.
        engine: ``"auto"``, ``"fast"``, ``"vmap"``, ``"loop"`` or ``"jl"`` (with ``jl_dimension``).
        jl_dimension: r for the JL engine.
        split: ``split(data) -> (inputs, targets)`` of a collated micro-batch (default: the
            batch is an ``(inputs, targets)`` pair, or a dict whose ``"labels"`` are the
            targets and whose other entries, attention masks included, are the inputs:
            ``model(**inputs)``); inputs may be tensors, tuples or dicts. Move the tensors to
            the model's device here if needed.
        target_key: for dict batches, the targets' key instead of ``"labels"`` (with the
            default ``split``).
        noise: the noise source (default: seeded from ``seed``).
        seed: seeds the noise and JL directions when their sources are not given.
        nonfinite: ``"raise"`` or ``"zero"`` for NaN/inf per-example gradients.
        budget: with ``target_epsilon``, what happens before a lot that would take the ledger
            past the plan (resumed runs included): ``"warn"`` (a
            :class:`~dpcore.torch.budget.BudgetExceededWarning`, once) or ``"stop"`` (a
            :class:`~dpcore.torch.budget.BudgetExceededError`, nothing changed).

    Returns:
        ``(model, private_optimizer, loader)``: the same model and loader, and the
        :class:`PrivateOptimizer` to call once per micro-batch.

    Raises:
        InvalidParameterError: a plain ``DataLoader`` (its own ``batch_size``/``shuffle`` choose
            the examples, which the Poisson analysis does not cover), both or neither of
            ``noise_multiplier`` and ``target_epsilon``, a target without ``target_delta`` or
            ``epochs``, a target for the JL engine; before anything is built, a ``model`` that
            is not a Module, an ``optimizer`` that is not a torch optimizer, a ``loss_fn`` or
            ``split`` that is not callable, a ``seed`` outside [0, 2**63), a ``noise`` that is
            not a NoiseSource.
        IncompatibleModelError: the model fails the engine's trial lots.
    """
    if target_key is not None:
        if split is not split_pair:
            raise InvalidParameterError(
                "target_key", "given only with the default split (split decides alone)", target_key
            )
        split = SplitByKey(target_key)
    check_entry_arguments(
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        split=split,
        seed=seed,
        noise=noise,
        engine=engine,
        jl_dimension=jl_dimension,
    )
    if not isinstance(loader, LotLoader):
        raise InvalidParameterError(
            "loader",
            "a dpcore.torch.loaders.LotLoader: a DataLoader with its own batch_size/shuffle "
            "draws fixed-size shuffled batches, not the Poisson lots the accounting assumes; "
            "build LotLoader(your_loader.dataset, sampler=PoissonSampler(N, "
            "sampling_probability=q), max_physical_batch_size=B, collate_fn=..., num_workers=...)",
            type(loader).__name__,
        )
    check_positive("max_grad_norm", max_grad_norm)
    if budget not in BUDGET_POLICIES:
        raise InvalidParameterError("budget", f"in {BUDGET_POLICIES}", budget)
    plan: PrivacyBudget | None = None
    if (noise_multiplier is None) == (target_epsilon is None):
        raise InvalidParameterError(
            "noise_multiplier", "given exactly when target_epsilon is not", noise_multiplier
        )
    if target_epsilon is not None:
        if engine == "jl":
            raise InvalidParameterError(
                "target_epsilon",
                "not given with engine='jl' (JL steps need the jl accountant: pass "
                "noise_multiplier and read epsilon from the ledger)",
                target_epsilon,
            )
        if target_delta is None or epochs is None:
            raise InvalidParameterError(
                "target_delta" if target_delta is None else "epochs",
                "given with target_epsilon",
                None,
            )
        steps = check_count("epochs", epochs, minimum=1) * len(loader)
        noise_multiplier = calibrate_noise(
            target_epsilon=check_positive("target_epsilon", target_epsilon),
            target_delta=check_delta("target_delta", target_delta),
            sampling_probability=loader.sampler.sampling_probability,
            steps=steps,
            accountant=DEFAULT_ACCOUNTANT,
        )
        plan = PrivacyBudget(epsilon=target_epsilon, delta=target_delta, policy=budget)
    assert noise_multiplier is not None
    directions = None if seed is None else SeededGaussianNoise(derived_seed(seed))
    clipping = make_engine(
        model,
        engine=engine,
        max_grad_norm=max_grad_norm,
        jl_dimension=jl_dimension,
        directions=directions,
        nonfinite=nonfinite,
    )
    clipping.prepare(*_trial_examples(loader, split), loss_fn)
    dp = DPOptimizer(
        optimizer,
        engine=clipping,
        noise_multiplier=noise_multiplier,
        expected_batch_size=loader.sampler.expected_lot_size,
        noise=noise if noise is not None else SeededGaussianNoise(seed),
    )
    private = PrivateOptimizer(
        dp, loader=loader, loss_fn=loss_fn, split=split, jl_dimension=jl_dimension, budget=plan
    )
    return model, private, loader
