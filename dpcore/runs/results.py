"""Results files: ``<stem>.json`` (config, provenance, rows) and ``<stem>.csv``, written atomically.

A study's summary (the rows a figure or a table is drawn from) is saved with what produced it:
its config, the checkout's commit and the library versions (:func:`dpcore.provenance.provenance`)
and any further fields; the rows also go to a CSV for a spreadsheet. Both files are checked
before either is written and each is replaced atomically (:mod:`dpcore.atomic`).

Only the standard library is imported here (the provenance record is made when writing).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError

__all__ = ["read_results", "write_results"]


def _check_stem(stem: str) -> str:
    if (
        not isinstance(stem, str)
        or stem in ("", ".", "..")
        or "/" in stem
        or "\\" in stem
        or stem.startswith(".")
    ):
        raise InvalidParameterError("stem", "a plain file name without extension", stem)
    return stem


def write_results(
    folder: str | Path,
    stem: str,
    *,
    config: Any,
    rows: Sequence[Mapping[str, Any]],
    root: str | Path | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``folder/<stem>.json`` (config, provenance, ``extra``, rows) and ``<stem>.csv``.

    Args:
        folder: where the files go (created).
        stem: the files' name without extension.
        config: a dataclass or JSON values: what the rows were computed with.
        rows: dicts of JSON values (the CSV's columns: every key, in order of first use).
        root: the checkout whose commit the provenance records (see
            :func:`dpcore.provenance.git_commit`).
        extra: further fields, over the provenance's (``commit`` to record another commit).

    Returns:
        The JSON file's path.

    Raises:
        InvalidParameterError: ``stem`` is not a plain name, or the config, ``extra`` or rows
            are not JSON values (NaN and infinities included); nothing is written then.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> path = write_results(folder, "demo", config={"n": 1}, rows=[{"x": 1}, {"y": 2}])
        >>> read_results(folder, "demo")["rows"], path.name
        ([{'x': 1}, {'y': 2}], 'demo.json')
        >>> print((folder / "demo.csv").read_text(), end="")
        x,y
        1,
        ,2
    """
    from dpcore.provenance import provenance  # imports numpy and scipy: only when writing

    _check_stem(stem)
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    plain = dataclasses.asdict(config) if is_instance else config
    payload = {"config": plain, **provenance(root=root, **dict(extra or {})), "rows": list(rows)}
    try:
        text = json.dumps(payload, indent=1, allow_nan=False) + "\n"
    except (TypeError, ValueError):
        raise InvalidParameterError(
            "rows", "JSON values (finite floats), as are config and extra", rows
        ) from None
    table = None
    if rows:
        fields: list[str] = []
        for row in rows:
            fields += [key for key in row if key not in fields]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        table = buffer.getvalue()
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{stem}.json"
    atomic_write_text(path, text)
    if table is not None:
        atomic_write_text(target / f"{stem}.csv", table)
    return path


def read_results(folder: str | Path, stem: str) -> dict[str, Any]:
    """What :func:`write_results` wrote to ``folder/<stem>.json``.

    Raises:
        InvalidParameterError: ``stem`` is not a plain name.
        FileNotFoundError: there is no such file.
    """
    loaded: dict[str, Any] = json.loads(
        (Path(folder) / f"{_check_stem(stem)}.json").read_text(encoding="utf-8")
    )
    return loaded
