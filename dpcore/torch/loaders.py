"""Poisson lots from any map-style ``Dataset`` through a ``DataLoader``, in micro-batches.

:class:`LotLoader` keeps what users rely on in ``torch.utils.data`` — the dataset's
``__getitem__`` and transforms, ``collate_fn``, worker processes, pinned memory — and replaces
only the choice of examples: a :class:`~dpcore.torch.samplers.PoissonSampler` draws each logical
lot (variable size, possibly empty), and :class:`LotBatchSampler` cuts it into physical
micro-batches of at most ``max_physical_batch_size`` examples, so memory follows the physical
batch, never the lot (the examples of a lot are loaded micro-batch by micro-batch).

Iterating yields :class:`MicroBatch` objects in order: the collated data, and where it sits in its
lot (``lot``, ``index``, ``last``), tagged with the loader that yielded it. An empty lot yields
one micro-batch with ``data=None``: the training step must still add noise and the ledger must
still advance. The sampler runs in the main process (a
``DataLoader`` asks its batch sampler for index lists there), so the position of every micro-batch
is known in order even when workers prefetch ahead; the loader's :meth:`LotLoader.state_dict`
describes the lots *consumed*, not those prefetched, so a resumed run draws the same lots.

When loading a micro-batch raises (a flaky read, a worker's error), iteration stops with a
:class:`LotLoadError` naming the lot, and the loader rewinds to the end of the last lot it yielded
whole: iterating it again draws that same lot identically from its first micro-batch (and
:class:`~dpcore.torch.private.PrivateOptimizer` restarts a lot whose first micro-batch comes
again, so a retried lot is stepped and counted once).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from dpcore.errors import InvalidParameterError, StateError
from dpcore.torch.errors import LoopUsageError
from dpcore.torch.samplers import PoissonSampler, ShuffledBatchSampler
from dpcore.torch.workers import DieWithParent
from dpcore.validation import check_count

__all__ = [
    "TARGET_KEY",
    "LotBatchSampler",
    "LotLoadError",
    "LotLoader",
    "MicroBatch",
    "Split",
    "SplitByKey",
    "split_pair",
]

LotSampler = PoissonSampler | ShuffledBatchSampler

#: DataLoader options that choose examples: the lot sampler does that.
_REFUSED = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """One physical batch of a logical lot.

    Attributes:
        data: the collated examples (what the ``collate_fn`` returns), ``None`` for an empty lot.
        size: examples in this micro-batch.
        lot: the lot's number (lots drawn since the sampler was created).
        lot_size: examples in the whole lot (for the user's eyes: it is not released).
        last: this is the lot's last micro-batch (the step happens after it).
        index: this micro-batch's place in its lot (0, 1, 2, ...).
        source: the token of the :class:`LotLoader` that yielded it (``None`` for one built by
            hand), so that an optimizer made for one loader refuses another's micro-batches;
            not part of equality or ``repr``.
    """

    data: Any
    size: int
    lot: int
    lot_size: int
    last: bool
    index: int = 0
    source: object = dataclasses.field(default=None, compare=False, repr=False)

    def __iter__(self) -> NoReturn:
        """Refused: a micro-batch is stepped whole (``for x, y in loader`` is Opacus' loop).

        Raises:
            LoopUsageError: always, saying ``for micro in loader: optimizer.step(micro)``.
        """
        raise LoopUsageError(
            "micro",
            "stepped whole, not unpacked: for micro in loader: result = optimizer.step(micro) "
            "(the optimizer runs the forward, the loss and the backward; micro.data holds the "
            "collated batch)",
            "an unpacking of a MicroBatch",
        )


class LotLoadError(StateError):
    """Loading a micro-batch of a lot failed; the loader has rewound to the start of that lot.

    Iterating the loader again draws the same lot again, identically, from its first
    micro-batch (the original exception is chained as ``__cause__``).

    Attributes:
        lot: the number of the lot whose micro-batch failed to load (``None`` if unknown).
    """

    def __init__(self, lot: int | None, error: BaseException) -> None:
        self.lot = lot
        which = "the next lot" if lot is None else f"lot {lot}"
        super().__init__(
            f"Loading a micro-batch of {which} failed ({type(error).__name__}: {error}); the "
            "loader has rewound: iterate it again to draw the same lot from its first "
            "micro-batch (the optimizer restarts that lot; nothing of it was released)."
        )


@dataclasses.dataclass(frozen=True)
class _Position:
    size: int
    lot: int
    lot_size: int
    last: bool
    index: int
    state_after: dict[str, Any] | None  # the sampler's state after this lot (on ``last`` only)


#: Smallest expected lot size q N that :class:`LotLoader` accepts (see its constructor).
_MIN_EXPECTED_LOT = 1e-4


class LotBatchSampler(Sampler[list[int]]):
    """The remaining lots of the sampler's epoch, as index lists of at most B examples.

    Empty lots produce no index list (a ``DataLoader`` cannot collate nothing); their positions,
    like every micro-batch's, are queued in :attr:`positions` in order, for :class:`LotLoader`.

    Args:
        sampler: draws the lots (Poisson for the DP-SGD analysis).
        max_physical_batch_size: B >= 1, or ``None`` for one micro-batch per lot.
    """

    def __init__(self, sampler: LotSampler, max_physical_batch_size: int | None = None) -> None:
        if not isinstance(sampler, PoissonSampler | ShuffledBatchSampler):
            raise InvalidParameterError(
                "sampler", "a PoissonSampler (or a ShuffledBatchSampler)", sampler
            )
        self.sampler = sampler
        self.max_physical_batch_size = (
            None
            if max_physical_batch_size is None
            else check_count("max_physical_batch_size", max_physical_batch_size, minimum=1)
        )
        self.positions: collections.deque[_Position] = collections.deque()

    def __len__(self) -> int:
        """Lots per epoch (the number of micro-batches depends on the draws)."""
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        for lot in self.sampler:
            number = self.sampler.lots_drawn - 1
            size = int(lot.numel())
            state = copy.deepcopy(self.sampler.state_dict())
            if size == 0:
                self.positions.append(_Position(0, number, 0, True, 0, state))
                continue
            step = self.max_physical_batch_size or size
            for index, start in enumerate(range(0, size, step)):
                part = lot[start : start + step].tolist()
                last = start + step >= size
                self.positions.append(
                    _Position(len(part), number, size, last, index, state if last else None)
                )
                yield part


class LotLoader:
    """Logical Poisson lots of a map-style dataset, loaded in micro-batches.

    Args:
        dataset: a map-style ``Dataset`` (``__getitem__`` and ``__len__``); its size is the N of
            the privacy analysis.
        sampler: a :class:`~dpcore.torch.samplers.PoissonSampler` over ``len(dataset)`` records
            (a :class:`~dpcore.torch.samplers.ShuffledBatchSampler` only if asked for; it warns);
            or leave it out and give ``sampling_probability``.
        sampling_probability: q, for a Poisson sampler over ``len(dataset)`` records seeded by
            ``seed`` (instead of ``sampler``).
        seed: see ``sampling_probability``.
        max_physical_batch_size: the most examples loaded and clipped at once (``None``: whole
            lots).
        **loader_options: passed to ``torch.utils.data.DataLoader`` (``collate_fn``,
            ``num_workers``, ``pin_memory``, ``persistent_workers``, ...); options that choose
            examples (``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``, ``drop_last``)
            are refused: the lots must be the sampler's. With ``num_workers``, the
            ``worker_init_fn`` is wrapped so that on Linux each worker is killed when the process
            that started it dies, even by SIGKILL (:mod:`dpcore.torch.workers`).

    Raises:
        InvalidParameterError: an ``IterableDataset`` (no size, so no Poisson sampling), a sampler
            over another number of records, or a refused option.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.arange(10.0).unsqueeze(1), torch.arange(10))
        >>> loader = LotLoader(data, sampler=PoissonSampler(10, sampling_probability=0.5, seed=0),
        ...                    max_physical_batch_size=2)
        >>> [(m.lot, m.size, m.last) for m in loader][:3]
        [(0, 2, False), (0, 2, True), (1, 2, False)]
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        sampler: LotSampler | None = None,
        sampling_probability: float | None = None,
        seed: int | None = None,
        max_physical_batch_size: int | None = None,
        **loader_options: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise InvalidParameterError(
                "dataset",
                "a map-style Dataset with __len__ (an IterableDataset has no size, so its "
                "records cannot be Poisson-sampled)",
                type(dataset).__name__,
            )
        refused = sorted(set(loader_options) & set(_REFUSED))
        if refused:
            raise InvalidParameterError(
                refused[0],
                "not given: the Poisson sampler chooses the examples of every lot (pass "
                "max_physical_batch_size to bound memory)",
                loader_options[refused[0]],
            )
        size = len(dataset)
        if (sampler is None) == (sampling_probability is None):
            raise InvalidParameterError(
                "sampler", "given exactly when sampling_probability is not", sampler
            )
        if sampler is None:
            assert sampling_probability is not None
            sampler = PoissonSampler(size, sampling_probability=sampling_probability, seed=seed)
        if not isinstance(sampler, PoissonSampler | ShuffledBatchSampler):
            raise InvalidParameterError("sampler", "a PoissonSampler", sampler)
        if sampler.dataset_size != size:
            raise InvalidParameterError(
                "sampler", f"to sample from len(dataset) = {size} records", sampler.dataset_size
            )
        if isinstance(sampler, PoissonSampler) and sampler.expected_lot_size < _MIN_EXPECTED_LOT:
            # Empty lots reach the loop only with the next non-empty one (a DataLoader cannot
            # collate nothing): with lots this rare it would queue ~1 / (q N) of them first.
            raise InvalidParameterError(
                "sampling_probability",
                f"with len(dataset) = {size}, an expected lot size q N >= {_MIN_EXPECTED_LOT:g} "
                "(below it this loader would queue about 1 / (q N) empty lots before yielding)",
                sampler.sampling_probability,
            )
        self.dataset = dataset
        self.sampler = sampler
        self.batch_sampler = LotBatchSampler(sampler, max_physical_batch_size)
        if "num_workers" in loader_options:  # workers die with this process (Linux)
            loader_options["worker_init_fn"] = DieWithParent(loader_options.get("worker_init_fn"))
        self.loader: DataLoader[Any] = DataLoader(
            dataset, batch_sampler=self.batch_sampler, **loader_options
        )
        self._resume: dict[str, Any] = copy.deepcopy(sampler.state_dict())
        self.token = object()  # tags this loader's micro-batches (MicroBatch.source)

    @property
    def max_physical_batch_size(self) -> int | None:
        return self.batch_sampler.max_physical_batch_size

    @property
    def sample_rate(self) -> float:
        """q, the sampler's sampling probability (Opacus' ``loader.sample_rate``)."""
        return self.sampler.sampling_probability

    def __len__(self) -> int:
        """Lots per epoch."""
        return len(self.batch_sampler)

    @property
    def lots_consumed(self) -> int:
        """The sampler's number of the next lot this loader yields (lots yielded whole so far)."""
        return int(self._resume["lots_drawn"])

    def __iter__(self) -> Iterator[MicroBatch]:
        """The micro-batches of the remaining lots of the epoch, in order.

        Raises:
            LotLoadError: loading a micro-batch raised; the loader has rewound to the start of
                that lot (the sampler's state after the last lot yielded whole), so iterating
                again redraws the same lot identically.
        """
        positions = self.batch_sampler.positions
        positions.clear()
        self.sampler.load_state_dict(copy.deepcopy(self._resume))  # drop prefetched draws
        loaded: Iterator[Any] = iter(self.loader)
        waiting: collections.deque[Any] = collections.deque()
        exhausted = False
        while True:
            if not positions:
                if exhausted:
                    return
                try:  # asking the loader for data makes the sampler draw (and queue) lots
                    waiting.append(self._load(loaded))
                except StopIteration:
                    exhausted = True
                continue
            position = positions[0]
            if position.size and not waiting:
                try:
                    waiting.append(self._load(loaded))
                except StopIteration:  # pragma: no cover - a queued position always has data
                    exhausted = True
                    continue
            positions.popleft()
            data = waiting.popleft() if position.size else None
            if position.last and position.state_after is not None:
                self._resume = position.state_after
            yield MicroBatch(
                data,
                position.size,
                position.lot,
                position.lot_size,
                position.last,
                index=position.index,
                source=self.token,
            )

    def _load(self, loaded: Iterator[Any]) -> Any:
        """The next collated micro-batch; a failure rewinds the loader (see :meth:`__iter__`)."""
        try:
            return next(loaded)
        except StopIteration:
            raise
        except Exception as error:
            # The micro-batch that failed is the first queued one with data (the data loader
            # returns batches in order, also from workers).
            lot = next((p.lot for p in self.batch_sampler.positions if p.size), None)
            self.batch_sampler.positions.clear()
            self.sampler.load_state_dict(copy.deepcopy(self._resume))
            raise LotLoadError(lot, error) from error

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state after the last lot consumed (prefetched lots are drawn again)."""
        return copy.deepcopy(self._resume)

    def check_state_dict(self, state: Any) -> None:
        """Refuse a state this loader's sampler could not continue; changes nothing.

        Raises:
            StateError: see :meth:`~dpcore.torch.samplers.PoissonSampler.check_state_dict`
                (another kind, dataset size or rate, or a malformed state).
        """
        self.sampler.check_state_dict(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the lots that :meth:`state_dict` had consumed.

        Everything is checked first (:meth:`check_state_dict`); on error nothing changes.
        """
        self.check_state_dict(state)
        self.sampler.load_state_dict(copy.deepcopy(state))
        self._resume = copy.deepcopy(state)


Split = Callable[[Any], tuple[Any, Any]]
"""``split(data) -> (inputs, targets)`` for a collated micro-batch."""


#: The key of the targets in a dict batch (Hugging Face's name) unless ``target_key`` says.
TARGET_KEY = "labels"


def split_pair(data: Any) -> tuple[Any, Any]:
    """The default ``split``: an ``(inputs, targets)`` pair, or a dict batch split by key.

    A dict batch (Hugging Face's ``{"input_ids", "attention_mask", "labels"}``) gives the dict
    without ``"labels"`` as the inputs (the model is called as ``model(**inputs)``, so the
    attention mask and every other entry reach it) and ``batch["labels"]`` as the targets;
    :class:`SplitByKey` takes the targets under another key.

    Raises:
        InvalidParameterError: neither a pair nor a dict with ``"labels"`` (the message says
            how to split the batch without losing an entry).
    """
    if isinstance(data, Mapping):
        return SplitByKey(TARGET_KEY)(data)
    if isinstance(data, tuple | list) and len(data) == 2:
        return data[0], data[1]
    if isinstance(data, tuple | list) and len(data) > 2:
        hint = (
            f"split=lambda batch: (tuple(batch[:-1]), batch[-1]) for a batch of {len(data)} "
            "entries whose last is the targets (the model is called as model(*inputs))"
        )
    else:
        hint = "a split(batch) -> (inputs, targets) for this kind of batch"
    raise InvalidParameterError(
        "split",
        "given for batches that are not (inputs, targets) pairs or dicts with 'labels': " + hint,
        type(data).__name__,
    )


class SplitByKey:
    """``split`` for dict batches: targets under ``key``; the rest is ``model(**inputs)``.

    Args:
        key: the targets' key (``"labels"`` by default, as in Hugging Face batches).
    """

    def __init__(self, key: str = TARGET_KEY) -> None:
        if not isinstance(key, str):
            raise InvalidParameterError("target_key", "a str (the targets' key)", key)
        self.key = key

    def __repr__(self) -> str:
        return f"SplitByKey({self.key!r})"

    def __call__(self, data: Any) -> tuple[dict[str, Any], Any]:
        """``({k: v for k != key}, data[key])``.

        Raises:
            InvalidParameterError: ``data`` is not a dict or has no ``key`` (naming its keys).
        """
        if not isinstance(data, Mapping) or self.key not in data:
            keys = sorted(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
            raise InvalidParameterError(
                "target_key",
                f"a key of the dict batch holding the targets (the batch has {keys}); pass "
                "target_key='<your targets key>' or split=...",
                self.key,
            )
        inputs = {name: value for name, value in data.items() if name != self.key}
        return inputs, data[self.key]
