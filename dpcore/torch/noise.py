"""Sources of the Gaussian noise added to the clipped sum.

:class:`SeededGaussianNoise` draws from numpy's seeded PCG64 generator: reproducible, right for
research and tests, but whoever knows the seed can subtract the noise. :class:`SecureGaussianNoise`
draws its uniforms from the operating system's cryptographically secure generator
(``os.urandom``) and refuses a seed. Both draw normals in float64 and round them to the
parameter's dtype; the floating-point attacks on textbook samplers (Mironov 2012; Jin et al. 2022)
concern the low-order bits of each draw, which these sources do not claim to protect.

**Truncation.** A sampler whose draws never exceed ``T`` in absolute value adds a truncated
Gaussian: an output near the truncation point has unbounded privacy loss, with a chance of about
the Gaussian mass beyond ``T`` per coordinate and step (millions of coordinates, thousands of
steps: a delta the accountant does not count). That mass must therefore be negligible:

- torch's float32 normals are Box–Muller over 24-bit uniforms: the radius ``sqrt(-2 ln u)``
  never exceeds ``sqrt(48 ln 2) = 5.77``, beyond which the mass is ``7.9e-9``. Not used here.
- torch's float64 normals are Box–Muller over 53-bit uniforms: radius at most
  ``sqrt(106 ln 2) = 8.57``, mass beyond ``1.0e-17``. The ``"torch-box-muller"`` stream of
  :class:`SeededGaussianNoise`, kept to resume checkpoints written before the ziggurat.
- numpy's float64 ``standard_normal`` (the default ``"pcg64-ziggurat"`` stream) is the ziggurat
  of Marsaglia and Tsang (2000, "The Ziggurat Method for Generating Random Variables", J. Stat.
  Softw. 5(8)) as numpy implements it (``random_standard_normal`` in
  ``numpy/random/src/distributions/distributions.c``): 256 layers, 52-bit magnitudes, and beyond
  the base ``r = 3.6541528853610088`` Marsaglia's exact tail by exponential rejection,
  ``x = r + a`` with ``a = -log1p(-u) / r``, accepted when ``2 b > a**2`` for
  ``b = -log1p(-v)``, ``u`` and ``v`` uniform on the 53-bit grid of [0, 1). As ``b <= 53 ln 2``,
  an accepted ``a`` is below ``sqrt(106 ln 2) = 8.57``, so every draw lies within
  ``r + 8.57 = 12.23`` of zero, and the Gaussian mass beyond is ``2.3e-34``. (The grid of ``v``
  makes the acceptance probability ``exp(-a**2 / 2)`` coarse only where it is below
  ``100 / 2**53``, i.e. beyond 11.67 sigma, where the mass is ``1.8e-31``.) The ziggurat is also
  the faster: one 64-bit draw per normal 99% of the time.

:class:`SeededGaussianNoise` draws a block at a time into the parameter's dtype, so a float32
step allocates no float64 array of the parameter's size.
"""

from __future__ import annotations

import abc
import math
import os
from typing import Any

import numpy as np
import torch

from dpcore.errors import InvalidParameterError, StateError
from dpcore.secure_random import secure_standard_normals
from dpcore.validation import check_seed

__all__ = [
    "PCG64_ZIGGURAT",
    "STREAMS",
    "TORCH_BOX_MULLER",
    "NoiseSource",
    "SecureGaussianNoise",
    "SeededGaussianNoise",
    "checked_standard_normal",
]

#: The default stream of :class:`SeededGaussianNoise`: numpy's PCG64 and float64 ziggurat.
PCG64_ZIGGURAT = "pcg64-ziggurat"
#: The stream before the ziggurat: a CPU ``torch.Generator`` and torch's float64 Box–Muller
#: (its states carry ``"generator"`` and no ``"stream"``).
TORCH_BOX_MULLER = "torch-box-muller"
#: The streams :class:`SeededGaussianNoise` can draw.
STREAMS = (PCG64_ZIGGURAT, TORCH_BOX_MULLER)

