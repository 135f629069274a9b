"""The interface of per-example clipping engines and the clipping arithmetic they share.

An engine turns a lot into ``sum_i c_i g_i``, where ``g_i`` is example i's gradient and
``c_i = min(1, C / ||g_i||)`` (Abadi et al. 2016, Alg. 1, "clip gradient"), so that every
clipped contribution has norm at most C. Engines differ only in how they obtain ``||g_i||``
and the weighted sum; the DP optimizer adds the noise.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import nn

from dpcore.errors import InvalidParameterError
from dpcore.torch.batches import Batch, batch_size, take
from dpcore.torch.compat import check_independent_examples
from dpcore.torch.errors import IncompatibleModelError, NonFiniteGradientError
from dpcore.torch.per_example.trial import (
    LossFunction,
    buffers_kept,
    check_examples_independent,
    check_examples_independent_in_training,
    finite_examples,
    full_precision,
    per_example_losses,
    trial_lot,
    trial_sizes,
)
from dpcore.validation import check_positive

__all__ = [
    "ClippedBatch",
    "LossFunction",
    "NonFinitePolicy",
    "PerExampleEngine",
    "clip_factors",
    "per_example_losses",
]


NonFinitePolicy = Literal["raise", "zero"]


@dataclasses.dataclass(frozen=True)
class ClippedBatch:
    """What an engine returns for one lot.

    Attributes:
        summed: ``sum_i c_i g_i``, one tensor per trainable parameter, in the engine's order.
        norms: ``(batch,)`` per-example gradient norms used for clipping (exact, or estimated
            by the JL engine); NaN/inf rows are kept here so callers can see them.
        clip_factors: ``(batch,)`` the ``c_i`` applied (0 for dropped non-finite examples).
        losses: ``(batch,)`` per-example losses, detached.
        outputs: the model outputs (any structure the model returns), detached (for accuracy),
            or ``None`` for an empty lot.
    """

    summed: list[torch.Tensor]
    norms: torch.Tensor
    clip_factors: torch.Tensor
    losses: torch.Tensor
    outputs: Batch | None


#: An audit hook: ``hook(engine, batch) -> batch`` (see :meth:`PerExampleEngine.add_audit_hook`).
AuditHook = Callable[["PerExampleEngine", ClippedBatch], ClippedBatch]


def clip_factors(
    norms: torch.Tensor, *, max_grad_norm: float, nonfinite: NonFinitePolicy = "raise"
) -> torch.Tensor:
    """``c_i = min(1, C / ||g_i||)``, so ``c_i ||g_i|| <= C`` up to one rounding.

    Args:
        norms: ``(batch,)`` per-example gradient norms.
        max_grad_norm: C > 0.
        nonfinite: ``"raise"`` raises on a NaN/inf norm; ``"zero"`` gives such examples c_i = 0.

    Raises:
        NonFiniteGradientError: a norm is NaN or infinite and ``nonfinite == "raise"``.
    """
    finite = torch.isfinite(norms)
    if nonfinite == "raise" and not bool(finite.all()):
        bad = torch.nonzero(~finite).flatten().tolist()
        raise NonFiniteGradientError(
            f"Per-example gradients of examples {bad[:10]} (positions in the lot) are NaN or "
            "infinite; clipping cannot bound them. Fix the loss, or pass nonfinite='zero' to "
            "drop such examples (privacy-safe)."
        )
    safe = torch.where(finite, norms, torch.zeros_like(norms))
    scale = torch.where(
        safe > max_grad_norm, max_grad_norm / safe.clamp_min(torch.finfo(norms.dtype).tiny), 1.0
    )
    return torch.where(finite, scale, torch.zeros_like(scale))


class PerExampleEngine(abc.ABC):
    """Computes the sum of clipped per-example gradients of a model's trainable parameters.

    Args:
        model: any ``nn.Module`` whose examples are independent (no BatchNorm).
        max_grad_norm: the clipping norm C > 0.
        nonfinite: policy for NaN/inf per-example gradients (see :func:`clip_factors`).

    Raises:
        IncompatibleModelError: the model mixes examples, or has no trainable parameter.
        InvalidParameterError: ``max_grad_norm`` is not a positive finite number.
    """

    name: str = ""

    #: Examples of the first lot used to prepare an engine that was not prepared explicitly.
    TRIAL_POOL = 16

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        nonfinite: NonFinitePolicy = "raise",
    ) -> None:
        check_independent_examples(model)
        self.model = model
        self.max_grad_norm = check_positive("max_grad_norm", max_grad_norm)
        if nonfinite not in ("raise", "zero"):
            raise InvalidParameterError("nonfinite", "in {'raise', 'zero'}", nonfinite)
        self.nonfinite: NonFinitePolicy = nonfinite
        self.named_parameters = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.named_parameters:
            raise IncompatibleModelError("The model has no trainable parameter to clip.")
        self.prepared = False
        #: Audit hooks (:meth:`add_audit_hook`), applied in order to every clipped sum.
        self.audit_hooks: list[AuditHook] = []

    def add_audit_hook(self, hook: AuditHook) -> Callable[[], None]:
        """Install ``hook(engine, batch) -> batch``, applied to every :meth:`clipped_sum` result.

        For auditors only: a hook sees (and may change, e.g. by inserting a gradient canary)
        the clipped sum before the optimizer privatises it, so it can break the privacy that
        the ledger records. dpcore's training code never installs one. Returns a function that
        removes the hook.
        """
        self.audit_hooks.append(hook)
        return lambda: self.audit_hooks.remove(hook)

    def prepare(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Check the model on two trial lots built from these examples, once, before training.

        The trial lots' sizes differ from every dimension of the model's tensors
        (:func:`~dpcore.torch.per_example.trial.trial_sizes`); on each, the examples must not
        interact, in eval mode
        (:func:`~dpcore.torch.per_example.trial.check_examples_independent`) nor in the model's
        own training mode
        (:func:`~dpcore.torch.per_example.trial.check_examples_independent_in_training`), and the
        engine must agree with a one-example-at-a-time autograd loop (engine-specific). An
        engine not prepared explicitly prepares itself on its first non-empty lot. The trial
        runs in full precision even inside ``torch.autocast``, and leaves the model's buffers as
        they were (and the random states, where a trial runs in training mode).

        Args:
            inputs: one or more examples (a few distinct ones are best), batch-first.
            targets: their targets.
            loss_fn: the per-example loss used in training.

        Raises:
            IncompatibleModelError: the model mixes examples, or this engine does not compute
                its per-example gradients exactly (the message names the parameter).
        """
        size = batch_size(inputs)
        if size < 1 or size != batch_size(targets, "targets"):
            raise InvalidParameterError(
                "inputs", "at least one example, with as many targets", size
            )
        # the trials leave the buffers as they were (an eval-mode forward may write one); the
        # random states are forked only where a trial runs in training mode (a global state:
        # forking it here would race with other threads' draws)
        with full_precision(), buffers_kept(self.model):
            finite = finite_examples(self.model, inputs, targets, loss_fn)
            if not finite:
                return  # nothing to try on yet: the next non-empty lot prepares
            index = torch.tensor(finite)
            inputs, targets = take(inputs, index), take(targets, index)
            for size in trial_sizes(self.model, inputs, targets, loss_fn):
                lot, lot_targets = trial_lot(inputs, targets, size)
                check_examples_independent(self.model, lot, lot_targets, loss_fn)
                check_examples_independent_in_training(self.model, lot, lot_targets, loss_fn)
                self._check_trial(lot, lot_targets, loss_fn)
        self.prepared = True

    @contextlib.contextmanager
    def one_lot(self) -> Iterator[None]:
        """While open, every :meth:`clipped_sum` belongs to one logical lot (virtual lots).

        Exact engines need nothing; the JL engine draws its directions once for the lot.
        """
        yield

    def _check_trial(  # noqa: B027
        self, inputs: Batch, targets: Batch, loss_fn: LossFunction
    ) -> None:
        """Engine-specific comparison with the loop on one trial lot (default: none)."""

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The trainable parameters, in the order of :attr:`ClippedBatch.summed`."""
        return [p for _, p in self.named_parameters]

    def clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        """Sum of clipped per-example gradients of ``loss_fn(model(inputs), targets)``.

        ``inputs`` and ``targets`` may be tensors, tuples/lists or dicts of batch-first tensors
        (:mod:`dpcore.torch.batches`). An empty lot returns zero sums without running the model.
        """
        size = batch_size(inputs)
        if batch_size(targets, "targets") != size:
            raise InvalidParameterError(
                "targets", f"to have batch size {size} like inputs", batch_size(targets, "targets")
            )
        if size == 0:
            empty = torch.zeros(0, dtype=self.parameters[0].dtype)
            batch = ClippedBatch(
                summed=[torch.zeros_like(p) for p in self.parameters],
                norms=empty,
                clip_factors=empty,
                losses=empty,
                outputs=None,
            )
        else:
            if not self.prepared:
                pool = slice(0, self.TRIAL_POOL)
                self.prepare(take(inputs, pool), take(targets, pool), loss_fn)
            batch = self._clipped_sum(inputs, targets, loss_fn)
        for hook in self.audit_hooks:
            batch = hook(self, batch)
        return batch

    @abc.abstractmethod
    def _clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        """Engine-specific work on a non-empty lot."""
