"""Run specs: frozen, hashable dataclasses named by the sha256 of their canonical JSON.

A *spec* holds everything that determines a run's result, seed included. Its key is the start of
the sha256 of its canonical JSON (the class name and the fields, keys sorted, tuples as lists),
so the same spec gets the same key in every process, on every machine and in every session. A
*code fingerprint* names the code that computes the result: a changed computation gets new
folders in the store, so stale results are never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from dpcore.errors import InvalidParameterError

__all__ = ["check_code", "check_spec", "code_fingerprint", "spec_json", "spec_key"]

#: Hex digits of a spec key and of a code fingerprint (64 bits: collisions are not a concern,
#: and a stored result is checked against its full spec anyway).
KEY_DIGITS = 16

_CODE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,63}")


def check_spec(spec: object) -> None:
    """Raise unless ``spec`` is an instance of a frozen dataclass whose fields are JSON values.

    Raises:
        InvalidParameterError: ``spec`` is not a frozen dataclass instance, is not hashable, or a
            field is not a JSON value (str, int, finite float, bool, None, lists, tuples, dicts
            with str keys, nested dataclasses of those).

    Example:
        >>> check_spec({"seed": 0})
        Traceback (most recent call last):
        ...
        dpcore.errors.InvalidParameterError: Expected spec an instance of a frozen dataclass, \
got {'seed': 0}.
    """
    if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
        raise InvalidParameterError("spec", "an instance of a frozen dataclass", spec)
    if not type(spec).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise InvalidParameterError("spec", "an instance of a frozen dataclass", spec)
    try:
        hash(spec)
    except TypeError:
        raise InvalidParameterError(
            "spec", "hashable (tuples, not lists, in its fields)", spec
        ) from None
    _canonical_text(spec)


def _canonical_text(spec: object) -> str:
    plain = {"type": type(spec).__qualname__, "fields": dataclasses.asdict(spec)}  # type: ignore[call-overload]
    try:
        return json.dumps(plain, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidParameterError(
            "spec", "fields that are JSON values (str keys, finite floats)", spec
        ) from None


def spec_json(spec: object) -> dict[str, Any]:
    """The spec as JSON values: ``{"type": class name, "fields": {...}}`` (tuples become lists).

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Spec:
        ...     seed: int
        ...     sizes: tuple[int, ...] = (1, 2)
        >>> spec_json(Spec(seed=3))
        {'fields': {'seed': 3, 'sizes': [1, 2]}, 'type': 'Spec'}
    """
    check_spec(spec)
    value: dict[str, Any] = json.loads(_canonical_text(spec))
    return value


def spec_key(spec: object) -> str:
    """The first 16 hex digits of the sha256 of the spec's canonical JSON.

    Equal specs get equal keys, in any process; field order does not matter.

    Example:
        >>> @dataclasses.dataclass(frozen=True)
        ... class Spec:
        ...     seed: int
        >>> spec_key(Spec(0)) == spec_key(Spec(0)), spec_key(Spec(0)) == spec_key(Spec(1))
        (True, False)
        >>> len(spec_key(Spec(0)))
        16
    """
    check_spec(spec)
    return hashlib.sha256(_canonical_text(spec).encode()).hexdigest()[:KEY_DIGITS]


def check_code(code: str) -> str:
    """Return ``code`` if it can name a code fingerprint in a folder name, else raise.

    Raises:
        InvalidParameterError: ``code`` is not 1 to 64 letters, digits, ``_`` or ``.`` (not
            starting with ``.``).
    """
    if not isinstance(code, str) or _CODE.fullmatch(code) is None:
        raise InvalidParameterError(
            "code", "1 to 64 characters from [A-Za-z0-9_.], not starting with '.'", code
        )
    return code


def code_fingerprint(*sources: ModuleType | str | Path, extra: str = "") -> str:
    """16 hex digits of the sha256 of the source of the given modules or files (and ``extra``).

    Pass the modules that compute a run's result (the workload, the parts of dpcore it relies
    on); any edit to them changes the fingerprint, and with it the run's folder in the store.

    Args:
        sources: modules, importable module names (``"dpcore.accountants.rdp"``) or file paths;
            a package stands for every ``.py`` file under its folder.
        extra: any further text that determines results (a library version, say).

    Returns:
        The fingerprint, usable as :class:`~dpcore.runs.store.RunStore`'s ``code``.

    Raises:
        InvalidParameterError: a source cannot be found or read, or none is given.

    Example:
        >>> import dpcore.runs.spec as this
        >>> code_fingerprint(this) == code_fingerprint("dpcore.runs.spec")
        True
        >>> code_fingerprint(this) == code_fingerprint(this, extra="v2")
        False
    """
    if not sources:
        raise InvalidParameterError("sources", "at least one module or file", sources)
    digest = hashlib.sha256()
    for source in sources:
        digest.update(_source_bytes(source))
        digest.update(b"\0")
    digest.update(extra.encode())
    return digest.hexdigest()[:KEY_DIGITS]


def _source_bytes(source: ModuleType | str | Path) -> bytes:
    try:
        if isinstance(source, Path):
            return source.read_bytes()
        module = importlib.import_module(source) if isinstance(source, str) else source
        path = inspect.getsourcefile(module)
        if path is None:
            raise TypeError(source)
        if not hasattr(module, "__path__"):
            return Path(path).read_bytes()
        # a package: every module in it, not only its __init__ (an edit to any changes results)
        folder = Path(path).parent
        files = sorted(folder.rglob("*.py"), key=lambda file: file.relative_to(folder).as_posix())
        return b"".join(
            file.relative_to(folder).as_posix().encode() + b"\0" + file.read_bytes() + b"\0"
            for file in files
        )
    except (ImportError, OSError, TypeError):
        raise InvalidParameterError(
            "sources", "modules or files whose source can be read", source
        ) from None
