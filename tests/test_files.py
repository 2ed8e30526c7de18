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


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_a_file_written_atomically_has_the_mode_open_gives(tmp_path: Path, umask: int) -> None:
    """Readable by the group and others as far as the umask allows, as a file open() makes; mkstemp's are 0600."""
    import os

    from quickdraft.files import write_atomically

    previous = os.umask(umask)
    try:
        write_atomically(tmp_path / "head.json", "{}")
        (tmp_path / "opened.json").write_text("{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "head.json").stat().st_mode == (tmp_path / "opened.json").stat().st_mode
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
