"""The run store: one folder per run, named by its spec and the code that computes it.

A *run* is a pure function of a frozen, hashable spec (a dataclass holding everything that
determines the result, seed included). Its folder is ``<root>/<spec key>-<code fingerprint>``:
a changed spec or a changed computation (say a fix in an accountant or in the engine) gets a new
folder, so stale results are never reused. Inside it, ``state.json`` holds the spec, the rows so
far, whether the run is done, and the name of the checkpoint that goes with those rows. A
checkpoint is written first under a name of its own (``checkpoint-<steps>.pt``), then
``state.json`` is replaced atomically to point at it: the rows and the weights a reader sees
always belong together, whatever moment a run was killed at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_path, atomic_write_text

__all__ = ["RunState", "spec_json", "spec_key"]

STATE = "state.json"


def spec_json(spec: Any) -> Any:
    """A dataclass spec as JSON values (tuples become lists, as they read back)."""
    plain = dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else spec
    return json.loads(json.dumps(plain, sort_keys=True))


def spec_key(spec: Any) -> str:
    """The first 12 hex digits of the sha256 of the spec's canonical JSON.

    Example:
        >>> spec_key({"seed": 0, "lr": 0.1}) == spec_key({"lr": 0.1, "seed": 0})
        True
        >>> len(spec_key({"seed": 0}))
        12
    """
    text = json.dumps(spec_json(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclasses.dataclass
class RunState:
    """What one run has done so far: its rows, seconds spent, checkpoint and whether it is done.

    :meth:`open` reads it back from the run's folder (or starts empty); :meth:`commit` writes
    a checkpoint and the rows together. Without a folder (``folder=None``) nothing is written.
    """

    spec: Any
    code: str
    folder: Path | None
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    done: bool = False
    checkpoint: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def open(cls, root: Path | None, spec: Any, code: str) -> RunState:
        """The saved state of ``spec`` under ``root`` at code ``code``, else a fresh one."""
        if root is None:
            return cls(spec=spec_json(spec), code=code, folder=None)
        folder = root / f"{spec_key(spec)}-{code}"
        state = cls(spec=spec_json(spec), code=code, folder=folder)
        path = folder / STATE
        if not path.is_file():
            return state
        try:
            saved = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return state  # unreadable: start over rather than trust it
        if saved.get("spec") != state.spec or saved.get("code") != code:
            return state
        checkpoint = saved.get("checkpoint")
        if checkpoint is not None and not (folder / checkpoint).is_file():
            return state
        state.rows = list(saved.get("rows", []))
        state.seconds = float(saved.get("seconds", 0.0))
        state.done = bool(saved.get("done", False))
        state.checkpoint = checkpoint
        state.extra = dict(saved.get("extra", {}))
        return state

    @property
    def checkpoint_path(self) -> Path | None:
        """The checkpoint that goes with :attr:`rows`, if one was saved."""
        if self.folder is None or self.checkpoint is None:
            return None
        return self.folder / self.checkpoint

    def commit(self, save: Callable[[Path], None] | None = None, *, tag: int | str = 0) -> None:
        """Save a checkpoint (``save(path)``, if given) and then the rows that go with it."""
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        previous = self.checkpoint
        if save is not None:
            name = f"checkpoint-{tag}.pt"
            with atomic_path(self.folder / name) as temporary:
                save(temporary)
            self.checkpoint = name
        payload = {
            "spec": self.spec,
            "code": self.code,
            "rows": self.rows,
            "seconds": self.seconds,
            "done": self.done,
            "checkpoint": self.checkpoint,
            "extra": self.extra,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        atomic_write_text(self.folder / STATE, json.dumps(payload, indent=1) + "\n")
        if previous is not None and previous != self.checkpoint:
            (self.folder / previous).unlink(missing_ok=True)
