"""Which requests run in the next step: first come, first served, a bounded queue, a bound on the cache positions
they reserve, chunked prefill."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from quickdraft.engine.request import RequestState, RunningRequest
from quickdraft.errors import ConfigError, QuickdraftError


class QueueFull(QuickdraftError):
    """The waiting queue holds as many requests as it may: try again later."""


PROMPT_FORWARD_TOKENS = 2048  # the most prompt tokens one forward reads when nothing decodes
SCORED_PROMPT_TOKENS = 256  # ... and of a prompt whose every position's logits are kept ([256, V] floats a forward)


@dataclass(frozen=True)
class SchedulerSettings:
    max_running: int = 32  # requests decoding (and reading their prompts) at once
    max_waiting: int = 256  # requests queued for a slot beyond the free ones; one more is refused (QueueFull)
    prefill_tokens_per_step: int = 128  # prompt tokens the target reads per step beside decoding requests
    max_positions: int | None = None  # positions the running requests may reserve in all (None: no bound)

    def __post_init__(self) -> None:
        for name in ("max_running", "max_waiting", "prefill_tokens_per_step", "max_positions"):
            value = getattr(self, name)
            if (value is not None or name != "max_positions") and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}", name)


def positions(state: RequestState) -> int:
    """The cache positions a request reserves: its prompt's and as many as it may generate."""
    return len(state.request.prompt_ids) + state.request.config.max_new_tokens


class Scheduler:
    """Requests wait in arrival order; at each step boundary the oldest take the free slots, while the positions
    they reserve (:func:`positions`) fit within ``max_positions`` with the running ones' (the memory of their
    caches); the oldest waits for room rather than be passed. A request reads its prompt in chunks, the oldest
    first, at most ``prefill_tokens_per_step`` tokens a step in all, so a long prompt never stalls the requests that
    are decoding. Adding and cancelling are safe from other threads; everything else runs on the engine's thread."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.waiting: deque[RequestState] = deque()
        self.running: list[RunningRequest] = []
        self.admitting: deque[RequestState] = deque()  # taken from the queue, not started yet
        self._cancelled: set[str] = set()
        self._live: set[str] = set()  # ids of the requests added and not yet finished, cancelled or failed
        self._lock = threading.RLock()  # re-entrant: a stream's finalizer may cancel while this thread holds it

    def add(self, state: RequestState) -> None:
        """Queue ``state``: ``QueueFull`` when the queue is full, ``ConfigError`` when a request of its id is
        already queued or running (an id names one request, which is what :meth:`cancel` stops)."""
        request_id, limit = state.request.request_id, self.settings.max_positions
        if limit is not None and positions(state) > limit:
            raise ConfigError(
                f"the request reserves {positions(state)} positions (its prompt and max_new_tokens), more than the "
                f"{limit} this server's caches hold for all requests together; lower max_new_tokens or shorten the "
                "prompt",
                "max_new_tokens",
            )
        with self._lock:
            if request_id in self._live:
                raise ConfigError(f"request {request_id!r} is already queued or running: give each request its own id")
            if len(self.waiting) - self.free_slots() >= self.settings.max_waiting:
                raise QueueFull(
                    f"the server's queue is full ({self.settings.max_waiting} requests waiting); retry later"
                )
            self.waiting.append(state)
            self._live.add(request_id)

    def free_slots(self) -> int:
        """Slots no request runs in or is starting in: the oldest waiting requests take them at the next step
        boundary, so they are not counted against ``max_waiting`` (the n choices of one request queue together)."""
        return max(0, self.settings.max_running - len(self.running) - len(self.admitting))

    def cancel(self, request_id: str) -> None:
        """Cancel a waiting, starting or running request at the next step boundary (unknown ids are ignored)."""
        with self._lock:
            if request_id in self._live:
                self._cancelled.add(request_id)

    def take_cancelled(self) -> list[RequestState | RunningRequest]:
        """Remove the cancelled requests from the queue, the running set and those whose start raised; return them."""
        with self._lock:
            if not self._cancelled:
                return []
            ids, self._cancelled = self._cancelled, set()
            removed: list[RequestState | RunningRequest] = [
                state for state in self.waiting if state.request.request_id in ids
            ]
            self.waiting = deque(state for state in self.waiting if state.request.request_id not in ids)
        removed += [state for state in self.running if state.request.request_id in ids]
        self.running = [state for state in self.running if state.request.request_id not in ids]
        removed += [state for state in self.admitting if state.request.request_id in ids]  # a start that raised
        self.admitting = deque(state for state in self.admitting if state.request.request_id not in ids)
        self._forget(removed)
        return removed

    def admit(self, start: Callable[[RequestState], RunningRequest]) -> list[RunningRequest]:
        """Move the oldest waiting requests into free slots, each started by ``start`` (its caches made); returns
        the admitted ones. Where a start raises, that request and those after it stay in :attr:`admitting` for the
        failure path to answer (``Engine.fail_running``): no request is lost."""
        limit = self.settings.max_positions
        with self._lock:
            reserved = sum(positions(state) for state in [*self.running, *self.admitting])
            while self.waiting and len(self.running) + len(self.admitting) < self.settings.max_running:
                if limit is not None and reserved + positions(self.waiting[0]) > limit:
                    break  # the oldest waits for room
                reserved += positions(self.waiting[0])
                self.admitting.append(self.waiting.popleft())
        admitted = []
        while self.admitting:
            admitted.append(start(self.admitting[0]))
            self.running.append(admitted[-1])
            self.admitting.popleft()
        return admitted

    def prefill_chunks(self) -> list[tuple[RunningRequest, int]]:
        """(request, prompt tokens to read this step) for requests still reading their prompts, oldest first.

        While no request is decoding there is no one for a long prompt to stall: the oldest prompt is read in
        forwards of up to ``PROMPT_FORWARD_TOKENS`` (each forward reads all the weights again; longer ones would
        only hold more activations: a 32k-token prompt read whole would need gigabytes); a prompt whose
        log-probabilities are asked for (every position's logits kept) in forwards of up to ``SCORED_PROMPT_TOKENS``."""
        budget, chunks = self.settings.prefill_tokens_per_step, []
        reading = [state for state in self.running if state.prefilled < state.prompt_length]
        if reading and not any(state.decoding for state in self.running):
            budget = max(budget, min(PROMPT_FORWARD_TOKENS, reading[0].prompt_length - reading[0].prefilled))
        for state in self.running:
            unread = state.prompt_length - state.prefilled
            if unread > 0 and budget > 0:
                chunks.append(
                    (state, min(unread, budget, SCORED_PROMPT_TOKENS if state.request.scores_prompt else unread))
                )
                budget -= chunks[-1][1]
        return chunks

    def take_all(self) -> list[RequestState]:
        """Remove the running requests and those whose admission failed (:meth:`admit`), and return them."""
        taken: list[RequestState] = [*self.running, *self.admitting]
        self.running, self.admitting = [], deque()
        self._forget(taken)
        return taken

    def take_waiting(self) -> list[RequestState]:
        """Remove the requests waiting for a slot, and return them."""
        with self._lock:
            taken, self.waiting = list(self.waiting), deque()
        self._forget(taken)
        return taken

    def finish(self, state: RunningRequest) -> None:
        self.running.remove(state)
        self._forget([state])

    def _forget(self, states: list[RequestState]) -> None:
        """These requests have left: their ids may be used again, and a cancel that came too late is dropped."""
        ids = {state.request.request_id for state in states}
        with self._lock:
            self._live -= ids
            self._cancelled -= ids

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and not self._cancelled
