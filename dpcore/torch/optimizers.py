"""DP optimizers: clip, sum, add Gaussian noise, divide by the expected lot size, step.

:class:`DPOptimizer` wraps any ``torch.optim.Optimizer`` (Abadi et al. 2016, Alg. 1): given the
clipped sum ``S = sum_i c_i g_i`` of a lot from a per-example engine
(:mod:`dpcore.torch.per_example`), it sets each parameter's gradient to
``(S + N(0, sigma^2 C^2 I)) / (q N)`` and calls the wrapped optimizer. Dividing by the
*expected* lot size q N, not the realised one, keeps the lot size private. DP-SGD wraps SGD,
DP-Adam wraps Adam (the update is post-processing of the noisy gradient); the -JL variants
differ only in their engine (:class:`~dpcore.torch.per_example.jl.JLEngine`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.checkpoint import check_optimizer_state, require
from dpcore.torch.noise import NoiseSource, SeededGaussianNoise, checked_standard_normal
from dpcore.torch.per_example.base import ClippedBatch, PerExampleEngine
from dpcore.validation import check_positive

#: The noise standard deviation must be this far below the largest value of the parameters'
#: dtype (3.4e38 for float32): a sum of a lot's clipped gradients and a few standard deviations
#: of noise then stays finite.
_NOISE_HEADROOM = 1e6

__all__ = ["DPOptimizer"]


class DPOptimizer:
    """A torch optimizer stepped with noisy clipped gradients.

    Args:
        optimizer: a torch optimizer over exactly the engine's trainable parameters.
        engine: the per-example clipping engine (it holds the clipping norm C).
        noise_multiplier: sigma > 0; the noise standard deviation is sigma C.
        expected_batch_size: q N > 0, the divisor of the noisy sum.
        noise: the noise source (default: a seeded generator drawn from the OS).

    Raises:
        InvalidParameterError: on sigma <= 0, q N <= 0, or an optimizer whose parameters are not
            exactly the model's trainable parameters.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        engine: PerExampleEngine,
        noise_multiplier: float,
        expected_batch_size: float,
        noise: NoiseSource | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidParameterError("optimizer", "to be a torch.optim.Optimizer", optimizer)
        if not isinstance(engine, PerExampleEngine):
            raise InvalidParameterError("engine", "to be a PerExampleEngine", engine)
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.expected_batch_size = check_positive("expected_batch_size", expected_batch_size)
        # Frozen parameters (e.g. DPLSTM's fixed identity) may sit in the optimizer: they never
        # receive a gradient, so only the trainable ones must match the engine's.
        held = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        trainable = engine.parameters
        if {id(p) for p in held} != {id(p) for p in trainable} or len(held) != len(trainable):
            raise InvalidParameterError(
                "optimizer",
                f"to hold exactly the model's {len(trainable)} trainable parameters "
                "(those the engine clips)",
                f"an optimizer over {len(held)} other or extra parameters",
            )
        self.optimizer = optimizer
        self.engine = engine
        self.noise: NoiseSource = noise if noise is not None else SeededGaussianNoise()
        ranges = [torch.finfo(p.dtype).max for p in trainable if p.is_floating_point()]
        limit = min(ranges, default=math.inf) / _NOISE_HEADROOM
        rates = [float(group["lr"]) for group in optimizer.param_groups if "lr" in group]
        step_noise = self.noise_std * max(rates, default=1.0)
        if not self.noise_std <= limit or not step_noise <= limit:
            raise InvalidParameterError(
                "noise_multiplier",
                f"times max_grad_norm (the noise standard deviation), also times the learning "
                f"rate, <= {limit:.3g}, {_NOISE_HEADROOM:g} below the largest value of the "
                "parameters' dtype, so that noisy sums and steps stay finite",
                f"{self.noise_multiplier!r} * {self.engine.max_grad_norm!r} = {self.noise_std!r} "
                f"(times lr: {step_noise!r})",
            )

    def check_parameters(self) -> None:
        """Refuse to step when the optimizer's trainable parameters are not the engine's.

        A parameter added to the wrapped optimizer after construction (``add_param_group``, an
        appended layer, a frozen layer unfrozen and added) would move with whatever gradient it
        holds, unclipped and without noise, while the ledger records a DP step; a parameter of
        the engine frozen since (``requires_grad=False``) cannot be clipped; a parameter outside
        the engine that holds a gradient would move without noise too. Call this before
        anything of a step changes.

        Raises:
            InvalidParameterError: naming the parameters added, frozen or holding a gradient.
        """
        engine = {id(p): name for name, p in self.engine.named_parameters}
        held = [p for group in self.optimizer.param_groups for p in group["params"]]
        trainable = [p for p in held if p.requires_grad]
        if (
            len(trainable) == len(engine)
            and all(id(p) in engine for p in trainable)
            and all(p.requires_grad for _, p in self.engine.named_parameters)
            and all(p.grad is None for p in held if id(p) not in engine)
        ):
            return  # the usual case, without walking the model for names
        names = {id(p): name for name, p in self.engine.model.named_parameters()}

        def name(parameter: torch.Tensor) -> str:
            return names.get(id(parameter), f"a parameter of shape {tuple(parameter.shape)}")

        problems = []
        frozen = [label for label, p in self.engine.named_parameters if not p.requires_grad]
        if frozen:
            problems.append(f"frozen since: {frozen}")
        added = [name(p) for p in trainable if id(p) not in engine]
        if added:
            problems.append(f"added since: {added}")
        carrying = [
            name(p)
            for p in held
            if not p.requires_grad and id(p) not in engine and p.grad is not None
        ]
        if carrying:
            problems.append(f"outside the engine but holding a gradient: {carrying}")
        present = {id(p) for p in held}
        missing = [label for label, p in self.engine.named_parameters if id(p) not in present]
        if missing:
            problems.append(f"removed since: {missing}")
        if not problems:
            problems.append("a parameter appears more than once")
        if problems:
            raise InvalidParameterError(
                "optimizer",
                f"to hold exactly the {len(engine)} trainable parameters the engine clips and "
                "noises, all still requiring grad (parameters added to the optimizer after it "
                "was made private would move without clipping or noise; make it private again "
                "after changing the model or its optimizer)",
                "; ".join(problems),
            )

    @property
    def noise_std(self) -> float:
        """sigma C, the standard deviation of the noise added to the clipped sum."""
        return self.noise_multiplier * self.engine.max_grad_norm

    def privatise(self, clipped: ClippedBatch) -> list[torch.Tensor]:
        """``(S + N(0, sigma^2 C^2 I)) / (q N)`` for each parameter; an empty lot gets noise too."""
        if len(clipped.summed) != len(self.engine.parameters):
            raise InvalidParameterError(
                "clipped", f"to hold {len(self.engine.parameters)} sums", len(clipped.summed)
            )
        noisy = []
        for parameter, summed in zip(self.engine.parameters, clipped.summed, strict=True):
            noise = checked_standard_normal(self.noise, parameter)  # shape, dtype, finite
            # S + sigma C N in one pass, then divided in place (the sum is a new tensor)
            noisy.append(
                torch.add(summed.detach(), noise, alpha=self.noise_std).div_(
                    self.expected_batch_size
                )
            )
        return noisy

    def step(self, clipped: ClippedBatch) -> None:
        """Set every parameter's ``.grad`` to its noisy average and step the wrapped optimizer.

        Raises:
            InvalidParameterError: the optimizer's trainable parameters are no longer exactly
                the engine's (:meth:`check_parameters`), before any noise is drawn.
        """
        self.check_parameters()
        for parameter, gradient in zip(
            self.engine.parameters, self.privatise(clipped), strict=True
        ):
            parameter.grad = gradient
        self.optimizer.step()

    def zero_grad(self) -> None:
        """Clear the wrapped optimizer's gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state (and its class name) and the noise source's state."""
        return {
            "optimizer_class": type(self.optimizer).__qualname__,
            "optimizer": self.optimizer.state_dict(),
            "noise": self.noise.state_dict(),
        }

    def check_state_dict(self, state: Any) -> None:
        """Refuse a state that does not fit this optimizer; changes nothing.

        Raises:
            StateError: not a dict, a missing entry, another optimizer class, a wrapped state of
                other groups or buffer shapes
                (:func:`~dpcore.torch.checkpoint.check_optimizer_state`), or a noise state of
                another source (:meth:`~dpcore.torch.noise.NoiseSource.check_state_dict`).
        """
        if not isinstance(state, dict):
            raise StateError(f"Expected a DP optimizer state (a dict), got {type(state).__name__}.")
        require(state, ("optimizer_class", "optimizer", "noise"), "optimizer state")
        name = type(self.optimizer).__qualname__
        if state["optimizer_class"] != name:
            raise StateError(
                f"The checkpoint's optimizer is a {state['optimizer_class']!r}; "
                f"this one is {name!r}."
            )
        check_optimizer_state(self.optimizer, state["optimizer"])
        self.noise.check_state_dict(state["noise"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; everything is checked first (nothing changes on error).

        Raises:
            StateError: see :meth:`check_state_dict`.
        """
        self.check_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.noise.load_state_dict(state["noise"])
