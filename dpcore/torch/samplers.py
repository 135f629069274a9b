"""Lot samplers: Poisson sampling (the DP-SGD analysis) and fixed-size shuffled batches.

DP-SGD's privacy analysis (Abadi et al. 2016, Alg. 1 and §3.1; every accountant in
:mod:`dpcore.accountants`) assumes *Poisson* lots: each record joins each lot independently with
probability q, so lot sizes vary and a lot may be empty. Shuffling the data and cutting it into
fixed-size batches is a different mechanism; accounting it as Poisson can understate epsilon
several-fold (Chua et al. 2024), so :class:`ShuffledBatchSampler` warns and says so in
:attr:`matches_poisson_analysis`, which the privacy statement records.

Both samplers are seeded by a ``torch.Generator`` and resumable mid-epoch from
:meth:`state_dict` (which holds the generator state), so a resumed run draws the same lots.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from dpcore.errors import InvalidParameterError, StateError
from dpcore.validation import check_count, check_probability

__all__ = [
    "BallsInBinsSampler",
    "PoissonMismatchWarning",
    "PoissonSampler",
    "ShuffledBatchSampler",
]


class PoissonMismatchWarning(UserWarning):
    """The sampler does not match the Poisson subsampling that the accountants analyse."""


def _generator(seed: int | None) -> tuple[torch.Generator, int]:
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    seed = check_count("seed", seed)
    if seed >= 2**63:  # torch's generators take a signed 64-bit seed
        raise InvalidParameterError("seed", "< 2**63", seed)
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator, seed


class _Sampler:
    """Shared state handling: a generator, a lot counter, and ``steps_per_epoch`` lots per epoch."""

    matches_poisson_analysis: bool = True
    kind: str = ""

    def __init__(self, dataset_size: int, seed: int | None) -> None:
        self.dataset_size = check_count("dataset_size", dataset_size, minimum=1)
        self.generator, self.seed = _generator(seed)
        self.lots_drawn = 0

    @property
    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def sample(self) -> torch.Tensor:
        """The indices of the next lot (int64, sorted)."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[torch.Tensor]:
        """The remaining lots of the current epoch (all of them at an epoch boundary)."""
        remaining = self.steps_per_epoch - self.lots_drawn % self.steps_per_epoch
        for _ in range(remaining):
            yield self.sample()

    def __len__(self) -> int:
        return self.steps_per_epoch

    def _config(self) -> dict[str, Any]:
        """The constructor arguments a resumed sampler must share (besides the dataset size)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the same sequence of lots, and what it was drawn for
        (kind, dataset size, rate or lot counts), so that another sampler refuses it."""
        return {
            "kind": self.kind,
            "dataset_size": self.dataset_size,
            **self._config(),
            "seed": self.seed,
            "lots_drawn": self.lots_drawn,
            "generator": self.generator.get_state(),
        }

    def check_state_dict(self, state: Any) -> None:
        """Refuse a state that :meth:`load_state_dict` could not continue; changes nothing.

        Raises:
            StateError: not a dict, a missing entry, another kind, dataset size, sampling
                probability, batch size or steps per epoch, a malformed seed, lot count,
                generator state or epoch draw.
        """
        if not isinstance(state, dict):
            raise StateError(f"Expected a sampler state (a dict), got {type(state).__name__}.")
        if state.get("kind") != self.kind:
            raise StateError(
                f"Expected sampler state of kind {self.kind!r}, got {state.get('kind')!r}."
            )
        wanted = {"dataset_size": self.dataset_size, **self._config()}
        for key in (*wanted, "seed", "lots_drawn", "generator"):
            if key not in state:
                raise StateError(f"The sampler state lacks {key!r}.")
        for key, value in wanted.items():
            saved = state[key]
            if (
                not (isinstance(saved, int | float) and not isinstance(saved, bool))
                or saved != value
            ):
                raise StateError(
                    f"The sampler state was drawn with {key} = {state[key]!r}; this sampler has "
                    f"{key} = {value!r}."
                )
        for key, limit in (("seed", 2**63), ("lots_drawn", None)):
            value = state[key]
            if type(value) is not int or value < 0 or (limit is not None and value >= limit):
                raise StateError(
                    f"Expected the sampler's {key} to be an integer >= 0, got {value!r}."
                )
        try:
            torch.Generator().set_state(state["generator"])
        except (RuntimeError, TypeError, ValueError) as error:
            raise StateError(f"The sampler's generator state is malformed: {error}") from None
        self._check_draw(state)

    def _check_draw(self, state: dict[str, Any]) -> None:
        """Subclasses: check the current epoch's draw held in ``state``."""

    def _check_indices(self, draw: Any, what: str, bound: int) -> None:
        """``draw`` is ``None`` or an int64 tensor of N values in [0, bound)."""
        if draw is None:
            return
        if (
            not isinstance(draw, torch.Tensor)
            or draw.dtype != torch.int64
            or draw.shape != (self.dataset_size,)
        ):
            raise StateError(
                f"Expected the sampler's {what} to be an int64 tensor of {self.dataset_size} "
                f"values, got {draw!r}."
            )
        if draw.numel() and (int(draw.min()) < 0 or int(draw.max()) >= bound):
            raise StateError(f"The sampler's {what} holds values outside [0, {bound}).")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (of a sampler built with the same arguments).

        Everything is checked first (:meth:`check_state_dict`): on error nothing changes.
        """
        self.check_state_dict(state)
        self.seed = state["seed"]
        self.lots_drawn = state["lots_drawn"]
        self.generator.set_state(state["generator"])


class PoissonSampler(_Sampler):
    """Poisson lots: each of ``dataset_size`` records joins each lot independently w.p. q.

    An epoch is ``round(1 / q)`` lots (one pass in expectation). Lots can be empty; the training
    step must still add noise and the ledger must still advance.

    Args:
        dataset_size: N >= 1.
        sampling_probability: q in (0, 1].
        seed: seeds the generator; ``None`` draws one from the OS (recorded in the state).

    Example:
        >>> sampler = PoissonSampler(1000, sampling_probability=0.01, seed=0)
        >>> len(sampler), sampler.expected_lot_size
        (100, 10.0)
    """

    kind = "poisson"

    def __init__(
        self, dataset_size: int, *, sampling_probability: float, seed: int | None = None
    ) -> None:
        super().__init__(dataset_size, seed)
        q = check_probability("sampling_probability", sampling_probability)
        if q == 0:
            raise InvalidParameterError("sampling_probability", "in (0, 1]", sampling_probability)
        self.sampling_probability = q

    def _config(self) -> dict[str, Any]:
        return {"sampling_probability": self.sampling_probability}

    @property
    def expected_lot_size(self) -> float:
        """q N, the divisor of the noisy sum (dividing by the realised size would leak it)."""
        return self.sampling_probability * self.dataset_size

    @property
    def steps_per_epoch(self) -> int:
        """round(1 / q) lots per epoch (at least 1; saturating at ``sys.maxsize`` for tiny q)."""
        lots = 1 / self.sampling_probability  # inf for a subnormal q
        return max(1, sys.maxsize if lots >= sys.maxsize else round(lots))

    def sample(self) -> torch.Tensor:
        draws = torch.rand(self.dataset_size, generator=self.generator, dtype=torch.float64)
        self.lots_drawn += 1
        return torch.nonzero(draws < self.sampling_probability).flatten()


class ShuffledBatchSampler(_Sampler):
    """Fixed-size batches from a fresh shuffle each epoch (last partial batch dropped).

    This is *not* the Poisson subsampling that the accountants analyse: constructing it warns
    (:class:`PoissonMismatchWarning`), and :attr:`matches_poisson_analysis` is ``False`` so the
    privacy statement says the epsilon assumes Poisson sampling that did not happen.

    Args:
        dataset_size: N >= 1.
        batch_size: 1 <= B <= N.
        seed: as for :class:`PoissonSampler`.
    """

    kind = "shuffled_fixed_size"
    matches_poisson_analysis = False

    def __init__(self, dataset_size: int, *, batch_size: int, seed: int | None = None) -> None:
        super().__init__(dataset_size, seed)
        size = check_count("batch_size", batch_size, minimum=1)
        if size > self.dataset_size:
            raise InvalidParameterError("batch_size", f"<= dataset_size = {dataset_size}", size)
        self.batch_size = size
        self._permutation: torch.Tensor | None = None
        warnings.warn(
            "ShuffledBatchSampler draws fixed-size shuffled batches, which the DP-SGD accountants "
            "do not analyse (they assume Poisson sampling); the reported epsilon may understate "
            "the privacy loss. Use PoissonSampler for a guarantee.",
            PoissonMismatchWarning,
            stacklevel=2,
        )

    @property
    def sampling_probability(self) -> float:
        """B / N, the rate a Poisson analysis would (wrongly) assume."""
        return self.batch_size / self.dataset_size

    @property
    def expected_lot_size(self) -> float:
        return float(self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return self.dataset_size // self.batch_size

    def sample(self) -> torch.Tensor:
        position = self.lots_drawn % self.steps_per_epoch
        if position == 0 or self._permutation is None:
            self._permutation = torch.randperm(self.dataset_size, generator=self.generator)
        self.lots_drawn += 1
        lot = self._permutation[position * self.batch_size : (position + 1) * self.batch_size]
        return torch.sort(lot).values

    def _config(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["permutation"] = self._permutation
        return state

    def _check_draw(self, state: dict[str, Any]) -> None:
        permutation = state.get("permutation")
        self._check_indices(permutation, "permutation", self.dataset_size)
        if permutation is not None and not torch.equal(
            torch.sort(permutation).values, torch.arange(self.dataset_size)
        ):
            raise StateError("The sampler's permutation is not a permutation of the records.")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._permutation = state.get("permutation")


class BallsInBinsSampler(_Sampler):
    """Balls in bins (random allocation): each epoch, every record goes to one uniform step.

    Each epoch of ``steps_per_epoch`` (T) lots assigns every record to one of the T lots
    uniformly and independently, so each record is used exactly once per epoch and lots have
    N/T records on average (Chua et al., "Balls-and-Bins Sampling for DP-SGD", AISTATS 2025).
    Unlike shuffled fixed-size batches this sampler has a valid analysis of its own: the ledger
    records each epoch as a :class:`~dpcore.events.RandomAllocationEvent`, which the ``rdp``
    accountant certifies. The noisy sum is divided by the expected lot size N/T.

    Args:
        dataset_size: N >= 1.
        steps_per_epoch: T >= 1, the lots per epoch.
        seed: as for :class:`PoissonSampler`.

    Example:
        >>> sampler = BallsInBinsSampler(1000, steps_per_epoch=10, seed=0)
        >>> sum(len(lot) for lot in sampler), sampler.expected_lot_size
        (1000, 100.0)
    """

    kind = "balls_in_bins"
    matches_poisson_analysis = False

    def __init__(self, dataset_size: int, *, steps_per_epoch: int, seed: int | None = None) -> None:
        super().__init__(dataset_size, seed)
        self._steps = check_count("steps_per_epoch", steps_per_epoch, minimum=1)
        self._bins: torch.Tensor | None = None

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    @property
    def sampling_probability(self) -> float:
        """1 / T, each record's chance to be in a given lot (not a Poisson rate)."""
        return 1.0 / self._steps

    @property
    def expected_lot_size(self) -> float:
        return self.dataset_size / self._steps

    def sample(self) -> torch.Tensor:
        position = self.lots_drawn % self._steps
        if position == 0 or self._bins is None:
            self._bins = torch.randint(
                self._steps, (self.dataset_size,), generator=self.generator, dtype=torch.int64
            )
        self.lots_drawn += 1
        return torch.nonzero(self._bins == position).flatten()

    def _config(self) -> dict[str, Any]:
        return {"steps_per_epoch": self._steps}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["bins"] = self._bins
        return state

    def _check_draw(self, state: dict[str, Any]) -> None:
        self._check_indices(state.get("bins"), "bins", self._steps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._bins = state.get("bins")
