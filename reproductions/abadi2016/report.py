"""Rewriting a generated table between two markers of the reproduction's README."""

from __future__ import annotations

from pathlib import Path


def write_table(readme: Path, start: str, end: str, table: str) -> bool:
    """Replace the text between ``start`` and ``end`` in ``readme`` by ``table``.

    Returns False (and leaves the file alone) when the file or a marker is missing.
    """
    if not readme.is_file():
        return False
    text = readme.read_text()
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    readme.write_text(f"{head}{start}\n{table}\n{end}{tail}")
    return True
