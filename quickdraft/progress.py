"""Progress bars on stderr: redrawn in place on a terminal; in a log (stderr not a terminal) one plain line at most
every ``LOG_INTERVAL_S`` and at the end, never a stream of carriage returns."""

from __future__ import annotations

import sys
from typing import Any

LOG_INTERVAL_S = 30.0


class LogLines:
    """stderr for a bar that is not on a terminal: each redraw becomes a line of its own."""

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip("\n")
        if line.strip():
            sys.stderr.write(line + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def progress_bar(iterable: Any = None, **options: Any) -> Any:
    """``tqdm(iterable, **options)`` on stderr, as the module says."""
    from tqdm import tqdm

    if sys.stderr.isatty():
        return tqdm(iterable, file=sys.stderr, **options)
    # maxinterval too: tqdm's monitor thread redraws a bar idle that long (10 s by default), a line each time here
    return tqdm(iterable, file=LogLines(), mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S, ncols=100, **options)


def show_postfix(bar: Any, text: str) -> None:
    """Says what ``bar`` works on now: redrawn at once on a terminal, so the bar never names the previous item while
    this one runs; in a log it waits for the next line, as a refresh would write a line per item."""
    bar.set_postfix_str(text, refresh=sys.stderr.isatty())


def redraw(bar: Any) -> None:
    """Shows ``bar``'s new total or state at once on a terminal; in a log it waits for the next line, as a redraw
    would write a line of its own each time."""
    if sys.stderr.isatty():
        bar.refresh()
