"""Benchmark tables for the docs site, rendered from the committed ``bench/results`` JSON files.

MkDocs runs this file as a hook (``hooks:`` in mkdocs.yml) on every build: in a page holding the
line ``<!-- bench-tables -->`` it puts one section per committed result file
(``bench/results/NAME.json`` and its ``NAME.meta.json``), so the page always shows the files as
they are in the repository, never a copy. ``bench/results/`` is git-ignored (``nox -s bench``
writes there); only the files added to git on purpose are rendered.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results"
MARKER = "<!-- bench-tables -->"

#: The columns shown for each benchmark, in order (others: every column with a scalar value).
COLUMNS: dict[str, tuple[str, ...]] = {
    "training": (
        "model",
        "method",
        "variant",
        "jl_dimension",
        "batch_size",
        "step_seconds",
        "ratio_to_nonprivate",
        "goal_ratio",
        "goal_met",
        "peak_rss_mb",
        "peak_gpu_mb",
        "error",
    ),
    "tf_training": (
        "model",
        "method",
        "variant",
        "jl_dimension",
        "batch_size",
        "clipping",
        "step_seconds",
        "ratio_to_nonprivate",
        "peer_method",
        "ratio_to_peer",
        "peak_rss_mb",
        "error",
    ),
    "training_memory": (
        "model",
        "method",
        "jl_dimension",
        "batch_size",
        "peak_rss_mb",
        "exceeded_cap",
        "step_seconds",
        "skipped",
        "error",
    ),
}

#: Facts of a ``*.meta.json`` shown above its table, in this order, when present.
META_FACTS = (
    "commit",
    "created",
    "quick",
    "device",
    "hardware",
    "threads",
    "cpu_count",
    "torch",
    "tensorflow",
    "keras",
    "opacus",
    "cells_measured",
    "cells_total",
    "wall_seconds",
)


def committed_results(root: Path = ROOT) -> list[str]:
    """The names of the benchmark result files in git under ``bench/results`` (sorted).

    A name ``NAME`` stands for ``bench/results/NAME.json`` (its ``NAME.meta.json`` is read
    beside it). Files there that git does not track (a local ``nox -s bench`` run) are left out.

    Args:
        root: the repository root.

    Raises:
        RuntimeError: when ``git ls-files`` fails (the docs are built from a git checkout).
    """
    completed = subprocess.run(
        ["git", "ls-files", "--", f"{RESULTS}/*.json"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(
            f"git ls-files failed in {root}: the benchmark page is built from a git checkout "
            f"({completed.stderr.strip()})"
        )
    names = {
        Path(line).name.removesuffix(".json")
        for line in completed.stdout.splitlines()
        if not line.endswith(".meta.json")
    }
    return sorted(names)


def cell(value: Any) -> str:
    """One table cell: 4 significant digits for floats, ``—`` for null, ``|`` escaped.

    Args:
        value: a JSON value.
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        value = json.dumps(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (dicts), one column per key.

    Args:
        rows: the rows; keys missing from a row read as null.
        columns: the columns to show, in order; by default every key whose values are scalars, in
            the order first seen. Columns null in every row are dropped either way.

    Raises:
        ValueError: when ``rows`` is empty or a row is not a dict.
    """
    if not rows or not all(isinstance(row, Mapping) for row in rows):
        raise ValueError(f"Expected a non-empty list of JSON objects, got {rows!r:.200}.")
    if columns is None:
        seen: dict[str, None] = {}
        for row in rows:
            for key, value in row.items():
                if not isinstance(value, list | dict):
                    seen.setdefault(key, None)
        columns = list(seen)
    shown = [c for c in columns if any(row.get(c) is not None for row in rows)]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in shown) + " |" for row in rows]
    return "\n".join(lines)


def _meta_facts(meta: Mapping[str, Any]) -> str:
    facts = []
    for key in META_FACTS:
        value = meta.get(key)
        if value is None:
            continue
        if key == "quick":
            facts.append(f"profile: {'quick' if value else 'full'}")
        else:
            facts.append(f"{key}: {cell(value)}")
    return "; ".join(facts)


def section(name: str, root: Path = ROOT) -> str:
    """The Markdown section of one benchmark: its facts, its rows, its notes and summaries.

    Args:
        name: the benchmark (``bench/results/NAME.json``).
        root: the repository root.

    Raises:
        FileNotFoundError: when ``NAME.json`` is missing.
        ValueError: when it holds neither a list of rows nor an object with ``rows``.
    """
    path = root / RESULTS / f"{name}.json"
    data = json.loads(path.read_text())
    meta_path = root / RESULTS / f"{name}.meta.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    extra: dict[str, Any] = {}
    if isinstance(data, Mapping) and isinstance(data.get("rows"), list):
        extra = {k: v for k, v in data.items() if k != "rows" and not isinstance(v, list | dict)}
        data = data["rows"]
    if not isinstance(data, list):
        raise ValueError(f"Expected a list of rows (or an object with 'rows') in {path}.")
    parts = [
        f"## `{name}`",
        f"From `{RESULTS}/{name}.json`" + (" and its meta file." if meta else "."),
    ]
    facts = "; ".join(f"{key}: {cell(value)}" for key, value in extra.items())
    facts = "; ".join(part for part in (_meta_facts(meta), facts) if part)
    if facts:
        parts.append(facts + ".")
    parts.append(table(data, COLUMNS.get(name)))
    for key, value in meta.items():
        if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            parts += [f"`{key}`:", table(value)]
    notes = meta.get("notes")
    if isinstance(notes, list) and notes:
        parts.append("\n".join(f"- {cell(note)}" for note in notes))
    return "\n\n".join(parts)


def bench_markdown(root: Path = ROOT) -> str:
    """Every committed benchmark's section, or a line saying none is committed.

    Args:
        root: the repository root.
    """
    names = committed_results(root)
    if not names:
        return f"No benchmark results are committed under `{RESULTS}/`."
    return "\n\n".join(section(name, root) for name in names)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: replace the marker line by the benchmark sections (other pages unchanged)."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, bench_markdown())
