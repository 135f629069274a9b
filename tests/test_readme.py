"""The README's runnable examples run as pasted (each marked ``<!-- example: NAME -->``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = dict(
    re.findall(r"<!-- example: ([\w-]+) -->\n```python\n(.*?)```", README.read_text(), re.S)
)


def test_the_examples_are_found() -> None:
    assert set(EXAMPLES) == {"own-loop", "from-opacus", "audit-own-loop"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_as_pasted(name: str, tmp_path: Path) -> None:
    here = Path.cwd()
    os.chdir(tmp_path)  # examples may write files (privacy.json)
    try:
        exec(compile(EXAMPLES[name], f"README example {name}", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(here)
