"""The engine's steps in one background thread; other threads submit, cancel and hear back through sinks."""

from __future__ import annotations

import logging
import threading

from quickdraft.engine import Engine, Request, RequestFailed, Sink

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5  # how long an idle loop sleeps before it looks again (a submit wakes it at once)


class ServingLoop:
    """Runs :meth:`Engine.step` while there is work, sleeping when idle: in a daemon thread of its own
    (:meth:`start`), or on the caller's thread (:meth:`run`; ``own_thread=False``).

    ``quickdraft serve`` steps on the main thread and serves HTTP from another: torch's OpenMP workers ran the
    same generation slower from a second thread (docs/serving.md)."""

    def __init__(self, engine: Engine, own_thread: bool = True) -> None:
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name="quickdraft-engine", daemon=True) if own_thread else None
        self._running = False

    def start(self) -> None:
        """Step in a thread of the loop's own; a loop driven by :meth:`run` on another thread starts nothing."""
        if self._thread is not None:
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() if self._thread is not None else self._running

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue a request (raises for a bad one or a full queue, see :meth:`Engine.submit`)."""
        self.engine.submit(request, sink)
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()

    def run(self) -> None:
        """Step until :meth:`stop` (blocking; on the thread that calls it)."""
        self._running = True
        try:
            while not self._stopping.is_set():
                try:
                    report = self.engine.step()
                except Exception:  # a fault of ours: fail the running requests, keep serving the next ones
                    log.exception("a serving step failed; its requests are dropped")
                    for state in self.engine.fail_running():
                        state.sink(RequestFailed("the server failed while generating this request; see its log"))
                    continue
                if report is None:
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
        finally:
            self._running = False
