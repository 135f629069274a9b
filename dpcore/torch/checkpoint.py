"""Checkpoint integrity and validation: everything is checked before anything is assigned.

A checkpoint that does not fit the trainer loading it (another model width, sampler, dataset
size, optimizer), or that was damaged on disk, must be refused *before* the model, optimizer,
sampler, noise or ledger change: a caller that catches the error must be left with exactly the
run it had. The loaders of :class:`~dpcore.torch.training.DPTrainer` and
:class:`~dpcore.torch.private.PrivateOptimizer` therefore run every check here first and assign
only when all passed.

**Integrity rule.** :func:`seal` stores, under the key ``"integrity"``, the sha256 of a canonical
serialisation of every other entry of the state (model, optimizer with its noise state, JL
directions, sampler or loader, ledger, RNG state): dictionaries by sorted key, sequences in order,
numbers and strings by type and value, tensors by dtype, shape and raw bytes. :func:`verify`
recomputes it at load; a missing or different digest raises
:class:`~dpcore.errors.StateError` ("checkpoint integrity check failed ...") before anything is
assigned. The digest detects corruption and accidental edits (a flipped bit in a tensor, a
ledger's noise multiplier changed by hand); it is *not* a signature: whoever edits a checkpoint
deliberately can recompute it.
"""

from __future__ import annotations

import copy
import hashlib
import numbers
import struct
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dpcore.errors import StateError
from dpcore.ledger import PrivacyLedger

__all__ = [
    "INTEGRITY",
    "check_generator_state",
    "check_ledger",
    "check_model_state",
    "check_optimizer_state",
    "content_digest",
    "require",
    "seal",
    "snapshot",
    "verify",
]

#: The key under which :func:`seal` stores the digest.
INTEGRITY = "integrity"
_ALGORITHM = "sha256"

#: Per-parameter optimizer state that has the parameter's shape (torch's built-in optimizers).
_ELEMENTWISE = frozenset(
    {
        "momentum_buffer",
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "exp_inf",
        "square_avg",
        "grad_avg",
        "acc_delta",
        "sum",
        "ax",
        "prev",
        "step_size",
    }
)


def _feed(hasher: Any, value: Any, where: str) -> None:
    """Feed ``value``'s canonical serialisation to ``hasher`` (type tag, length, content)."""
    if value is None:
        hasher.update(b"N")
    elif isinstance(value, bool):
        hasher.update(b"B1" if value else b"B0")
    elif isinstance(value, numbers.Integral):
        hasher.update(b"I%d;" % int(value))
    elif isinstance(value, float):
        hasher.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        hasher.update(b"S%d:" % len(data) + data)
    elif isinstance(value, bytes | bytearray):
        hasher.update(b"Y%d:" % len(value) + bytes(value))
    elif isinstance(value, torch.Tensor):
        _feed_tensor(hasher, value, where)
    elif isinstance(value, Mapping):
        items = []
        for key, item in value.items():
            keyed = hashlib.sha256()
            _feed(keyed, key, where)
            items.append((keyed.digest(), key, item))
        items.sort(key=lambda entry: entry[0])
        hasher.update(b"D%d;" % len(items))
        for digest, key, item in items:
            hasher.update(digest)
            _feed(hasher, item, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        hasher.update(b"L%d;" % len(value))
        for index, item in enumerate(value):
            _feed(hasher, item, f"{where}[{index}]")
    else:
        raise StateError(
            f"Checkpoint entry {where} is a {type(value).__name__}, which the integrity check "
            "cannot hash (expected tensors, numbers, strings, lists and dicts)."
        )


def _feed_tensor(hasher: Any, tensor: torch.Tensor, where: str) -> None:
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise StateError(f"Checkpoint entry {where} is a {tensor.layout} tensor; cannot hash it.")
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8)  # every dtype's bytes, bfloat16 and bool included
    header = f"T{flat.dtype}{tuple(tensor.shape)}{raw.numel()}:".encode()
    hasher.update(header)
    if raw.numel():
        hasher.update(raw.numpy())


def content_digest(state: Mapping[str, Any]) -> str:
    """The sha256 (hex) of every entry of ``state`` but ``"integrity"`` (see the module rule).

    Raises:
        StateError: an entry of a type the canonical serialisation does not cover.

    Example:
        >>> a = content_digest({"w": torch.zeros(2), "steps": 3})
        >>> a == content_digest({"steps": 3, "w": torch.zeros(2)})  # key order does not matter
        True
        >>> a == content_digest({"w": torch.zeros(2, dtype=torch.float64), "steps": 3})
        False
    """
    hasher = hashlib.sha256()
    _feed(hasher, {k: v for k, v in state.items() if k != INTEGRITY}, "checkpoint")
    return hasher.hexdigest()


