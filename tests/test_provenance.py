"""dpcore.provenance: the commit a result names, and what counts as a changed checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dpcore.provenance import git_commit, provenance


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=True
    ).stdout.strip()


def _repository(root: Path) -> str:
    _git(root, "init", "-q")
    (root / "code.py").write_text("x = 1\n")
    (root / "results").mkdir()
    (root / "results" / "table.json").write_text("[]\n")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return _git(root, "rev-parse", "HEAD")


def test_a_changed_tracked_file_marks_the_commit_dirty_unless_its_path_is_ignored(
    tmp_path: Path,
) -> None:
    head = _repository(tmp_path)
    assert git_commit(tmp_path) == head
    (tmp_path / "results" / "table.json").write_text("[1]\n")  # a results file rewritten
    assert git_commit(tmp_path) == f"{head}-dirty"
    assert git_commit(tmp_path, ignore=["results"]) == head
    assert provenance(root=tmp_path, ignore=["results"])["commit"] == head
    (tmp_path / "code.py").write_text("x = 2\n")  # code changed: dirty whatever is ignored
    assert git_commit(tmp_path, ignore=["results"]) == f"{head}-dirty"


def test_the_ignored_paths_are_relative_to_the_checkouts_root(tmp_path: Path) -> None:
    head = _repository(tmp_path)
    (tmp_path / "results" / "table.json").write_text("[1]\n")
    assert git_commit(tmp_path / "results", ignore=["results"]) == head
    assert git_commit(tmp_path / "results") == f"{head}-dirty"


def test_outside_a_checkout_the_declared_commit_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPCORE_COMMIT", "abc")
    assert git_commit(tmp_path) == "abc-copy"
    monkeypatch.delenv("DPCORE_COMMIT")
    assert git_commit(tmp_path) == "unknown"
