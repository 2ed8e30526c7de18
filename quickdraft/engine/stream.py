"""One request decoded on the caller's thread: submit it, step the engine until it finishes, hand out its text."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterator

from quickdraft.engine.engine import Engine
from quickdraft.engine.request import (
    Event,
    FailureCause,
    GenerationResult,
    Request,
    RequestFailed,
    RequestFinished,
    TokenDelta,
)
from quickdraft.errors import ConfigError, QuickdraftError


class GenerationStream:
    """Iterates over a request's text deltas as its tokens are committed; ``result`` is set at the end.

    The request is checked (and its policy built) when the stream is made, and queued at the first delta asked
    for. Each delta asked for steps the engine, and so every request it runs, until this one commits text; streams
    on several threads step in turn. A stream is read once: one left before its end cancels its request, and
    reading it again is an error, for the new reading and, its request cancelled, for the one held; reading it on a
    second thread while the first reads is an error for the second alone. :meth:`finish` goes on with one read
    partway whose reading is still held.
    """

    def __init__(self, engine: Engine, request: Request) -> None:
        self._engine = engine
        self._events: deque[Event] = deque()
        self._state = engine.new_state(request, self._events.append)  # a bad request raises here
        self.result: GenerationResult | None = None
        self._reader: Generator[str, None, GenerationResult] | None = None  # the one reading, once started

    def __iter__(self) -> Iterator[str]:
        if self.result is None:  # a finished stream yields nothing more and keeps its result
            if self._reader is not None:
                try:
                    self._reader.close()  # a reading left midway but still held: its request is cancelled now
                except ValueError:  # "generator already executing": it runs on another thread, and goes on
                    raise ConfigError("this stream is being read on another thread: a stream is read once") from None
                raise ConfigError("this stream was already read: left before its end, its request was cancelled")
            self._reader = self._run()
            result = yield from self._reader
            if result is None and self.result is None:  # a second reading closed this one (its request cancelled)
                raise ConfigError("this stream was read again, which cancelled its request: a stream is read once")
            if self.result is None:  # else finish() drove the reading to its end
                self.result = result

    def finish(self) -> GenerationResult:
        """Run to the end and return the result, dropping the deltas not read yet: a stream read partway whose
        iterator is still held goes on from where it stopped; one left before its end (its request cancelled) is an
        error."""
        if self.result is None and self._reader is None:
            for _ in self:
                pass
        elif self.result is None:
            if self._reader is None or self._reader.gi_frame is None:  # closed: left (cancelled), or it failed
                raise ConfigError(
                    "this stream's reading ended before its result: it was left (its request cancelled) or failed"
                )
            self.result = _drain(self._reader)
        assert self.result is not None
        return self.result

    def _run(self) -> Generator[str, None, GenerationResult]:
        engine, request_id = self._engine, self._state.request.request_id
        engine.enqueue(self._state)
        finished = False
        try:
            while True:
                while not self._events:  # another thread's step may bring them while this one waits its turn
                    if engine.step() is None and not self._events:
                        raise QuickdraftError("the engine stopped before the request finished")
                event = self._events.popleft()
                if isinstance(event, TokenDelta) and event.text:
                    yield event.text
                elif isinstance(event, RequestFinished):
                    finished = True
                    return event.result
                elif isinstance(event, RequestFailed):
                    finished = True
                    raise (ConfigError if event.cause is FailureCause.REQUEST else QuickdraftError)(event.message)
        finally:
            if not finished:  # left before its end: its caches are freed now, or by the step running now
                engine.cancel(request_id, now=True)


def _drain(reader: Generator[str, None, GenerationResult]) -> GenerationResult:
    """``reader``'s result, its deltas dropped."""
    try:
        while True:
            next(reader)
    except StopIteration as done:
        return done.value


def stream(engine: Engine, request: Request) -> GenerationStream:
    """Decode ``request`` on the caller's thread, stepping whatever else ``engine`` runs too; the stream yields its
    text deltas. A bad request raises here, not at the first delta."""
    return GenerationStream(engine, request)


def generate(engine: Engine, request: Request) -> GenerationResult:
    """Decode ``request`` to its end on the caller's thread."""
    return GenerationStream(engine, request).finish()
