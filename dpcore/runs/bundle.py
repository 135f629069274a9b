"""Run bundles: a store's finished results in one file, to carry a long profile between machines.

A run store is a folder tree kept beside the code (git-ignored, one folder per run). A profile
that takes days is run in pieces, often on machines that start from a fresh checkout; a
*bundle* is the part of a store that matters for resuming, in one text file that can be
committed or copied: one JSON line per finished run, ``{"code", "key", "result", "spec"}``.

:func:`export_runs` writes the finished results of the given specs at the store's code
fingerprint (atomically, keys sorted, so the same results give the same bytes);
:func:`import_runs` puts a bundle's results back into a store. A bundle line is used only for a
spec asked for, at the store's own code fingerprint, with the full spec equal to the one asked
for: results computed by other code are never reused (the store's own rule), and they are
counted, not raised on, so a bundle left by an older version of the code simply resumes
nothing. The whole file is validated before anything is written into the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError
from dpcore.runs.spec import spec_json, spec_key
from dpcore.runs.store import RunStore

__all__ = ["Imported", "export_runs", "import_runs", "read_bundle"]

_FIELDS = {"code", "key", "result", "spec"}


class Imported(NamedTuple):
    """What :func:`import_runs` did with a bundle."""

    added: int  #: results written into the store
    present: int  #: results the store already had
    other_code: int  #: lines of the asked specs computed by other code (not used)
    unused: int  #: lines of specs not asked for


def export_runs(store: RunStore, specs: Iterable[object], path: str | Path) -> int:
    """Write the finished results of ``specs`` in ``store`` to the bundle ``path`` (atomically).

    Specs without a finished result are left out; the file is replaced as a whole.

    Returns:
        The number of runs written.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from dpcore.runs.example import ExampleSpec
        >>> first = RunStore(tempfile.mkdtemp(), code="v1")
        >>> first.put(ExampleSpec(seed=0, steps=3), {"mean": 0.5})
        >>> bundle = Path(tempfile.mkdtemp()) / "runs.jsonl"
        >>> specs = [ExampleSpec(seed=seed, steps=3) for seed in range(2)]
        >>> export_runs(first, specs, bundle)
        1
        >>> second = RunStore(tempfile.mkdtemp(), code="v1")
        >>> import_runs(second, specs, bundle)
        Imported(added=1, present=0, other_code=0, unused=0)
        >>> second.result(ExampleSpec(seed=0, steps=3))
        {'mean': 0.5}
    """
    lines = {}
    for spec in specs:
        if store.has(spec):
            key = spec_key(spec)
            entry = {
                "code": store.code,
                "key": key,
                "result": store.result(spec),
                "spec": spec_json(spec),
            }
            lines[key] = json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False)
    text = "".join(lines[key] + "\n" for key in sorted(lines))
    atomic_write_text(Path(path), text)
    return len(lines)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")  # NaN and infinities are never stored


def read_bundle(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a bundle, each checked to be a run entry.

    Raises:
        InvalidParameterError: the file cannot be read, or a line is not a JSON object with
            exactly the fields ``code``, ``key``, ``result`` and ``spec`` (the line is named).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidParameterError("path", "a readable run bundle (UTF-8 text)", path) from error
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line, parse_constant=_refuse_constant)
        except ValueError:
            entry = None
        if (
            not isinstance(entry, dict)
            or set(entry) != _FIELDS
            or not isinstance(entry["code"], str)
            or not isinstance(entry["key"], str)
            or not isinstance(entry["spec"], dict)
        ):
            raise InvalidParameterError(
                "path",
                "a run bundle: one JSON object per line with the fields code, key, result, spec",
                f"{path} (line {number})",
            )
        entries.append(entry)
    return entries


def import_runs(store: RunStore, specs: Iterable[object], path: str | Path) -> Imported:
    """Put the bundle's results of ``specs`` (at the store's code) into ``store``.

    A missing bundle imports nothing. Results the store already holds are kept as they are.

    Raises:
        InvalidParameterError: the bundle is damaged (:func:`read_bundle`), or two of its lines
            give one spec at the store's code different results; nothing is written then.
    """
    if not Path(path).exists():
        return Imported(0, 0, 0, 0)
    entries = read_bundle(path)
    asked = {spec_key(spec): spec for spec in specs}
    chosen: dict[str, Any] = {}
    other_code = unused = 0
    for entry in entries:
        spec = asked.get(entry["key"])
        if spec is None or entry["spec"] != spec_json(spec):
            unused += 1
        elif entry["code"] != store.code:
            other_code += 1
        elif entry["key"] in chosen and chosen[entry["key"]] != entry["result"]:
            raise InvalidParameterError(
                "path", "one result per spec and code", f"{path} (key {entry['key']})"
            )
        else:
            chosen[entry["key"]] = entry["result"]
    added = present = 0
    for key, result in chosen.items():
        if store.has(asked[key]):
            present += 1
        else:
            store.put(asked[key], result)
            added += 1
    return Imported(added, present, other_code, unused)
