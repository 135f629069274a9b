"""Test helper: make a saved results file look as if an earlier commit had written it."""

from __future__ import annotations

import json
from pathlib import Path


def as_if_written_at(results: Path, stem: str, commit: str) -> None:
    """Rewrite ``results/<stem>.meta.json`` to name ``commit`` and drop the rows' own commit
    and date, as code that did not stamp rows wrote them."""
    meta_path = results / f"{stem}.meta.json"
    meta = json.loads(meta_path.read_text())
    meta["commit"] = commit
    meta_path.write_text(json.dumps(meta))
    rows_path = results / f"{stem}.json"
    rows = json.loads(rows_path.read_text())
    unstamped = [{k: v for k, v in row.items() if k not in ("commit", "created")} for row in rows]
    rows_path.write_text(json.dumps(unstamped))
