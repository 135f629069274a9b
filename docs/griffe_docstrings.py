"""A griffe extension for the API pages: dpcore's docstrings, as mkdocstrings should read them.

Two rewrites of the loaded copy of each docstring (the sources are not changed), made by
mkdocstrings through this extension (``extensions:`` in mkdocs.yml):

* dpcore titles its doctests ``Example:``; the Google-style parser reads the plural
  ``Examples:`` as an examples section (each ``>>>`` block a Python code block) and the singular
  as an admonition of plain prose, where a doctest's brackets read as Markdown links;
* Sphinx roles (``:class:`~dpcore.x.Y```, ``:func:`f```, ``:mod:`m```, ...) become optional
  cross-references: a link where the target is documented on some page, else the name as code.

And one addition to the loaded modules: names in ``__all__`` bound by unpacking a tuple at module
level (``PAD, OOV = 0, 1``), which griffe does not record, are added as attributes.
"""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path
from typing import Any

import griffe

EXAMPLE_TITLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data):`(~?)([A-Za-z_][\w.]*)(\(\))?`")


def examples_titled(docstring: str) -> str:
    """``docstring`` with each line ``Example:`` (alone, any indent) made ``Examples:``.

    Args:
        docstring: a docstring's text.
    """
    return EXAMPLE_TITLE.sub(r"\1Examples:", docstring)


def _lookup(scope: griffe.Object | griffe.Alias, dotted: str) -> str | None:
    """The path of ``dotted`` looked up as members from ``scope``, or None."""
    found: Any = scope
    for part in dotted.split("."):
        try:
            members = found.members
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
        if part not in members:
            return None
        found = members[part]
    return str(found.path)


def resolve(obj: griffe.Object, target: str) -> str:
    """The identifier a role's target names, seen from ``obj``'s docstring.

    A target starting with ``dpcore`` is taken as it is; another is looked up as Sphinx does,
    from the object itself (a class) outwards to its module; unfound, it is read from the module.

    Args:
        obj: the object whose docstring holds the role.
        target: the role's target, without ``~`` and ``()``.
    """
    if target.split(".")[0] == "dpcore":
        return target
    scope: griffe.Object | None = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        path = _lookup(scope, target)
        if path is not None:
            return path
        scope = None if scope.is_module else scope.parent
    return f"{obj.module.path}.{target}"


def roles_linked(obj: griffe.Object, docstring: str) -> str:
    """``docstring`` with each Sphinx role made an optional cross-reference (HTML for autorefs).

    Args:
        obj: the object whose docstring it is (for targets relative to it).
        docstring: its text.
    """

    def link(match: re.Match[str]) -> str:
        short, target, call = match.group(1), match.group(2), match.group(3) or ""
        title = (target.rsplit(".", 1)[-1] if short else target) + call
        identifier = html.escape(resolve(obj, target), quote=True)
        code = f"<code>{html.escape(title)}</code>"
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    return ROLE.sub(link, docstring)


def add_unpacked_exports(module: griffe.Module) -> list[str]:
    """Add the exported names that ``module`` binds by tuple unpacking; return them.

    Args:
        module: a loaded module (read from its source file).
    """
    if not isinstance(module.filepath, Path) or not module.exports:
        return []
    exported = {str(name) for name in module.exports}
    added = []
    for node in ast.parse(module.filepath.read_text()).body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Tuple)
            and len(node.targets[0].elts) == len(node.value.elts)
        ):
            continue
        for target, value in zip(node.targets[0].elts, node.value.elts, strict=True):
            name = target.id if isinstance(target, ast.Name) else None
            if name in exported and name not in module.members:
                assert name is not None
                attribute = griffe.Attribute(
                    name, lineno=node.lineno, endlineno=node.end_lineno, value=ast.unparse(value)
                )
                attribute.labels.add("module-attribute")
                module.set_member(name, attribute)
                added.append(name)
    return added


class DpcoreDocstrings(griffe.Extension):
    """Makes ``Example:`` sections examples and Sphinx roles cross-references."""

    def on_object(self, *, obj: griffe.Object, **_: Any) -> None:
        """Rewrite one object's docstring (run once the object tree is complete)."""
        if isinstance(obj, griffe.Module):
            add_unpacked_exports(obj)
        if obj.docstring is not None:
            obj.docstring.value = roles_linked(obj, examples_titled(obj.docstring.value))
