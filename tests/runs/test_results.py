"""dpcore.runs.results: config, provenance and rows in one JSON beside a CSV; nothing is written
when any of it is not JSON."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs.results import read_results, write_results


@dataclasses.dataclass(frozen=True)
class Config:
    seeds: tuple[int, ...] = (0, 1)
    lot: int = 256


def test_results_carry_config_provenance_extra_and_rows(tmp_path: Path) -> None:
    rows = [{"seed": 0, "accuracy": 0.5}, {"seed": 1, "accuracy": 0.75, "note": "late"}]
    path = write_results(
        tmp_path / "out", "study", config=Config(), rows=rows, extra={"commit": "abc", "n": 2}
    )
    saved = read_results(tmp_path / "out", "study")
    assert path == tmp_path / "out" / "study.json"
    assert saved["config"] == {"seeds": [0, 1], "lot": 256} and saved["rows"] == rows
    assert saved["commit"] == "abc" and saved["n"] == 2 and "dpcore" in saved
    keys = list(saved)
    assert keys[0] == "config" and keys[-1] == "rows"
    csv_text = (tmp_path / "out" / "study.csv").read_text()
    assert csv_text == "seed,accuracy,note\n0,0.5,\n1,0.75,late\n"


@pytest.mark.parametrize(
    ("stem", "rows", "name"),
    [
        ("study", [{"accuracy": math.nan}], "rows"),
        ("study", [{"accuracy": object()}], "rows"),
        ("../study", [{"accuracy": 0.5}], "stem"),
        ("", [{"accuracy": 0.5}], "stem"),
    ],
)
def test_nothing_is_written_for_a_bad_stem_or_rows(
    tmp_path: Path, stem: str, rows: list[dict], name: str
) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        write_results(tmp_path / "out", stem, config={}, rows=rows)
    assert not (tmp_path / "out").exists()
