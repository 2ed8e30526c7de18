"""The answer to a completion or chat completion, from its choices' engine events: whole, or streamed as chunks.

Rules:
- A request of ``n`` choices runs as n engine requests (``ApiRequest.choices``); their events reach the answer tagged
  with their choice's index, in the order the engine sends them.
- Whole: the answer once every choice has finished. A choice that fails fails the request, as does running past the
  request's time (504); a client found gone (checked every ``DISCONNECT_POLL_S``) is a 499. The caller cancels the
  choices still running (:attr:`Tracker.unfinished`).
- Echo with ``max_tokens`` 0 scores the prompt (:func:`scores_only`): the prompt and its log-probabilities, no new
  token, whole and streamed alike.
- Streamed: a chat opens every choice with its role, an echoing completion with its prompt (and the prompt's
  log-probabilities) before its first delta; each delta is a chunk of its choice's index (what may open a
  tool call held back, per choice); each choice ends with its finish reason; after the last, the usage chunk when
  asked for, then ``[DONE]``. A failure or the request's timeout is an error event, then ``[DONE]``.
- A completion of several prompts streams as one request of their choices, choice j of prompt i as index i·n + j,
  its usage summed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request

from quickdraft.engine import Event, GenerationResult, RequestFailed, RequestFinished, TokenDelta
from quickdraft.server.errors import ApiError, failure
from quickdraft.server.metrics import ServerMetrics
from quickdraft.server.protocol import ApiRequest
from quickdraft.server.responses import (
    TextOffsets,
    chunk_body,
    logprobs_body,
    new_id,
    prompt_logprobs_body,
    usage_chunk,
)

DISCONNECT_POLL_S = 0.5  # how often a waiting non-streamed request checks that its client is still there
Tagged = tuple[int, Event]  # a choice's index and one of its events
Spell = Callable[[int], tuple[str, bytes]]


class Tracker:
    """A request's timings for the metrics, which count each choice as a request (its arrival, each choice's first
    token and end), and which choices still run."""

    def __init__(self, arrival: float, metrics: ServerMetrics, timeout_s: float | None = None, n: int = 1) -> None:
        self.arrival = arrival
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.first_token: dict[int, float] = {}  # each choice's first token
        self.unfinished = set(range(n))  # the choices that have neither finished nor failed

    @property
    def done(self) -> bool:
        return not self.unfinished

    def seconds_left(self) -> float | None:
        """Seconds until the request's timeout (0 once past it); None without one."""
        if self.timeout_s is None:
            return None
        return max(0.0, self.arrival + self.timeout_s - time.perf_counter())

    def timeout(self) -> ApiError:
        message = f"the request ran past this server's {self.timeout_s:g} s limit (--request-timeout)"
        return ApiError(504, message, kind="server_error", code="timeout")

    def see(self, index: int, event: Event) -> None:
        now = time.perf_counter()
        if isinstance(event, TokenDelta) and event.token_ids:
            self.first_token.setdefault(index, now)
        elif isinstance(event, RequestFinished):
            self.unfinished.discard(index)
            ttft = self.first_token[index] - self.arrival if index in self.first_token else None
            result = event.result
            self.metrics.observe_request(result.finish_reason, ttft, now - self.arrival, len(result.token_ids))
        elif isinstance(event, RequestFailed):
            self.unfinished.discard(index)
            self.metrics.observe_failure()


def scores_only(event: Event) -> Event:
    """A scoring request's event (echo with ``max_tokens`` 0): the one token it decoded taken out (its text, id and
    log-probability), the prompt's log-probabilities kept; it ends as its budget of none would, "length"."""
    if isinstance(event, TokenDelta):
        return TokenDelta("", (), (), event.prompt_logprobs)
    if isinstance(event, RequestFinished):
        none = [] if event.result.logprobs is not None else None
        return RequestFinished(dataclasses.replace(event.result, text="", token_ids=[], logprobs=none,
                                                   finish_reason="length", stop_reason=None))  # fmt: skip
    return event


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def collect(request: Request, events: asyncio.Queue[Tagged], track: Tracker, n: int) -> list[GenerationResult]:
    """The choices' results, in their order, the client checked every ``DISCONNECT_POLL_S`` while they run."""
    check_at, results = time.monotonic() + DISCONNECT_POLL_S, {}
    while len(results) < n:
        left = track.seconds_left()
        wait_s = max(0.0, check_at - time.monotonic() if left is None else min(left, check_at - time.monotonic()))
        try:
            index, event = await asyncio.wait_for(events.get(), wait_s)
        except TimeoutError:
            if track.seconds_left() == 0:
                raise track.timeout() from None
            index, event = 0, None
        if time.monotonic() >= check_at:
            if await request.is_disconnected():
                raise ApiError(499, "the client closed the connection") from None
            check_at = time.monotonic() + DISCONNECT_POLL_S
        if isinstance(event, RequestFinished):
            results[index] = event.result
        elif isinstance(event, RequestFailed):
            raise failure(event)
    return [results[index] for index in range(n)]


