"""Progress bars in a log (stderr not a terminal) are plain lines, not a stream of carriage returns."""

from __future__ import annotations

import pytest

import quickdraft.progress as progress


def test_a_bar_in_a_log_writes_whole_lines(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)
    assert list(progress.progress_bar(range(3), desc="work")) == [0, 1, 2]
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and lines and all(line.startswith("work:") for line in lines)
    assert "3/3" in lines[-1]


def test_a_bar_that_is_off_writes_nothing(capsys: pytest.CaptureFixture) -> None:
    with progress.progress_bar(total=2, desc="work", disable=True) as bar:
        bar.update(2)
    assert capsys.readouterr().err == ""
