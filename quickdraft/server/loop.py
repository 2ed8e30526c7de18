"""The engine's steps on one thread (a thread of the loop's own, or the caller's); other threads submit, cancel and
hear back through sinks."""

from __future__ import annotations

import logging
import threading
import time

from quickdraft.engine import Engine, FailureCause, Request, RequestFailed, Sink
from quickdraft.errors import QuickdraftError

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5  # how long an idle loop sleeps before it looks again (a submit wakes it at once)


class ServerStopping(QuickdraftError):
    """The server is shutting down and takes no more requests."""


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
        # a request is queued before a drain begins, or refused; reentrant, since a second signal's drain may run in
        # the main thread inside the first one's
        self._admission = threading.RLock()
        self._drain_deadline: float | None = None

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
        """Queue a request (raises for a bad one or a full queue, see :meth:`Engine.submit`; ``ServerStopping`` once
        :meth:`drain` began)."""
        state = self.engine.new_state(request, sink)  # its checks and its grammar's compiling: not under the lock
        with self._admission:
            if self._drain_deadline is not None:
                raise ServerStopping("the server is shutting down: send the request again later, or elsewhere")
            self.engine.enqueue(state)
        self._wake.set()

    def drain(self, grace_s: float) -> None:
        """Take no more requests; those running and waiting go on for up to ``grace_s`` seconds, then any left fail
        (``FailureCause.STOPPING``) and :meth:`run` returns. A later drain may shorten the grace, never lengthen it:
        ``drain(0)`` fails what is left at the end of the step under way."""
        with self._admission:
            deadline = time.monotonic() + grace_s
            if self._drain_deadline is None or deadline < self._drain_deadline:
                self._drain_deadline = deadline
        self._wake.set()

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()

    def run(self) -> None:
        """Step until :meth:`stop` (blocking; on the thread that calls it)."""
        self._running = True
        try:
            while not self._stopping.is_set():
                if self._drain_deadline is not None and (self.engine.idle or time.monotonic() > self._drain_deadline):
                    for state in self.engine.drop_all():
                        message = "the server shut down before this request finished"
                        state.sink(RequestFailed(message, FailureCause.STOPPING))
                    return
                try:
                    report = self.engine.step()
                except Exception:  # a fault of ours: the engine failed the step's requests; serve the next ones
                    log.exception("a serving step failed; its requests are dropped")
                    continue
                if report is None:
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
        finally:
            self._running = False
