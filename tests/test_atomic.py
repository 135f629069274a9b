"""dpcore.atomic: a reader sees the old file or the new one, and no temporary file is left."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dpcore.atomic import atomic_path, atomic_write_text, temporary_prefix


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


def test_item7_temporary_names_identify_their_writer(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "run.json") as temporary:
        assert temporary.name.startswith(temporary_prefix(tmp_path / "run.json"))
        assert temporary.name.startswith(f".run.json.{os.getpid()}-")
        assert temporary.name.endswith(".part")
        temporary.write_text("x")


def test_item7_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(
    tmp_path: Path,
) -> None:
    """A SIGKILLed writer leaves its temporary; the next write to that target removes it, and
    never a temporary of a live writer, of another target, or of another machine."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        target = tmp_path / "statement.json"
        dead = tmp_path / f"{temporary_prefix(target, killed.pid)}k1lled.part"
        live = tmp_path / f"{temporary_prefix(target, alive.pid)}w0rking.part"
        mine = tmp_path / f"{temporary_prefix(target)}m1ne.part"
        other_target = tmp_path / f"{temporary_prefix(tmp_path / 'other.json', killed.pid)}x.part"
        other_host = tmp_path / f".statement.json.{killed.pid}-zzzzzzzz.y.part"
        for path in (dead, live, mine, other_target, other_host):
            path.write_text("half")
        atomic_write_text(target, "{}\n")
        left = sorted(p.name for p in tmp_path.iterdir())
        assert dead.name not in left
        assert (
            sorted([live.name, mine.name, other_target.name, other_host.name, target.name]) == left
        )
    finally:
        alive.kill()
        alive.wait()


def test_item7_statements_accountant_saves_and_audit_results_are_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of dpcore's writers goes through dpcore.atomic: killed before the rename, the old
    file is intact and no temporary is left behind."""
    from audits import results_io
    from dpcore.accountants import accountant_class
    from dpcore.events import GaussianEvent
    from dpcore.ledger import write_statement

    monkeypatch.setattr(results_io, "RESULTS", tmp_path / "audits")
    accountant = accountant_class("rdp")().compose(GaussianEvent(1.0))
    writers = {
        tmp_path / "statement.json": lambda path: write_statement(path, {"epsilon": 2.0}),
        tmp_path / "rdp.json": accountant.save,
        tmp_path / "audits" / "x.json": lambda path: results_io.save("x", [{"a": 1}], {}),
    }
    for path, write in writers.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text("old\n")

        def interrupted(source: str, target: str) -> None:
            raise KeyboardInterrupt

        with monkeypatch.context() as patch:
            patch.setattr(os, "replace", interrupted)
            with pytest.raises(KeyboardInterrupt):
                write(path)
        assert path.read_text() == "old\n"
        assert not [p for p in path.parent.iterdir() if p.name.endswith(".part")]
        write(path)
        assert path.read_text() != "old\n"


def test_a_new_file_gets_the_umask_s_permissions_and_a_rewrite_keeps_its_own(
    tmp_path: Path,
) -> None:
    """The temporary file is private (mkstemp's 0600); the result is not: a new file is as a
    plain ``open()`` would make it, a replaced file keeps the permissions it had."""
    previous = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.json", "{}")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "private.json", "{}")
        assert stat.S_IMODE((tmp_path / "private.json").stat().st_mode) == 0o600
        os.chmod(tmp_path / "new.json", 0o640)
        atomic_write_text(tmp_path / "new.json", "[]")
        assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640
    finally:
        os.umask(previous)
