"""README sections on the docs site, read from ``README.md`` at every build.

MkDocs runs this file as a hook (``hooks:`` in mkdocs.yml). A page line
``<!-- readme: NAME -->`` is replaced by the README's text between the lines
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, so the page always shows the README's current
text, never a copy. A missing or unbalanced marker fails the build (no page shows a stale or
empty section).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: A page's request for a README section: the whole line, the section's name in group 1.
REQUEST = re.compile(r"^<!-- readme: ([a-z0-9-]+) -->[ \t]*$", re.MULTILINE)


def section(readme: str, name: str) -> str:
    """The README text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` (stripped).

    Args:
        readme: the README's text.
        name: the section's name, as in its markers.

    Raises:
        PluginError: the start or end marker is missing, given more than once, or out of order,
            or the section is empty.
    """
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    counts = {marker: readme.count(marker) for marker in (start, end)}
    if any(count != 1 for count in counts.values()):
        raise PluginError(f"README.md must hold {start} and {end} once each; found {counts}.")
    begin, finish = readme.index(start) + len(start), readme.index(end)
    if finish < begin:
        raise PluginError(f"README.md: {end} comes before {start}.")
    text = readme[begin:finish].strip()
    if not text:
        raise PluginError(f"README.md: the section {name!r} is empty.")
    return text


def include_sections(markdown: str, readme: str) -> str:
    """``markdown`` with each ``<!-- readme: NAME -->`` line replaced by that README section.

    Raises:
        PluginError: as :func:`section`, for any requested section.
    """
    return REQUEST.sub(lambda match: section(readme, match.group(1)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: fill in the requested README sections (pages without a request unchanged)."""
    if REQUEST.search(markdown) is None:
        return markdown
    return include_sections(markdown, README.read_text(encoding="utf-8"))
