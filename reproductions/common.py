"""Helpers shared by the reproductions: JSON-safe numbers, code fingerprints, profiles.

Results are saved and read through :class:`reproductions.harness.output.Output`; README tables
are written by :func:`dpcore.runs.markers.write_between_markers`.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from dpcore.errors import InvalidParameterError

C = TypeVar("C")


def finite_or_none(value: float) -> float | None:
    """JSON has no infinity: an infinite epsilon is saved as null (plotted as missing)."""
    return None if value == float("inf") else float(value)


def code_fingerprint(*modules: str) -> str:
    """A short sha256 of the source of ``modules`` (a package counts all its ``.py`` files).

    Cached results store it, so a change to the code that computed them (say a fix in an
    accountant) invalidates the cache instead of silently reusing stale numbers.

    Example:
        >>> first = code_fingerprint("dpcore.pld", "dpcore.accountants.jl")
        >>> len(first), first == code_fingerprint("dpcore.pld", "dpcore.accountants.jl")
        (16, True)
    """
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"module {name!r} was not found")
        if spec.submodule_search_locations:
            files = sorted(Path(spec.origin).parent.rglob("*.py"))
        else:
            files = [Path(spec.origin)]
        for path in files:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def profile_config(profiles: Mapping[str, C], profile: str, config: C | None = None) -> C:
    """``config`` when given, else the profile's from ``profiles``.

    Raises:
        InvalidParameterError: ``profile`` is not one of ``profiles``.

    Example:
        >>> profile_config({"quick": 1, "full": 2}, "full"), profile_config({"quick": 1}, "x", 3)
        (2, 3)
    """
    if config is not None:
        return config
    if profile not in profiles:
        raise InvalidParameterError("profile", f"in {sorted(profiles)}", profile)
    return profiles[profile]