def seal(state: dict[str, Any]) -> dict[str, Any]:
    """Store :func:`content_digest` of ``state`` in it under ``"integrity"``; returns it."""
    state[INTEGRITY] = {"algorithm": _ALGORITHM, "digest": content_digest(state)}
    return state


def verify(state: Any, what: str = "checkpoint") -> dict[str, Any]:
    """Check that ``state`` is a dict carrying the digest :func:`seal` stored, and that it matches.

    Returns:
        ``state``, unchanged.

    Raises:
        StateError: not a dict, no ``"integrity"`` entry (e.g. written before digests existed or
            by another program), or a digest that differs ("checkpoint integrity check
            failed"): the content changed after it was saved.
    """
    if not isinstance(state, dict):
        raise StateError(f"Expected a {what} state (a dict), got {type(state).__name__}.")
    seal_ = state.get(INTEGRITY)
    if not isinstance(seal_, Mapping) or "digest" not in seal_:
        raise StateError(
            f"The {what} lacks its 'integrity' digest (saved by an older dpcore or another "
            "program); it cannot be checked, so it is refused."
        )
    if seal_.get("algorithm") != _ALGORITHM:
        raise StateError(
            f"Expected a {_ALGORITHM} {what} digest, got algorithm {seal_.get('algorithm')!r}."
        )
    actual = content_digest(state)
    if actual != seal_["digest"]:
        raise StateError(
            f"{what.capitalize()} integrity check failed: its content hashes to {actual}, not "
            f"to the stored {seal_['digest']!r}; the file was corrupted or edited after it was "
            "saved. Nothing was loaded."
        )
    return state


