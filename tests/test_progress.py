"""Progress bars in a log (stderr not a terminal) are plain lines, not a stream of carriage returns."""

from __future__ import annotations

from pathlib import Path

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


def test_a_bar_in_a_log_keeps_its_interval_as_its_postfix_changes(capsys: pytest.CaptureFixture) -> None:
    """A postfix set without a refresh waits for the log's interval; one that refreshes writes a line each time (the
    bench wrote a line per question and run). Every postfix quickdraft sets is of the first kind."""
    with progress.progress_bar(total=50, desc="work") as bar:
        for step in range(50):
            bar.set_postfix_str(f"step {step}", refresh=False)
            bar.update(1)
    assert len(capsys.readouterr().err.splitlines()) <= 2  # the first line and the last
    with progress.progress_bar(total=50, desc="work") as bar:
        for step in range(50):
            progress.show_postfix(bar, f"step {step}")
            bar.update(1)
    assert len(capsys.readouterr().err.splitlines()) <= 2
    sources = (Path(progress.__file__).parent).rglob("*.py")
    calls = [(path.name, line) for path in sources for line in path.read_text().splitlines() if "set_postfix" in line]
    refreshing = [
        name for name, line in calls if "refresh=False" not in line and "refresh=sys.stderr.isatty()" not in line
    ]
    assert refreshing == []


def test_a_postfix_on_a_terminal_is_drawn_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal the bar names the item it works on now, not the one before (it redrew only on the update)."""
    drawn: list[bool] = []

    class Bar:
        def set_postfix_str(self, text: str, refresh: bool) -> None:
            drawn.append(refresh)

    for on_terminal in (True, False):
        monkeypatch.setattr(progress.sys.stderr, "isatty", lambda on_terminal=on_terminal: on_terminal)
        progress.show_postfix(Bar(), "now")
    assert drawn == [True, False]


def test_a_bar_in_a_log_keeps_its_interval_as_its_total_changes(capsys: pytest.CaptureFixture) -> None:
    """A total measured again (collect's shards) is drawn at once only on a terminal: in a log a redraw wrote a line
    per shard, and the last one twice. No other module redraws a bar itself."""
    with progress.progress_bar(total=50, desc="work") as bar:
        for step in range(50):
            bar.update(1)
            bar.total = 60 - step // 10
            progress.redraw(bar)
    assert len(capsys.readouterr().err.splitlines()) <= 2  # the first line and the last
    sources = (Path(progress.__file__).parent).rglob("*.py")
    redrawing = [path.name for path in sources for line in path.read_text().splitlines() if "refresh()" in line]
    assert redrawing == ["progress.py"]


def test_a_bar_in_a_log_is_not_redrawn_sooner_by_tqdm_s_monitor() -> None:
    """tqdm's monitor thread redraws a bar that has not been drawn for its ``maxinterval`` (10 s by default): in a
    log that wrote a line every 10 s past the first 30 s, the same line twice at times."""
    with progress.progress_bar(total=2, desc="work") as bar:
        assert bar.mininterval == bar.maxinterval == progress.LOG_INTERVAL_S
