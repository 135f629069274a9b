"""Per-example gradient norms estimated by Johnson–Lindenstrauss projections (DP-SGD-JL).

Bu, Gopi, Kulkarni, Lee, Shen, Tantipongpipat 2021 (arXiv 2102.03013), Alg. 1: draw r standard
Gaussian directions ``v_1..v_r`` over the parameter space, shared by the lot; one forward-mode
Jacobian-vector product per direction gives ``<g_i, v_j>`` for every example i at once; then

    M_i^2 = (1/r) sum_j <g_i, v_j>^2  ~  ||g_i||^2 chi^2_r / r,

an unbiased estimate of ``||g_i||^2``. Each per-example *loss* is scaled by ``min(1, C / M_i)``
and one ordinary backward gives the weighted sum. Because ``M_i`` can underestimate ``||g_i||``,
a clipped contribution can exceed C: the step is a :class:`~dpcore.events.JLGaussianEvent`,
whose privacy needs the JL accountant (Thm 4.1), not the Gaussian one.

The directions are secret like the noise (an adversary who knows them could pick a gradient
orthogonal to all of them), so they come from a :class:`~dpcore.torch.noise.NoiseSource`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.func import jvp, vmap

from dpcore.torch.batches import Batch, batch_size, call_model, detached, model_arguments
from dpcore.torch.forward_mode import forward_mode_friendly
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise
from dpcore.torch.per_example.base import (
    ClippedBatch,
    LossFunction,
    NonFinitePolicy,
    PerExampleEngine,
    clip_factors,
    per_example_losses,
)
from dpcore.torch.per_example.stateless import functional_call_restoring
from dpcore.torch.per_example.trial import close, eval_mode, loop_gradients, mismatch
from dpcore.validation import check_count

__all__ = ["JLEngine"]


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Torch's CPU generator state and, on CUDA, the device's (dropout draws from the latter)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@contextlib.contextmanager
def _quiet_forward_ad() -> Iterator[None]:
    """PyTorch's first forward-mode call scripts its decompositions with a deprecated API."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")
        yield


