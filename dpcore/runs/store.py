"""The run store: one folder per run, ``<root>/<spec key>-<code fingerprint>``.

Inside a run's folder, ``spec.json`` holds the spec and ``result.json`` the result (JSON values),
each written atomically (:mod:`dpcore.atomic`): the result file appears complete or not at all,
so a run killed at any moment leaves no partial result and is simply run again. A resumable run
keeps its own checkpoints in the same folder (:meth:`RunStore.folder`), also written atomically
(:meth:`RunStore.write_checkpoint`), and picks them up when it is run again.

``result.json`` depends only on the spec, the code fingerprint and the result, so a run computed
twice (a retried run whose first attempt had in fact finished) writes the same bytes, atomically
replacing the first copy: nothing is ever duplicated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from dpcore.atomic import atomic_write_bytes, atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs.errors import RunNotFoundError
from dpcore.runs.spec import check_code, spec_json, spec_key

__all__ = ["RESULT", "SPEC", "RunStore", "StoredRun", "stored"]

RESULT = "result.json"
SPEC = "spec.json"

S = TypeVar("S")

_MISSING = object()


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, indent=1, allow_nan=False) + "\n"


def _is_json(value: object) -> bool:
    """Whether ``value`` is made of JSON values that read back equal (tuples read as lists)."""
    if value is None or isinstance(value, str | bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


class RunStore:
    """Results of runs on disk, keyed by spec and code fingerprint.

    Args:
        root: the folder holding one subfolder per run (created on the first write).
        code: the code fingerprint (see :func:`~dpcore.runs.spec.code_fingerprint`): runs
            computed by other code live in other folders and are never returned.

    Raises:
        InvalidParameterError: ``code`` cannot be part of a folder name.

    Example:
        >>> import dataclasses, tempfile
        >>> @dataclasses.dataclass(frozen=True)
        ... class Spec:
        ...     seed: int
        >>> store = RunStore(tempfile.mkdtemp(), code="v1")
        >>> store.has(Spec(0))
        False
        >>> store.put(Spec(0), {"loss": 0.25, "steps": (1, 2)})
        >>> store.has(Spec(0)), store.result(Spec(0))
        (True, {'loss': 0.25, 'steps': [1, 2]})
    """

    def __init__(self, root: str | Path, code: str) -> None:
        self.root = Path(root)
        self.code = check_code(code)

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r}, code={self.code!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunStore) and (self.root, self.code) == (other.root, other.code)

    def __hash__(self) -> int:
        return hash((self.root, self.code))

    def folder(self, spec: object) -> Path:
        """The run's folder (not created): its result, its spec and any checkpoints it keeps."""
        return self.root / f"{spec_key(spec)}-{self.code}"

    def _read(self, spec: object) -> object:
        """The stored result, or ``_MISSING`` when there is none or it does not match."""
        path = self.folder(spec) / RESULT
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return _MISSING
        if (
            not isinstance(payload, dict)
            or payload.get("spec") != spec_json(spec)
            or payload.get("code") != self.code
            or "result" not in payload
        ):
            return _MISSING  # another spec (a key collision) or a damaged file: never reused
        return payload["result"]

    def has(self, spec: object) -> bool:
        """Whether a finished result of ``spec`` at this code is stored."""
        return self._read(spec) is not _MISSING

    def result(self, spec: object) -> Any:
        """The stored result of ``spec`` (JSON values: tuples read back as lists).

        Raises:
            RunNotFoundError: no finished result of ``spec`` is stored.
        """
        value = self._read(spec)
        if value is _MISSING:
            raise RunNotFoundError(spec, self.folder(spec))
        return value

    def put(self, spec: object, result: object) -> None:
        """Store ``result`` for ``spec``: ``spec.json`` first, then ``result.json``, atomically.

        Raises:
            InvalidParameterError: ``result`` is not made of JSON values (nothing is written).
        """
        described = spec_json(spec)
        if not _is_json(result):
            raise InvalidParameterError(
                "result", "JSON values (dicts with str keys, lists, finite floats...)", result
            )
        text = _dumps({"code": self.code, "result": result, "spec": described})
        folder = self.folder(spec)
        atomic_write_text(folder / SPEC, _dumps(described))
        atomic_write_text(folder / RESULT, text)

    def write_checkpoint(self, spec: object, data: bytes, name: str = "checkpoint") -> Path:
        """Atomically write a resumable run's checkpoint ``data`` into its folder; return it.

        Raises:
            InvalidParameterError: ``name`` is not a plain file name other than the store's own.
        """
        path = self._checkpoint_path(spec, name)
        atomic_write_bytes(path, data)
        return path

    def read_checkpoint(self, spec: object, name: str = "checkpoint") -> bytes | None:
        """The checkpoint last written by :meth:`write_checkpoint`, or None when there is none."""
        try:
            return self._checkpoint_path(spec, name).read_bytes()
        except FileNotFoundError:
            return None

    def _checkpoint_path(self, spec: object, name: str) -> Path:
        if (
            not isinstance(name, str)
            or name in ("", ".", "..", RESULT, SPEC)
            or "/" in name
            or "\\" in name
            or name.startswith(".")
        ):
            raise InvalidParameterError(
                "name",
                f"a plain file name, not starting with '.', other than {RESULT}/{SPEC}",
                name,
            )
        return self.folder(spec) / name


class StoredRun(Generic[S]):
    """``execute`` that returns the stored result when there is one, else computes and stores it.

    Picklable whenever ``execute`` is a module-level function, so it can be sent to any worker
    (spawned process, Dask, Ray, Slurm) that sees the store's folder. Calling it twice on one
    spec computes once: it is idempotent, and a run killed before storing is simply redone.

    Args:
        execute: a module-level function of the spec (or, with ``with_folder=True``, of the spec
            and its run folder, where it may keep checkpoints to resume from) returning JSON
            values.
        store: where results live.
        with_folder: pass ``store.folder(spec)`` (created) as second argument to ``execute``.
    """

    def __init__(
        self, execute: Callable[..., Any], store: RunStore, *, with_folder: bool = False
    ) -> None:
        if not callable(execute):
            raise InvalidParameterError("execute", "a callable", execute)
        self.execute = execute
        self.store = store
        self.with_folder = with_folder

    def __repr__(self) -> str:
        name = getattr(self.execute, "__qualname__", repr(self.execute))
        return f"StoredRun({name}, {self.store!r})"

    def __call__(self, spec: S) -> Any:
        value = self.store._read(spec)
        if value is not _MISSING:
            return value
        if self.with_folder:
            folder = self.store.folder(spec)
            folder.mkdir(parents=True, exist_ok=True)
            result = self.execute(spec, folder)
        else:
            result = self.execute(spec)
        self.store.put(spec, result)
        return self.store.result(spec)


def stored(
    execute: Callable[..., Any], store: RunStore, *, with_folder: bool = False
) -> StoredRun[Any]:
    """Wrap ``execute`` so that it reads and writes ``store`` (see :class:`StoredRun`).

    Example:
        >>> import dataclasses, tempfile
        >>> @dataclasses.dataclass(frozen=True)
        ... class Spec:
        ...     x: int
        >>> calls = []
        >>> def square(spec):
        ...     calls.append(spec.x)
        ...     return spec.x**2
        >>> run = stored(square, RunStore(tempfile.mkdtemp(), code="v1"))
        >>> run(Spec(3)), run(Spec(3)), calls
        (9, 9, [3])
    """
    return StoredRun(execute, store, with_folder=with_folder)
