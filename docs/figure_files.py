"""The committed figures on the docs site, taken from ``figures/`` at every build.

MkDocs runs this file as a hook (``hooks:`` in mkdocs.yml): every PNG or SVG under ``figures/``
that git tracks becomes a file of the site at the same path (``figures/NAME.png``), so a page
shows the figure as committed, never a copy kept under docs/. Untracked files (a local run's
output) are left out, as for the benchmark tables.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
FIGURES = "figures"
SUFFIXES = (".png", ".svg")


def committed_figures() -> list[str]:
    """The repository paths of the figures git tracks (``figures/NAME.png``), sorted.

    Raises:
        PluginError: git cannot list the files, or lists none (the site needs its figures).
    """
    listed = subprocess.run(
        ["git", "ls-files", "--", FIGURES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise PluginError(f"git ls-files {FIGURES} failed: {listed.stderr.strip()}")
    paths = sorted(
        line
        for line in listed.stdout.splitlines()
        if line.endswith(SUFFIXES) and (ROOT / line).is_file()
    )
    if not paths:
        raise PluginError(f"No committed figure under {FIGURES}/.")
    return paths


def on_files(files: Files, *, config: MkDocsConfig, **_: Any) -> Files:
    """MkDocs hook: add each committed figure to the site at its repository path."""
    for path in committed_figures():
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files
