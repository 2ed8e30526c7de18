"""Cache files: one process prepares a file at a time, and one that waits says so; files written atomically."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from quickdraft.files import exclusive_lock, lock_file


def test_a_process_that_waits_for_the_lock_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    lock, held = lock_file(tmp_path / "model"), threading.Event()

    def hold() -> None:
        with exclusive_lock(lock):
            held.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    with exclusive_lock(lock):  # an open file description of its own: it waits as another process would
        pass
    holder.join()
    assert "quickdraft: waiting for another quickdraft process (model)" in capsys.readouterr().err
    with exclusive_lock(lock):  # free: no note
        pass
    assert capsys.readouterr().err == ""


def test_a_file_written_atomically_has_the_mode_open_gives(tmp_path: Path) -> None:
    """Readable by the group and others where the umask allows, as open() makes a file; mkstemp's are 0600."""
    from quickdraft.files import process_umask, write_atomically

    write_atomically(tmp_path / "head.json", "{}")
    assert (tmp_path / "head.json").stat().st_mode & 0o777 == 0o666 & ~process_umask()
