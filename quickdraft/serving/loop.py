"""The engine's steps in one background thread; other threads submit, cancel and hear back through sinks."""

from __future__ import annotations

import logging
import threading

from quickdraft.serving.engine import BatchEngine
from quickdraft.serving.request import RequestFailed, ServeRequest, Sink

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5  # how long an idle loop sleeps before it looks again (a submit wakes it at once)


class ServingLoop:
    """Runs :meth:`BatchEngine.step` in a daemon thread while there is work, sleeping when idle."""

    def __init__(self, engine: BatchEngine) -> None:
        self.engine = engine
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quickdraft-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, request: ServeRequest, sink: Sink) -> None:
        """Queue a request (raises for a bad one or a full queue, see :meth:`BatchEngine.submit`)."""
        self.engine.submit(request, sink)
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                report = self.engine.step()
            except Exception:  # a fault of ours: fail the running requests, keep serving the next ones
                log.exception("a serving step failed; its requests are dropped")
                self._fail_running("the server failed while generating this request; see its log")
                continue
            if report is None:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()

    def _fail_running(self, message: str) -> None:
        scheduler = self.engine.scheduler
        for state in list(scheduler.running):
            scheduler.finish(state)
            state.release()
            state.sink(RequestFailed(message))
