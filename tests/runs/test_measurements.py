"""dpcore.runs.measurements: a value is reused only under exactly its key; writes are atomic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpcore.runs import measurements as cache

KEY = {"cell": {"method": "dpsgd_jl", "r": 5}, "lot_size": 256, "dims": (1, 5), "code": "abc"}


def test_a_value_is_reused_under_its_own_key_only(tmp_path: Path) -> None:
    path = cache.cached_path(tmp_path, "dpsgd_jl_5", KEY)
    assert path.parent == tmp_path and path.name.startswith("dpsgd_jl_5_")
    assert cache.load(path, KEY) is None  # nothing stored yet
    cache.store(path, KEY, {"step_seconds": 0.5})
    assert cache.load(path, KEY) == {"step_seconds": 0.5}  # tuples in the key compare as lists
    for changed in ({"lot_size": 512}, {"code": "def"}, {"extra": 1}):
        other = {**KEY, **changed}
        assert cache.load(path, other) is None
        assert cache.cached_path(tmp_path, "dpsgd_jl_5", other) != path


@pytest.mark.parametrize(
    "text",
    [
        '{"step_seconds": 0.5}',  # an older file: no key
        '{"key": {}, "value": {"step_seconds": 0.5}}',
        '{"key": ',  # cut off
        "[1, 2]",
    ],
)
def test_files_of_another_format_or_key_are_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "entry.json"
    path.write_text(text)
    assert cache.load(path, KEY) is None


def test_store_writes_key_and_value(tmp_path: Path) -> None:
    path = tmp_path / "entry.json"
    cache.store(path, KEY, {"peak_rss_mb": 100.0})
    assert json.loads(path.read_text()) == {
        "key": json.loads(json.dumps(KEY)),
        "value": {"peak_rss_mb": 100.0},
    }
