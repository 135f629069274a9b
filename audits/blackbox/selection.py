"""Auditing part of a profile: settings chosen by name, and their rows merged into saved ones.

``python -m audits --settings TEXT ...`` audits only the settings whose names contain one of the
texts; their new rows replace the saved rows of the same (setting, claim) and every other saved
row stays, stamped with the commit it was measured at. The multi-run, crafted-gradient and
one-run black-box audits share these two steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from audits import results_io
from dpcore.errors import InvalidParameterError
from dpcore.runs import RunStore, import_runs

__all__ = ["chosen", "in_profile_order", "merged", "other_commits", "previous_rows", "resume"]


def chosen(names: Sequence[str], wanted: Sequence[str] | None, profile: str) -> list[bool]:
    """For each of a profile's setting ``names``: whether one of ``wanted`` picks it
    (case-insensitive; every name when ``wanted`` is None). A text equal to a whole setting name
    picks that setting alone (``CNN: full batch, every step`` is part of ``Opacus CNN: full
    batch, every step`` too); any other text picks every name that contains it.

    Raises:
        InvalidParameterError: an entry of ``wanted`` matches no name (the message lists the
            profile's setting names).
    """
    if wanted is None:
        return [True] * len(names)
    lowered = [name.lower() for name in names]
    picked = [False] * len(names)
    for text in wanted:
        key = text.lower()
        hits = [i for i, name in enumerate(lowered) if name == key] or [
            i for i, name in enumerate(lowered) if key in name
        ]
        if not hits:
            raise InvalidParameterError(
                "setting_names",
                f"parts of the {profile!r} profile's setting names {list(names)}",
                text,
            )
        for i in hits:
            picked[i] = True
    return picked


def merged(
    saved: list[dict[str, Any]],
    meta: dict[str, Any] | None,
    new: list[dict[str, Any]],
    key: tuple[str, ...] = ("setting_name", "epsilon"),
) -> list[dict[str, Any]]:
    """``new`` rows in place of the saved rows of the same ``key`` (setting and claim); every
    other saved row is kept, stamped with the commit and date of the file it came from when it
    has none (so a table assembled over several commits says which row was measured where)."""
    fresh = {tuple(row[k] for k in key) for row in new}
    stamp = {"commit": (meta or {}).get("commit"), "created": (meta or {}).get("created")}
    kept = [{**stamp, **row} for row in saved if tuple(row[k] for k in key) not in fresh]
    return kept + new


def other_commits(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """Lines naming the rows measured at another commit than the file's last write (a table
    assembled setting by setting, ``--settings``), with their commit and date; a setting whose
    rows come from several commits names the claims of each."""
    commits: dict[str, set[str]] = {}
    others: dict[tuple[str, str], dict[str, list[float]]] = {}
    for row in rows:
        commit = str(row.get("commit", meta.get("commit")))
        commits.setdefault(row["setting_name"], set()).add(commit)
        if commit != str(meta.get("commit")):
            found = others.setdefault((commit, str(row.get("created"))[:10]), {})
            claims = found.setdefault(row["setting_name"], [])
            if row["epsilon"] not in claims:
                claims.append(row["epsilon"])

    def named(setting: str, claims: list[float]) -> str:
        if len(commits[setting]) == 1:
            return setting
        return f"{setting} at ε = {', '.join(f'{e:g}' for e in claims)}"

    return [
        f"Rows of {'; '.join(named(n, c) for n, c in found.items())}: commit `{commit}`, "
        f"created {created}."
        for (commit, created), found in others.items()
    ]


def previous_rows(
    stem: str, setting_names: Sequence[str] | None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``(rows, meta)`` saved as ``results/<stem>.json``: the rows only when settings are chosen
    (the others are kept beside the new ones), else none (the profile's rows replace them)."""
    meta = results_io.load_meta(stem)
    if setting_names is None or not (results_io.RESULTS / f"{stem}.json").exists():
        return [], meta
    return results_io.load(stem), meta


def resume(store: RunStore, specs: Sequence[Any], checkpoint: str | Path, progress: bool) -> None:
    """Put the finished runs of ``specs`` kept in the run bundle ``checkpoint`` into ``store``
    (:func:`dpcore.runs.import_runs`: the whole file is validated first) and say how many."""
    imported = import_runs(store, specs, checkpoint)
    if progress and (imported.added or imported.other_code):
        other = f", {imported.other_code} of other code not used" if imported.other_code else ""
        print(f"{checkpoint}: {imported.added} finished runs resumed{other}", flush=True)


def in_profile_order(rows: list[dict[str, Any]], settings: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` sorted by their setting's place in ``settings`` (the profile's setting names;
    rows of other settings last), then by claim, then by seed where rows have one."""
    place = {name: index for index, name in enumerate(settings)}
    return sorted(
        rows,
        key=lambda row: (
            place.get(row["setting_name"], len(place)),
            row["epsilon"],
            row.get("seed", 0),
        ),
    )