_PCG64_KEYS = frozenset({"bit_generator", "state", "has_uint32", "uinteger"})


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
    """Reproducible normals from a seeded generator (CPU), moved to the device.

    Args:
        seed: an integer in [0, 2**63) (the rule of every seed in dpcore, the samplers' too);
            ``None`` draws one from the OS.
        stream: :data:`PCG64_ZIGGURAT` (default: numpy's ``PCG64(seed)`` and float64
            ``standard_normal``) or :data:`TORCH_BOX_MULLER` (a ``torch.Generator`` seeded with
            ``seed`` and ``torch.randn`` in float64: the stream of checkpoints written before the
            ziggurat; :meth:`load_state_dict` selects it from such a checkpoint's state).

    Raises:
        InvalidParameterError: a seed outside [0, 2**63), or an unknown stream.
    """

    name = "seeded"

    #: float64 draws per block when the parameter is in a narrower dtype. numpy draws one normal
    #: after another, so any split equals one float64 draw of the whole tensor, rounded; for the
    #: torch stream it is a multiple of 16, torch's block of draws, for the same reason.
    BLOCK = 1 << 16

    def __init__(self, seed: int | None = None, *, stream: str = PCG64_ZIGGURAT) -> None:
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        self.seed = check_seed("seed", seed)
        if stream not in STREAMS:
            raise InvalidParameterError("stream", f"to be one of {STREAMS}", stream)
        self.stream = stream
        self.generator: torch.Generator | None = None
        self.rng: np.random.Generator | None = None
        if stream == PCG64_ZIGGURAT:
            self.rng = np.random.Generator(np.random.PCG64(self.seed))
        else:
            self.generator = torch.Generator()
            self.generator.manual_seed(self.seed)

    def standard_normal(
        self, shape: torch.Size, *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Float64 draws of the stream (module docstring), rounded to ``dtype`` block by block."""
        count = math.prod(shape)
        if self.rng is not None:
            draws = self._ziggurat(self.rng, count, dtype)
        else:
            assert self.generator is not None  # one of the two, set together with the stream
            draws = self._box_muller(self.generator, count, dtype)
        return draws.view(shape).to(device=device)

    def _ziggurat(self, rng: np.random.Generator, count: int, dtype: torch.dtype) -> torch.Tensor:
        """``count`` draws of ``rng.standard_normal`` rounded to ``dtype`` (flat, on the CPU)."""
        if dtype == torch.float64 or count <= self.BLOCK:
            return torch.from_numpy(rng.standard_normal(count)).to(dtype)
        rounded = torch.empty(count, dtype=dtype)
        block = np.empty(self.BLOCK, dtype=np.float64)
        drawn = torch.from_numpy(block)  # shares the block's memory
        for start in range(0, count, self.BLOCK):
            size = min(self.BLOCK, count - start)
            rng.standard_normal(out=block[:size])
            rounded[start : start + size].copy_(drawn[:size])
        return rounded

    def _box_muller(
        self, generator: torch.Generator, count: int, dtype: torch.dtype
    ) -> torch.Tensor:
        """``count`` draws of ``torch.randn`` (float64) rounded to ``dtype`` (flat, on the CPU)."""
        if dtype == torch.float64 or count < 2 * self.BLOCK:
            return torch.randn(count, generator=generator, dtype=torch.float64).to(dtype)
        rounded = torch.empty(count, dtype=dtype)
        block = torch.empty(self.BLOCK + 16, dtype=torch.float64)
        start = 0
        while start < count:
            # the last block takes the remainder when it is short (torch draws fewer than 16
            # values another way, so the blocks would no longer equal one whole draw)
            size = count - start if count - start < self.BLOCK + 16 else self.BLOCK
            part = block[:size]
            part.normal_(generator=generator)
            rounded[start : start + size].copy_(part)
            start += size
        return rounded

    def state_dict(self) -> dict[str, Any]:
        """The seed and the generator's state: ``{"name", "seed", "stream", "bit_generator"}``
        (numpy's ``bit_generator.state``, plain ints and strings) for the ziggurat stream; the
        torch stream's state as before it, ``{"name", "seed", "generator"}`` (a ByteTensor)."""
        if self.rng is not None:
            numpy_state = self.rng.bit_generator.state
            return {
                "name": self.name,
                "seed": self.seed,
                "stream": PCG64_ZIGGURAT,
                "bit_generator": {
                    "bit_generator": str(numpy_state["bit_generator"]),
                    "state": {
                        "state": int(numpy_state["state"]["state"]),
                        "inc": int(numpy_state["state"]["inc"]),
                    },
                    "has_uint32": int(numpy_state["has_uint32"]),
                    "uinteger": int(numpy_state["uinteger"]),
                },
            }
        assert self.generator is not None
        return {"name": self.name, "seed": self.seed, "generator": self.generator.get_state()}

    def check_state_dict(self, state: Any) -> None:
        """Refuse a state :meth:`load_state_dict` could not resume; changes nothing.

        A state without ``"stream"`` is one of the torch stream (written before the ziggurat).

        Raises:
            StateError: another source's state, a seed outside [0, 2**63), an unknown stream, a
                missing or malformed generator state (numpy's is set on a scratch ``PCG64``,
                torch's on a scratch ``torch.Generator``).
        """
        super().check_state_dict(state)
        seed = state.get("seed")
        if type(seed) is not int or not 0 <= seed < 2**63:
            raise StateError(
                f"Expected the noise seed to be an integer in [0, 2**63), got {seed!r}."
            )
        stream = _stream_of(state)
        if stream == PCG64_ZIGGURAT:
            _check_pcg64_state(state.get("bit_generator"))
            return
        if "generator" not in state:
            raise StateError("The noise source state lacks 'generator'.")
        try:
            torch.Generator().set_state(state["generator"])
        except (RuntimeError, TypeError, ValueError) as error:
            raise StateError(f"The noise generator state is malformed: {error}") from None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the stream ``state`` was taken from (the torch stream for an old state).

        Raises:
            StateError: see :meth:`check_state_dict` (nothing changes then).
        """
        self.check_state_dict(state)
        generator: torch.Generator | None = None
        rng: np.random.Generator | None = None
        stream = _stream_of(state)
        if stream == PCG64_ZIGGURAT:
            rng = np.random.Generator(np.random.PCG64(0))
            rng.bit_generator.state = state["bit_generator"]
        else:
            generator = torch.Generator()
            generator.set_state(state["generator"])
        self.seed, self.stream, self.rng, self.generator = state["seed"], stream, rng, generator


def _stream_of(state: dict[str, Any]) -> str:
    """The stream a seeded source's state belongs to (the torch one without ``"stream"``).

    Raises:
        StateError: an unknown stream.
    """
    stream = state.get("stream", TORCH_BOX_MULLER)
    if not isinstance(stream, str) or stream not in STREAMS:
        raise StateError(f"Expected the noise stream to be one of {STREAMS}, got {stream!r}.")
    return stream


def _check_pcg64_state(value: Any) -> None:
    """Refuse anything but a state numpy's ``PCG64.state`` returns (plain ints, odd increment).

    Raises:
        StateError: naming the entry that is missing or wrong.
    """
    what = "The noise source's numpy generator state ('bit_generator')"
    if not isinstance(value, dict) or set(value) != _PCG64_KEYS:
        shown = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
        raise StateError(f"{what} must be a dict with keys {sorted(_PCG64_KEYS)}, got {shown}.")
    if value["bit_generator"] != "PCG64":
        raise StateError(f"{what} is of {value['bit_generator']!r}, not 'PCG64'.")
    inner = value["state"]
    if not isinstance(inner, dict) or set(inner) != {"state", "inc"}:
        raise StateError(f"{what} must hold 'state': {{'state': int, 'inc': int}}, got {inner!r}.")
    bounds = {  # numpy's types: two 128-bit words, a flag and a 32-bit buffered draw
        "state": (inner["state"], 128),
        "inc": (inner["inc"], 128),
        "has_uint32": (value["has_uint32"], 1),
        "uinteger": (value["uinteger"], 32),
    }
    for key, (number, bits) in bounds.items():
        if type(number) is not int or not 0 <= number < 2**bits:
            raise StateError(
                f"{what}: expected {key!r} to be an integer in [0, 2**{bits}), got {number!r}."
            )
    if inner["inc"] % 2 == 0:
        raise StateError(f"{what}: the PCG64 increment 'inc' must be odd, got {inner['inc']}.")
    scratch: Any = np.random.PCG64(0)  # numpy's stubs want a TypedDict; value is checked above
    try:
        scratch.state = value
    except (KeyError, OverflowError, TypeError, ValueError) as error:
        raise StateError(f"{what} is malformed: {error}") from None


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
    finite by construction (numpy's ziggurat, ``torch.randn``; Box--Muller of uniforms in
    (0, 1]), so only other sources' draws are scanned for NaN/inf (which synchronises with the
    device).

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
