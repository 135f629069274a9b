"""Generated tables in hand-written files: the text between two marker lines, replaced atomically.

A README keeps a results table between an opening and a closing marker (HTML comments such as
``<!-- table:start -->``); :func:`write_between_markers` replaces what lies between them and
leaves the rest of the file as it was. Benchmarks, reproductions and audits all write their
tables this way.
"""

from __future__ import annotations

from pathlib import Path

from dpcore.atomic import atomic_write_text
from dpcore.errors import InvalidParameterError

__all__ = ["write_between_markers"]


def write_between_markers(readme: str | Path, start: str, end: str, table: str) -> bool:
    """Replace the text between the ``start`` and ``end`` markers of ``readme`` by ``table``.

    The file is replaced atomically (:mod:`dpcore.atomic`): a reader sees the old text or the
    new one, never half of it.

    Args:
        readme: the file holding the markers.
        start: the opening marker (its first occurrence is used).
        end: the closing marker (its first occurrence after ``start``).
        table: the new text between them (a newline is kept on each side).

    Returns:
        True when the file was rewritten; False (the file left alone) when the file, either
        marker, or ``end`` after ``start`` is missing.

    Raises:
        InvalidParameterError: a marker is empty, or ``start`` equals ``end``.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "README.md"
        >>> _ = path.write_text("intro\\n<!-- a -->\\nold\\n<!-- b -->\\nrest\\n")
        >>> write_between_markers(path, "<!-- a -->", "<!-- b -->", "new")
        True
        >>> print(path.read_text(), end="")
        intro
        <!-- a -->
        new
        <!-- b -->
        rest
        >>> write_between_markers(path, "<!-- c -->", "<!-- b -->", "new")
        False
    """
    for name, marker in (("start", start), ("end", end)):
        if not isinstance(marker, str) or not marker:
            raise InvalidParameterError(name, "a non-empty marker string", marker)
    if start == end:
        raise InvalidParameterError("end", "a marker other than start", end)
    path = Path(readme)
    if not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        return False
    tail = rest.split(end, 1)[1]
    atomic_write_text(path, f"{head}{start}\n{table}\n{end}{tail}")
    return True