def require(state: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    """Raise :class:`StateError` naming the first of ``keys`` missing from ``state``."""
    for key in keys:
        if key not in state:
            raise StateError(f"The {what} lacks {key!r}.")


def snapshot(state: dict[str, Any]) -> dict[str, Any]:
    """A deep copy (tensors cloned): training on does not change a state already taken."""
    return copy.deepcopy(state)


def check_model_state(model: nn.Module, state: Any) -> None:
    """Refuse a model state whose keys, shapes or dtypes differ from ``model.state_dict()``.

    Raises:
        StateError: naming the missing or unexpected keys, or the first tensor of another shape
            or dtype (e.g. a checkpoint of a model of another width).
    """
    if not isinstance(state, Mapping):
        raise StateError(f"Expected the model's state dict, got {type(state).__name__}.")
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(str(key) for key in set(state) - set(expected))
    if missing or unexpected:
        raise StateError(
            f"The checkpoint's model does not fit this model: missing {missing}, "
            f"unexpected {unexpected}."
        )
    for key, value in expected.items():
        if not isinstance(value, torch.Tensor):
            continue  # extra state, the module's own business
        saved = state[key]
        if not isinstance(saved, torch.Tensor):
            raise StateError(f"Expected the model's {key} to be a tensor, got {saved!r}.")
        if saved.shape != value.shape or saved.dtype != value.dtype:
            raise StateError(
                f"The checkpoint's model does not fit this model: {key} is {saved.dtype} of "
                f"shape {tuple(saved.shape)}, this model's is {value.dtype} of shape "
                f"{tuple(value.shape)}."
            )


def check_optimizer_state(optimizer: torch.optim.Optimizer, state: Any) -> None:
    """Refuse a torch optimizer state that does not fit ``optimizer`` (without loading it).

    Checks what ``optimizer.load_state_dict`` checks (the same number of groups, of the same
    sizes) and what it does not: unique integer parameter ids, per-parameter state only for those
    ids, and per-parameter buffers of the parameter's shape (``exp_avg``, ``momentum_buffer``,
    ... of torch's built-in optimizers). Then it loads the state into a copy of ``optimizer``
    whose tensors are on the ``meta`` device (no memory), so that whatever the optimizer's own
    ``load_state_dict`` refuses (e.g. a malformed ``step``) is refused here, before the real load.

    Raises:
        StateError: naming the first mismatch.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"Expected the optimizer's state dict, got {type(state).__name__}.")
    require(state, ("state", "param_groups"), "optimizer state")
    groups, per_parameter = state["param_groups"], state["state"]
    if not isinstance(groups, list | tuple) or not isinstance(per_parameter, Mapping):
        raise StateError("Expected the optimizer's 'param_groups' a list and 'state' a dict.")
    current = optimizer.param_groups
    if len(groups) != len(current):
        raise StateError(
            f"The checkpoint's optimizer has {len(groups)} parameter groups, this one "
            f"{len(current)}."
        )
    parameters: dict[int, torch.Tensor] = {}
    for number, (saved, group) in enumerate(zip(groups, current, strict=True)):
        ids = saved.get("params") if isinstance(saved, Mapping) else None
        if not isinstance(ids, list | tuple) or len(ids) != len(group["params"]):
            raise StateError(
                f"The checkpoint's optimizer group {number} does not hold "
                f"{len(group['params'])} parameters like this one's."
            )
        for index, parameter in zip(ids, group["params"], strict=True):
            if not isinstance(index, int) or isinstance(index, bool) or index in parameters:
                raise StateError(f"Malformed parameter id {index!r} in the optimizer state.")
            parameters[index] = parameter
    for index, buffers in per_parameter.items():
        if index not in parameters or not isinstance(buffers, Mapping):
            raise StateError(f"The optimizer state holds an entry {index!r} for no parameter.")
        shape = parameters[index].shape
        for name, buffer in buffers.items():
            if name in _ELEMENTWISE and isinstance(buffer, torch.Tensor) and buffer.shape != shape:
                raise StateError(
                    f"The checkpoint's optimizer state {name!r} of parameter {index} has shape "
                    f"{tuple(buffer.shape)}; the parameter has shape {tuple(shape)}."
                )
    _trial_load(optimizer, state)


def _trial_load(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load ``state`` into a copy of ``optimizer`` over ``meta`` tensors; raise StateError if it
    fails. An optimizer that cannot be copied skips this (the checks above still ran)."""
    memo: dict[int, Any] = {}
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            memo[id(parameter)] = torch.empty_like(parameter, device="meta")
    for buffers in optimizer.state.values():
        for buffer in buffers.values():
            if isinstance(buffer, torch.Tensor):
                memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    try:
        trial = copy.deepcopy(optimizer, memo)
    except Exception:  # pragma: no cover - an optimizer holding something that cannot be copied
        return
    try:
        trial.load_state_dict(dict(state))
    except (TypeError, ValueError, RuntimeError, KeyError, AttributeError, IndexError) as error:
        if isinstance(error, StateError):
            raise
        raise StateError(f"The optimizer refuses the checkpoint's state: {error!r}") from None


def check_generator_state(state: Any, what: str) -> torch.Tensor:
    """Refuse anything but a state a CPU ``torch.Generator`` accepts; returns it.

    Raises:
        StateError: not a ``uint8`` tensor of the generator state's size.
    """
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8:
        raise StateError(f"Expected {what} to be a torch.uint8 generator state, got {state!r}.")
    try:
        torch.Generator().set_state(state)
    except (RuntimeError, TypeError, ValueError) as error:
        raise StateError(f"Expected {what} to be a generator state: {error}") from None
    return state


def check_ledger(state: Any, current: PrivacyLedger, lots_drawn: int) -> PrivacyLedger:
    """Rebuild a saved ledger and refuse it unless it belongs to the run loading it.

    Args:
        state: the saved ledger state.
        current: the loading run's ledger (built from its own sampler).
        lots_drawn: the saved sampler's lot count: the saved ledger's next lot must be it (every
            lot drawn was recorded).

    Returns:
        The rebuilt ledger (nothing is assigned here).

    Raises:
        StateError: a malformed ledger (:meth:`PrivacyLedger.from_state_dict`), or one of
            another dataset size, sampler kind or steps per epoch than ``current``, or whose
            steps do not end at ``lots_drawn``.
    """
    ledger = PrivacyLedger.from_state_dict(state)
    for name in ("dataset_size", "sampler", "steps_per_epoch"):
        saved, wanted = getattr(ledger, name), getattr(current, name)
        if saved != wanted:
            raise StateError(
                f"The checkpoint's ledger has {name} = {saved!r}; this run's has {wanted!r}."
            )
    if ledger.next_lot != lots_drawn:
        raise StateError(
            f"The checkpoint's ledger ends before lot {ledger.next_lot}, but its sampler has "
            f"drawn {lots_drawn} lots: they belong to different runs."
        )
    return ledger