class JLEngine(PerExampleEngine):
    """Clipping by JL-estimated per-example norms (Bu et al. 2021, Alg. 1).

    Args:
        model: any differentiable module whose examples are independent.
        max_grad_norm: the clipping norm C > 0.
        jl_dimension: r >= 1, the number of random directions per lot.
        directions: source of the Gaussian directions (default: seeded from the OS).
        nonfinite: ``"raise"`` or ``"zero"`` for NaN/inf estimated norms.
        vmap_directions: evaluate all r jvps in one vectorised pass (faster, r x activation
            memory); models that draw random numbers (dropout) always use one pass per direction.
    """

    name = "jl"

    def __init__(
        self,
        model: nn.Module,
        *,
        max_grad_norm: float,
        jl_dimension: int,
        directions: NoiseSource | None = None,
        nonfinite: NonFinitePolicy = "raise",
        vmap_directions: bool = True,
    ) -> None:
        super().__init__(model, max_grad_norm=max_grad_norm, nonfinite=nonfinite)
        self.jl_dimension = check_count("jl_dimension", jl_dimension, minimum=1)
        self.directions: NoiseSource = (
            directions if directions is not None else SeededGaussianNoise()
        )
        self.vmap_directions = bool(vmap_directions)
        self._in_lot = False
        self._lot_directions: dict[str, torch.Tensor] | None = None

    def _draw_directions(self) -> dict[str, torch.Tensor]:
        r = self.jl_dimension
        return {
            name: self.directions.standard_normal(
                torch.Size((r, *p.shape)), dtype=p.dtype, device=p.device
            )
            for name, p in self.named_parameters
        }

    def projections(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> torch.Tensor:
        """``P`` with ``P[j, i] = <g_i, v_j>`` for freshly drawn directions ``v_j``.

        Torch's random state is restored afterwards, so a following forward pass draws the same
        dropout masks as the projections did.
        """
        tangents = self._lot_directions
        if tangents is None:
            tangents = self._draw_directions()
            if self._in_lot:  # later micro-batches of this lot reuse them
                self._lot_directions = tangents
        return self._project(inputs, targets, loss_fn, tangents)

    @contextlib.contextmanager
    def drawn_lot(self) -> Iterator[None]:
        """Directions drawn now, even if the lot turns out empty, and shared by the lot.

        Data-parallel ranks whose direction sources are seeded alike thus project every step on
        the same directions, whatever their local lots hold (:mod:`dpcore.torch.distributed`).
        """
        with self.one_lot():
            self._lot_directions = self._draw_directions()
            yield

    @contextlib.contextmanager
    def one_lot(self) -> Iterator[None]:
        """Directions drawn once, at the lot's first non-empty micro-batch, shared by the lot."""
        self._in_lot, self._lot_directions = True, None
        try:
            yield
        finally:
            self._in_lot, self._lot_directions = False, None

    def _project(
        self,
        inputs: Batch,
        targets: Batch,
        loss_fn: LossFunction,
        tangents: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """``P[j, i] = <g_i, v_j>`` for the directions ``tangents`` (``(r, *shape)`` each)."""
        trainable = {n: p.detach() for n, p in self.named_parameters}
        frozen = {n: p.detach() for n, p in self.model.named_parameters() if not p.requires_grad}
        buffers = dict(self.model.named_buffers())
        batch = batch_size(inputs)
        args, kwargs = model_arguments(inputs)

        def losses_of(params: dict[str, torch.Tensor]) -> torch.Tensor:
            outputs = functional_call_restoring(self.model, (params, frozen, buffers), args, kwargs)
            return per_example_losses(loss_fn, outputs, targets, batch)

        def one_direction(tangent: dict[str, torch.Tensor]) -> torch.Tensor:
            projection: torch.Tensor = jvp(losses_of, (trainable,), (tangent,))[1]
            return projection

        directions = next(iter(tangents.values())).shape[0]
        device = self.parameters[0].device
        rng = _rng_state(device)
        try:
            with forward_mode_friendly(self.model, device), _quiet_forward_ad():
                if self.vmap_directions:
                    try:
                        batched: torch.Tensor = vmap(one_direction, randomness="error")(tangents)
                        return batched
                    except RuntimeError as error:  # randomness inside: one pass per direction
                        if "randomness" not in str(error):
                            raise
                rows = []
                for j in range(directions):
                    _set_rng_state(rng, device)  # every pass sees the same dropout masks
                    rows.append(one_direction({name: t[j] for name, t in tangents.items()}))
                return torch.stack(rows)
        finally:
            _set_rng_state(rng, device)

    def _check_trial(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> None:
        """Projections onto each parameter, and the weighted backward, equal the loop's.

        The trial's directions come from a fixed generator, not from the secret source.
        """
        generator = torch.Generator().manual_seed(0)
        tangents = {
            name: torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device)
            for name, p in self.named_parameters
        }
        with eval_mode(self.model):
            loop, _ = loop_gradients(self.model, inputs, targets, loss_fn, self.parameters)
            total = float(sum(g.double().square().sum() for row in loop for g in row))
            dtype = self.parameters[0].dtype
            for j, (name, _) in enumerate(self.named_parameters):
                alone = {n: t if n == name else torch.zeros_like(t) for n, t in tangents.items()}
                found = self._project(
                    inputs, targets, loss_fn, {n: t.unsqueeze(0) for n, t in alone.items()}
                )[0]
                expected = torch.stack([(row[j] * tangents[name]).sum() for row in loop])
                scale = total**0.5 * float(tangents[name].norm())
                if not close(found, expected, dtype, scale=scale):
                    raise mismatch(
                        f"On a trial lot of {batch_size(inputs)}, the JL engine's projections of "
                        f"parameter {name!r}'s per-example gradients differ from a "
                        "one-example-at-a-time autograd loop. Use VmapEngine instead.",
                        [name],
                    )
            factors = torch.linspace(
                0.25, 1.0, batch_size(inputs), dtype=dtype, device=self.parameters[0].device
            )
            summed = self._weighted_backward(inputs, targets, loss_fn, factors)[0]
        for j, (name, _) in enumerate(self.named_parameters):
            expected_sum = sum(float(c) * row[j] for c, row in zip(factors, loop, strict=True))
            if not close(summed[j], expected_sum, dtype, scale=total**0.5 * batch_size(inputs)):  # type: ignore[arg-type]
                raise mismatch(
                    f"On a trial lot of {batch_size(inputs)}, the JL engine's weighted backward "
                    f"for parameter {name!r} differs from the loop's sum of weighted per-example "
                    "gradients (examples interact in the gradient). Use VmapEngine instead.",
                    [name],
                )

    def _weighted_backward(
        self,
        inputs: Batch,
        targets: Batch,
        loss_fn: LossFunction,
        factors: torch.Tensor,
    ) -> tuple[list[torch.Tensor], torch.Tensor, Any]:
        """``sum_i c_i g_i`` by one backward of ``sum_i c_i loss_i``; also losses and outputs."""
        outputs = call_model(self.model, inputs)
        losses = per_example_losses(loss_fn, outputs, targets, batch_size(inputs))
        keep = factors > 0
        weighted = torch.where(keep, factors.to(losses.dtype) * losses, torch.zeros_like(losses))
        summed = torch.autograd.grad(weighted.sum(), self.parameters, allow_unused=True)
        sums = [
            torch.zeros_like(p) if s is None else s
            for p, s in zip(self.parameters, summed, strict=True)
        ]
        return sums, losses, outputs

    def _clipped_sum(self, inputs: Batch, targets: Batch, loss_fn: LossFunction) -> ClippedBatch:
        projected = self.projections(inputs, targets, loss_fn)
        norms = projected.square().mean(dim=0).sqrt()
        factors = clip_factors(norms, max_grad_norm=self.max_grad_norm, nonfinite=self.nonfinite)
        sums, losses, outputs = self._weighted_backward(inputs, targets, loss_fn, factors)
        return ClippedBatch(sums, norms.detach(), factors, losses.detach(), detached(outputs))
