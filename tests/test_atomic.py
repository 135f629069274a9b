"""dpcore.atomic: a reader sees the old file or the new one, and no temporary file is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dpcore.atomic import atomic_path, atomic_write_text


def test_writes_are_atomic_and_leave_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "deep" / "entry.json"
    atomic_write_text(path, "first\n")
    assert path.read_text() == "first\n" and os.listdir(path.parent) == ["entry.json"]

    def interrupted(source: str, target: str) -> None:
        raise KeyboardInterrupt  # killed between writing and replacing

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(path, "second\n")
    assert path.read_text() == "first\n" and os.listdir(path.parent) == ["entry.json"]


def test_a_failing_writer_leaves_the_target_alone(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as temporary:
        temporary.write_text("half")
        raise RuntimeError("writer failed")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["weights.pt"]


def test_two_writers_get_distinct_temporary_names(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "x") as first, atomic_path(tmp_path / "x") as second:
        assert first != second and first.parent == second.parent == tmp_path
        first.write_text("1")
        second.write_text("2")
    assert (tmp_path / "x").read_text() == "1"  # the outer block replaced last
