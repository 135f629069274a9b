"""Sources of the Gaussian noise added to the clipped sum.

:class:`SeededGaussianNoise` uses a seeded ``torch.Generator``: reproducible, right for research
and tests, but whoever knows the seed can subtract the noise. :class:`SecureGaussianNoise` draws
its uniforms from the operating system's cryptographically secure generator (``os.urandom``)
and refuses a seed. Both turn uniforms into normals in float64 and round to the parameter's dtype;
the floating-point attacks on textbook samplers (Mironov 2012; Jin et al. 2022) concern the
low-order bits of each draw, which this source does not claim to protect.

Why float64 even for float32 parameters: torch's float32 normals are Box–Muller over 24-bit
uniforms, so their radius ``sqrt(-2 ln u)`` never exceeds ``sqrt(48 ln 2) = 5.77`` and takes few
distinct values beyond 5: the noise would be a truncated Gaussian, under which an output near
the truncation point has unbounded privacy loss, with a chance of order ``1e-8`` per coordinate
and step (millions of coordinates, thousands of steps: a delta the accountant does not count).
Float64 draws come from 53-bit uniforms (radius up to 8.57, beyond which the mass is below
``1e-17``). :class:`SeededGaussianNoise` draws them a block at a time into the parameter's dtype,
so a float32 step allocates no float64 tensor of the parameter's size.
"""

from __future__ import annotations

import abc
import math
import os
from typing import Any

import torch

from dpcore.errors import InvalidParameterError, StateError
from dpcore.secure_random import secure_standard_normals
from dpcore.validation import check_seed

__all__ = ["NoiseSource", "SecureGaussianNoise", "SeededGaussianNoise", "checked_standard_normal"]


class NoiseSource(abc.ABC):
    """Draws i.i.d. standard normal tensors."""

    name: str = ""

    @abc.abstractmethod
    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A tensor of i.i.d. N(0, 1) draws."""

    def state_dict(self) -> dict[str, Any]:
        """State to resume the same stream (empty for sources that cannot be resumed)."""
        return {"name": self.name}

    def check_state_dict(self, state: Any) -> None:
        """Refuse a state :meth:`load_state_dict` could not resume; changes nothing.

        Raises:
            StateError: not a dict, or the state of another kind of source (its ``name``).
        """
        if not isinstance(state, dict):
            raise StateError(f"Expected a noise source state (a dict), got {type(state).__name__}.")
        if state.get("name") != self.name:
            raise StateError(
                f"Expected the state of a {self.name!r} noise source, got {state.get('name')!r}."
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (nothing to assign for sources that cannot be resumed).

        Raises:
            StateError: see :meth:`check_state_dict` (nothing changes then).
        """
        self.check_state_dict(state)


class SeededGaussianNoise(NoiseSource):
    """Reproducible normals from a seeded ``torch.Generator`` (CPU), moved to the device.

    Args:
        seed: an integer in [0, 2**63) (torch's generators take a signed 64-bit seed; the
            samplers use the same rule); ``None`` draws one from the OS.
    """

    name = "seeded"

    def __init__(self, seed: int | None = None) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.seed = check_seed("seed", seed)
        self.generator = torch.Generator()
        self.generator.manual_seed(self.seed)

    #: float64 draws per block when the parameter is in a narrower dtype (a multiple of 16,
    #: torch's block of draws: the result equals one float64 draw of the whole tensor, rounded).
    BLOCK = 1 << 16

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Float64 draws (module docstring), rounded to ``dtype`` a block at a time."""
        count = math.prod(shape)
        if dtype == torch.float64 or count < 2 * self.BLOCK:
            draws = torch.randn(shape, generator=self.generator, dtype=torch.float64)
            return draws.to(dtype=dtype, device=device)
        rounded = torch.empty(count, dtype=dtype)
        block = torch.empty(self.BLOCK + 16, dtype=torch.float64)
        start = 0
        while start < count:
            # the last block takes the remainder when it is short (torch draws fewer than 16
            # values another way, so the blocks would no longer equal one whole draw)
            size = count - start if count - start < self.BLOCK + 16 else self.BLOCK
            part = block[:size]
            part.normal_(generator=self.generator)
            rounded[start : start + size].copy_(part)
            start += size
        return rounded.view(shape).to(device=device)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seed": self.seed, "generator": self.generator.get_state()}

    def check_state_dict(self, state: Any) -> None:
        super().check_state_dict(state)
        seed = state.get("seed")
        if type(seed) is not int or seed < 0:
            raise StateError(f"Expected the noise seed to be an integer >= 0, got {seed!r}.")
        if "generator" not in state:
            raise StateError("The noise source state lacks 'generator'.")
        try:
            torch.Generator().set_state(state["generator"])
        except (RuntimeError, TypeError, ValueError) as error:
            raise StateError(f"The noise generator state is malformed: {error}") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state_dict(state)
        self.seed = state["seed"]
        self.generator.set_state(state["generator"])


class SecureGaussianNoise(NoiseSource):
    """Normals from ``os.urandom`` via the Box–Muller transform (Box and Muller 1958).

    Uniforms are 53-bit: ``u = (k + 1) / 2**53`` with k from 8 random bytes, so ``u`` is in
    (0, 1] and ``log u`` is finite. Passing a seed raises: a seeded secure source is a
    contradiction.
    """

    name = "secure"

    def __init__(self, seed: object = None) -> None:
        if seed is not None:
            raise InvalidParameterError(
                "seed", "to be None for the secure noise source (it cannot be seeded)", seed
            )

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        normals = secure_standard_normals(math.prod(shape))
        return torch.from_numpy(normals).reshape(shape).to(dtype=dtype, device=device)


def checked_standard_normal(source: NoiseSource, parameter: torch.Tensor) -> torch.Tensor:
    """``source``'s draws for ``parameter``, refused unless they can be its Gaussian noise.

    A custom :class:`NoiseSource` may return anything; a scalar would broadcast to one draw for
    the whole tensor, another dtype or device would be cast or fail mid-step, and a NaN or
    infinity would make the step's noise meaningless. The draws must therefore be a tensor of
    exactly the parameter's shape, dtype and device, and finite. The built-in sources are
    finite by construction (``torch.randn``; Box--Muller of uniforms in (0, 1]), so only other
    sources' draws are scanned for NaN/inf (which synchronises with the device).

    Raises:
        InvalidParameterError: naming ``noise`` and what the draws were, before the caller
            changes any parameter.
    """
    draws = source.standard_normal(parameter.shape, dtype=parameter.dtype, device=parameter.device)
    name = "noise"
    where = f"{type(source).__name__}.standard_normal"
    if not isinstance(draws, torch.Tensor):
        raise InvalidParameterError(name, f"{where} to return a torch.Tensor", type(draws).__name__)
    expected = (tuple(parameter.shape), parameter.dtype, parameter.device)
    received = (tuple(draws.shape), draws.dtype, draws.device)
    if received != expected:
        raise InvalidParameterError(
            name,
            f"{where} to return the parameter's shape, dtype and device {expected}",
            received,
        )
    if type(source) not in _FINITE_SOURCES and not bool(torch.isfinite(draws).all()):
        raise InvalidParameterError(
            name, f"{where} to return finite draws", "a tensor with NaN or infinite entries"
        )
    return draws


#: Sources whose draws are finite by construction (not scanned by checked_standard_normal).
_FINITE_SOURCES: tuple[type[NoiseSource], ...] = (SeededGaussianNoise, SecureGaussianNoise)
