"""dpcore.runs.markers: only the text between the markers changes, atomically; nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpcore.errors import InvalidParameterError
from dpcore.runs.markers import write_between_markers

START, END = "<!-- t:start -->", "<!-- t:end -->"


def test_only_the_text_between_the_markers_is_replaced(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{START}\nold\n{END}\ntail {START}\n")
    assert write_between_markers(readme, START, END, "| a |\n| 1 |")
    assert readme.read_text() == f"head\n{START}\n| a |\n| 1 |\n{END}\ntail {START}\n"
    assert write_between_markers(readme, START, END, "| a |\n| 1 |")  # idempotent
    assert readme.read_text() == f"head\n{START}\n| a |\n| 1 |\n{END}\ntail {START}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary left behind


@pytest.mark.parametrize("text", ["no markers\n", f"{END}\n{START}\n", f"{START} only\n"])
def test_a_missing_or_misordered_marker_leaves_the_file_alone(tmp_path: Path, text: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert not write_between_markers(readme, START, END, "new")
    assert readme.read_text() == text
    assert not write_between_markers(tmp_path / "absent.md", START, END, "new")
    assert not (tmp_path / "absent.md").exists()


@pytest.mark.parametrize(("start", "end"), [("", END), (START, ""), (START, START)])
def test_empty_or_equal_markers_are_refused_by_name(tmp_path: Path, start: str, end: str) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\nold\n{END}\n")
    with pytest.raises(InvalidParameterError, match=r"start|end"):
        write_between_markers(readme, start, end, "new")
    assert readme.read_text() == f"{START}\nold\n{END}\n"