async def stream_chunks(
    parts: Sequence[ApiRequest], events: asyncio.Queue[Tagged], track: Tracker, spell: Spell
) -> AsyncIterator[str]:
    """The answer's chunks as server-sent events (the rules above). ``parts``: the request, or a completion's one
    request per prompt of a list, whose choice j of prompt i is tagged and sent as index i·n + j."""
    response_id, results, n = new_id(parts[0].chat), {}, parts[0].n
    apis = [api for api in parts for _ in range(n)]  # each choice's request
    offsets = [TextOffsets(0, api.silent) for api in apis]  # completions' text_offset: each choice's next token
    calls = [api.tools.call_filter() if api.tools else None for api in apis]  # hold back what may open a call
    thoughts = [api.thinking.stream() if api.thinking else None for api in apis]  # reasoning apart
    echoed = [api.echo is None for api in apis]  # a completion's echoed prompt goes out before its first delta
    if parts[0].chat:
        for index, api in enumerate(apis):
            yield sse(chunk_body(api, response_id, None, index=index))
    while len(results) < len(apis):
        try:
            index, event = await asyncio.wait_for(events.get(), track.seconds_left())
        except TimeoutError:
            yield sse(track.timeout().body())
            break
        api, held, thought = apis[index], calls[index], thoughts[index]
        if isinstance(event, TokenDelta) and not echoed[index]:
            echoed[index] = True
            echo_logprobs = api.serve.config.logprobs is not None
            prompt = prompt_logprobs_body(api, event.prompt_logprobs, spell) if echo_logprobs else None
            yield sse(chunk_body(api, response_id, api.echo, logprobs=prompt, index=index))
            offsets[index] = TextOffsets(len(api.echo or ""), api.silent)
        if isinstance(event, TokenDelta):
            logprobs = logprobs_body(api, event.logprobs, spell, offsets[index]) if event.logprobs else None
            reasoning, text = thought.feed(event.text) if thought is not None else ("", event.text)
            text = text if held is None else held.feed(text)
            if text or reasoning or api.return_token_ids or logprobs:
                body = chunk_body(
                    api, response_id, text, event.token_ids, logprobs=logprobs, index=index, reasoning=reasoning
                )
                yield sse(body)
        elif isinstance(event, RequestFinished):
            reason = event.result.finish_reason
            if thought is not None:  # what the reasoning split held at the end
                reasoning, text = thought.finish()
                text = text if held is None else held.feed(text)
                if reasoning or text:
                    yield sse(chunk_body(api, response_id, text, index=index, reasoning=reasoning))
            if held is not None and api.tools is not None:  # a filter exists exactly when tools do
                content, found = api.tools.split_calls(held.text)
                if content[held.sent :] or found:  # the held text that was no call; the calls, whole
                    yield sse(chunk_body(api, response_id, content[held.sent :], tool_calls=found, index=index))
                reason = api.tools.finish_reason(reason, bool(found))
            yield sse(chunk_body(api, response_id, "", (), reason, index=index, stop_reason=event.result.stop_reason))
            results[index] = event.result
        elif isinstance(event, RequestFailed):
            yield sse(failure(event).body())
            break
    else:
        if parts[0].include_usage:
            answered = [(api, [results[i * n + j] for j in range(n)]) for i, api in enumerate(parts)]
            yield sse(usage_chunk(answered, response_id))
    yield "data: [DONE]\n\n"
