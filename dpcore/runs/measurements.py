"""Cached measurements on disk, keyed by everything that determines them, written atomically.

A long run (a full reproduction profile) keeps each finished measurement in a JSON file so that a
run cut off part-way resumes where it stopped. A cached value is only as good as the setup it was
measured under, so each is stored with its *key*: a JSON object holding everything that determines
it (the cell, its full configuration, the device, library versions, a fingerprint of the code
that measures). :func:`load` returns a value only when the stored key equals the key asked for;
an older file, a file of another setup or a damaged file is ignored, never reused. The file name
carries a digest of the key (:func:`cached_path`), so the entries of different setups sit side by
side.

Writes are atomic (:mod:`dpcore.atomic`): a reader sees the old file or the new one, never
half of one, even when a run is killed mid-write. This module imports neither torch nor
TensorFlow.

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> key = {"cell": "nonprivate", "lot_size": 256}
    >>> path = cached_path(folder, "nonprivate", key)
    >>> store(path, key, {"step_seconds": 0.5})
    >>> load(path, key), load(path, {**key, "lot_size": 512})
    ({'step_seconds': 0.5}, None)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpcore.atomic import atomic_write_text

__all__ = ["cached_path", "digest", "load", "store"]


def _canonical(key: Mapping[str, Any]) -> Any:
    """``key`` as it reads back from JSON (tuples become lists), for comparing keys."""
    return json.loads(json.dumps(key, sort_keys=True))


def digest(key: Mapping[str, Any]) -> str:
    """A short sha256 of ``key`` as canonical JSON (sorted keys).

    Example:
        >>> digest({"a": 1, "b": (2, 3)}) == digest({"b": [2, 3], "a": 1})
        True
    """
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_path(directory: Path, stem: str, key: Mapping[str, Any]) -> Path:
    """``directory/<stem>_<digest of key>.json``: where the value of ``key`` is kept."""
    return directory / f"{stem}_{digest(key)}.json"


def store(path: Path, key: Mapping[str, Any], value: Mapping[str, Any]) -> None:
    """Keep ``value`` at ``path`` with its ``key`` (``{"key": ..., "value": ...}``, atomically)."""
    payload = {"key": dict(key), "value": dict(value)}
    atomic_write_text(path, json.dumps(payload, sort_keys=True) + "\n")


def load(path: Path, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The value kept at ``path`` if it was stored with exactly ``key``; else None.

    None too when the file is missing, unreadable, not in :func:`store`'s format (e.g. written
    by an older version) or stored under another key: such a file is ignored, not reused.
    """
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("value"), dict):
        return None
    if payload.get("key") != _canonical(key):
        return None
    return dict(payload["value"])
