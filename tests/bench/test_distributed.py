"""The distributed benchmark runs 1, 2 and 4 gloo processes and writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

from bench import distributed


def test_quick_profile_times_every_world_size(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    rows = distributed.run(results, quick=True)
    assert [row["world_size"] for row in rows] == list(distributed.WORLD_SIZES)
    for row in rows:
        assert row["step_s"] > 0 and row["allreduce_share"] > 0
    assert rows[0]["step_time_vs_one_process"] == 1.0
    saved = json.loads((results / "distributed.json").read_text())
    assert saved["rows"] == rows and saved["steps"] == 5
