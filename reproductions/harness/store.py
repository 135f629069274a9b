"""Resumable training runs kept in a :class:`dpcore.runs.RunStore`.

A reproduction describes a training run by a dict of JSON values (method, seed, sizes...). It is
stored under :class:`TrainingSpec`, that dict as a frozen dataclass, in the run store's folder
``<root>/<spec key>-<code fingerprint>`` (:meth:`~dpcore.runs.RunStore.folder`): a changed spec
or a changed computation (say a fix in an accountant or in the engine) gets a new folder, so
stale results are never reused. Inside it, ``state.json`` (written by
:meth:`~dpcore.runs.RunStore.write_checkpoint`, atomically) holds the spec, the rows so far,
whether the run is done, and the name of the checkpoint that goes with those rows. A checkpoint
is written first under a name of its own (``checkpoint-<steps>.pt``), then ``state.json`` is
replaced to point at it: the rows and the weights a reader sees always belong together,
whatever moment a run was killed at.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_path
from dpcore.runs import RunStore

__all__ = ["STATE", "RunState", "TrainingSpec"]

#: The run's state file in its folder (a checkpoint of :class:`~dpcore.runs.RunStore`).
STATE = "state.json"


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """A reproduction's run spec (a dict of JSON values) as the frozen dataclass a
    :class:`~dpcore.runs.RunStore` keys by: ``text`` is its canonical JSON (sorted keys).

    Example:
        >>> TrainingSpec.of({"seed": 0, "lr": 0.1}) == TrainingSpec.of({"lr": 0.1, "seed": 0})
        True
        >>> TrainingSpec.of({"sizes": (1, 2)}).spec
        {'sizes': [1, 2]}
    """

    text: str

    @classmethod
    def of(cls, spec: Any) -> TrainingSpec:
        """The spec of a run described by ``spec`` (a dict, or a dataclass, of JSON values)."""
        plain = dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else spec
        return cls(json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=False))

    @property
    def spec(self) -> Any:
        """The described spec as JSON values (tuples read back as lists)."""
        return json.loads(self.text)


@dataclasses.dataclass
class RunState:
    """What one run has done so far: its rows, seconds spent, checkpoint and whether it is done.

    :meth:`open` reads it back from the run's folder in its store (or starts empty);
    :meth:`commit` writes a checkpoint and the rows together. Without a store (``store=None``)
    nothing is written.
    """

    key: TrainingSpec
    store: RunStore | None
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    done: bool = False
    checkpoint: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def open(cls, root: Path | None, spec: Any, code: str) -> RunState:
        """The saved state of ``spec`` in ``RunStore(root, code)``, else a fresh one.

        A state file that cannot be read, belongs to another spec or code, or names a checkpoint
        that is not there is not trusted: the run starts over.
        """
        key = TrainingSpec.of(spec)
        if root is None:
            return cls(key=key, store=None)
        state = cls(key=key, store=RunStore(root, code))
        data = state.store.read_checkpoint(key, STATE) if state.store is not None else None
        if data is None:
            return state
        try:
            saved = json.loads(data)
        except ValueError:
            return state  # unreadable: start over rather than trust it
        if (
            not isinstance(saved, dict)
            or saved.get("spec") != key.spec
            or saved.get("code") != code
        ):
            return state
        checkpoint = saved.get("checkpoint")
        folder = state.folder
        assert folder is not None
        if checkpoint is not None and not (folder / checkpoint).is_file():
            return state
        state.rows = list(saved.get("rows", []))
        state.seconds = float(saved.get("seconds", 0.0))
        state.done = bool(saved.get("done", False))
        state.checkpoint = checkpoint
        state.extra = dict(saved.get("extra", {}))
        return state

    @property
    def spec(self) -> Any:
        """The run's spec as JSON values."""
        return self.key.spec

    @property
    def folder(self) -> Path | None:
        """The run's folder in its store (None without a store)."""
        return None if self.store is None else self.store.folder(self.key)

    @property
    def checkpoint_path(self) -> Path | None:
        """The checkpoint that goes with :attr:`rows`, if one was saved."""
        folder = self.folder
        if folder is None or self.checkpoint is None:
            return None
        return folder / self.checkpoint

    def fresh(self) -> RunState:
        """An empty state of the same run in the same store (nothing is written)."""
        return RunState(key=self.key, store=self.store)

    def commit(self, save: Callable[[Path], None] | None = None, *, tag: int | str = 0) -> None:
        """Save a checkpoint (``save(path)``, if given) and then the rows that go with it."""
        folder = self.folder
        if self.store is None or folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        previous = self.checkpoint
        if save is not None:
            name = f"checkpoint-{tag}.pt"
            with atomic_path(folder / name) as temporary:
                save(temporary)
            self.checkpoint = name
        payload = {
            "spec": self.spec,
            "code": self.store.code,
            "rows": self.rows,
            "seconds": self.seconds,
            "done": self.done,
            "checkpoint": self.checkpoint,
            "extra": self.extra,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.store.write_checkpoint(
            self.key, (json.dumps(payload, indent=1) + "\n").encode(), STATE
        )
        if previous is not None and previous != self.checkpoint:
            (folder / previous).unlink(missing_ok=True)
