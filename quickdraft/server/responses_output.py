"""OpenAI's Responses API, the answer: the Response object of a request translated to chat
(:mod:`quickdraft.server.responses_api`), its output items, and its typed events when streamed.

Rules:
- An answer cut by ``max_output_tokens`` is ``incomplete`` (reason ``max_output_tokens``); any other is
  ``completed``. Its output: a thinking model's reasoning as a ``reasoning`` item (its text one ``reasoning_text``
  part; split as chat's ``reasoning_content``, :mod:`quickdraft.server.reasoning`), then a message with the answer's
  text (left out when the answer is only calls, or only reasoning, or constrained to calls and cut before its
  first), then each call, as the chat answer's content and
  ``tool_calls``. The message's log-probabilities are those of the tokens that spell its text, not of the reasoning
  before it nor of the calls after it; ``usage`` counts the tokens that spell the reasoning as reasoning tokens.
- Streamed: ``response.created`` and ``response.in_progress``; a reasoning item's ``output_item.added`` and
  ``content_part.added`` at its first text, a ``reasoning_text.delta`` per delta, then ``reasoning_text.done``,
  ``content_part.done`` and ``output_item.done`` as the answer leaves it; the message's ``output_item.added`` and
  ``content_part.added`` at its first text, an ``output_text.delta`` per delta (with the entries of the tokens it
  spells), then ``output_text.done``, ``content_part.done`` and ``output_item.done``; each call's
  ``output_item.added``, its arguments in one ``function_call_arguments.delta`` and ``.done``, and
  ``output_item.done``; last ``response.completed`` (or ``.incomplete``). A request that fails or runs out of time
  closes its message as ``incomplete`` and ends with ``response.failed`` and the error. Every event carries its
  ``sequence_number``.
"""

from __future__ import annotations

import asyncio
import codecs
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from quickdraft.engine import Event, GenerationResult, RequestFailed, RequestFinished, TokenDelta
from quickdraft.engine.logprobs import TokenLogprob
from quickdraft.server.answers import Spell
from quickdraft.server.errors import ApiError, failure
from quickdraft.server.protocol import ApiRequest
from quickdraft.server.reasoning import Thinking
from quickdraft.server.responses import logprobs_body, speculation
from quickdraft.server.responses_api import Echo


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def response_object(
    api: ApiRequest,
    echo: Echo,
    response_id: str,
    output: list[dict[str, Any]],
    result: GenerationResult | None,
    error: ApiError | None = None,
    spell: Spell | None = None,
) -> dict[str, Any]:
    """The Response: in progress while ``result`` is None, else completed or incomplete; failed with ``error`` (a
    request's own fault is an ``invalid_prompt``, any other a ``server_error``: the codes a Response may carry);
    ``spell`` counts a finished answer's reasoning tokens."""
    status = "failed" if error else "in_progress" if result is None else answer_status(result)
    sampling = api.serve.config.sampling
    failed = None if error is None else {"code": "invalid_prompt" if error.status == 400 else "server_error"}
    body = {
        "id": response_id, "object": "response", "created_at": api.created, "status": status, "background": False,
        "error": None if error is None else failed | {"message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.instructions, "max_output_tokens": echo.max_output_tokens, "max_tool_calls": None,
        "model": api.model, "output": output, "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": False,
        "temperature": sampling.temperature, "text": echo.text, "tool_choice": echo.tool_choice,
        "tools": echo.tools, "top_logprobs": echo.top_logprobs, "top_p": sampling.top_p, "truncation": "disabled",
        "usage": None if result is None else usage(api, result, spell), "metadata": echo.metadata,
    }  # fmt: skip
    return body | echo.given | ({} if result is None else {"speculation": speculation([result])})


def answer_status(result: GenerationResult) -> str:
    """A finished answer's status: cut at its token limit, incomplete; else completed."""
    return "incomplete" if result.finish_reason == "length" else "completed"


def logprob_entries(api: ApiRequest, logprobs: Sequence[TokenLogprob], spell: Spell) -> list[dict[str, Any]]:
    """The tokens' log-probabilities as an output text's entries (chat's); none where the request asked for none."""
    body = logprobs_body(api, logprobs, spell)
    return [] if body is None else body["content"]


def reasoning_split(thinking: Thinking | None, text: str) -> tuple[str | None, str, int]:
    """An answer's reasoning (None: it did not think), the rest, and how many characters of ``text`` come before
    the rest (the reasoning with its tags; the rest is a suffix of ``text``)."""
    reasoning, rest = thinking.split(text) if thinking else (None, text)
    return reasoning, rest, len(text) - len(rest)


def usage(api: ApiRequest, result: GenerationResult, spell: Spell | None = None) -> dict[str, Any]:
    input_tokens, output_tokens = len(api.serve.prompt_ids), len(result.token_ids)
    reasoning, _, before = reasoning_split(api.thinking, result.text)
    pieces = [spell(token)[1] for token in result.token_ids] if spell and reasoning else []
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": result.stats.cached_prompt_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": Spelling().take(pieces, before)},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(item_id: str, text: str | None, logprobs: list[Any], status: str) -> dict[str, Any]:
    """The assistant's message; ``text`` None: opened, no part yet."""
    content = [] if text is None else [output_text(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def output_text(text: str, logprobs: list[Any]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A thinking model's reasoning; ``text`` None: opened, no part yet."""
    content = [] if text is None else [reasoning_text(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def reasoning_text(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def call_item(call: Mapping[str, Any], arguments: str | None = None, status: str = "completed") -> dict[str, Any]:
    """A chat tool call as a function_call item (``arguments``: what to show of its arguments, all by default)."""
    function = call["function"]
    return {
        "type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
        "name": function["name"], "arguments": function["arguments"] if arguments is None else arguments,
        "status": status,
    }  # fmt: skip


class Spelling:
    """Reads tokens' bytes as UTF-8 one after another, as a byte-level BPE tokenizer decodes an answer: ``chars`` is
    how many characters of the text the tokens read so far spell. A character's first bytes count once it is whole,
    or once broken off (as the one U+FFFD the text holds for them), so a token inside a character and the one
    completing it spell it together, and bytes that are no UTF-8 count as the text's U+FFFD, not as their own number
    (SentencePiece's byte fallback writes one per byte token: there the count can fall short by a run's extra ones)."""

    def __init__(self) -> None:
        self.chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds a character's first bytes

    def take(self, pieces: Sequence[bytes], limit: int) -> int:
        """How many of the next tokens (by their bytes) spell at most ``limit`` characters of the text in all:
        those of a message's text where calls follow it, or of a delta, or of the reasoning before it. They are
        read; the first one past ``limit`` is not."""
        taken = 0
        for piece in pieces:
            state = self._utf8.getstate()
            chars = self.chars + len(self._utf8.decode(piece))
            if chars > limit:
                self._utf8.setstate(state)
                break
            self.chars, taken = chars, taken + 1
        return taken


def entry_bytes(entries: Sequence[dict[str, Any]]) -> list[bytes]:
    """Log-probability entries' tokens, by their bytes."""
    return [bytes(entry["bytes"]) for entry in entries]


def output_items(api: ApiRequest, result: GenerationResult, spell: Spell) -> list[Any]:
    """A whole answer's output: its reasoning (if it thought), its message (unless it is only calls, only
    reasoning, or constrained to calls), then its calls."""
    reasoning, text, before = reasoning_split(api.thinking, result.text)
    content, calls = api.tools.split_calls(text) if api.tools else (text, [])
    status = answer_status(result)
    left = "completed" if content or calls else status  # the reasoning, once the answer went on past it
    items = [reasoning_item(f"rs_{uuid.uuid4().hex}", reasoning, left)] if reasoning else []
    if not content and (calls or reasoning or (api.tools and api.tools.only_calls)):
        return [*items, *(call_item(call) for call in calls)]
    entries, spelling = logprob_entries(api, result.logprobs or [], spell), Spelling()
    if before:  # the message's tokens: after the reasoning's
        entries = entries[spelling.take(entry_bytes(entries), before) :]
    logprobs = entries[: spelling.take(entry_bytes(entries), before + len(content))] if calls else entries
    message = message_item(f"msg_{uuid.uuid4().hex}", content, logprobs, status)
    return [*items, message, *(call_item(call) for call in calls)]


class StreamedMessage:
    """A streamed answer's message: its text as sent, and the log-probabilities of its tokens, each sent with the
    delta that spells it (tokens that may open a call are held back with their text)."""

    def __init__(self) -> None:
        self.text, self.pending, self.sent = "", [], []  # entries not yet sent; those sent
        self.spelling, self.start = Spelling(), 0  # the answer's tokens read; its characters before the text

    def add(self, delta: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries to send with ``delta``."""
        self.text += delta
        self.pending += entries
        released = self._within_text(self.pending)
        self.pending = self.pending[len(released) :]
        self.sent += released
        return released

    def spelled(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries sent, then those of ``entries`` (the ones not sent) that spell the rest of the text."""
        return self.sent + self._within_text(entries)

    def _within_text(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The first of ``entries`` (after those read) whose tokens spell no more than the text so far; read."""
        return entries[: self.spelling.take(entry_bytes(entries), self.start + len(self.text))]


async def stream_events(
    api: ApiRequest,
    echo: Echo,
    events: asyncio.Queue[tuple[int, Event]],
    track: Any,
    spell: Spell,
) -> AsyncIterator[str]:
    """The answer's events as server-sent events (the rules above); ``track``: the app's tracker of the request's
    time left (``seconds_left``, ``timeout``)."""
    response_id, message_id, numbers = new_response_id(), f"msg_{uuid.uuid4().hex}", itertools.count()
    calls, message, opened = api.tools.call_filter() if api.tools else None, StreamedMessage(), False
    thoughts, thought = (api.thinking.stream() if api.thinking else None), StreamedReasoning()
    raw, entries_seen, handed = "", [], 0  # the answer's text and entries so far; entries given to the message
    started = thoughts is None  # whether the message's text has started (and the reasoning's entries are skipped)

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(numbers)} | fields
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def ids() -> dict[str, Any]:  # the message's place: after a reasoning item
        return {"item_id": message_id, "output_index": 1 if thought.opened else 0, "content_index": 0}

    def opening() -> list[str]:
        """The message and its text part, opened once: at the answer's first text, or as it ends without any."""
        nonlocal opened
        if opened:
            return []
        opened, item = True, message_item(message_id, None, [], "in_progress")
        return [
            *thought.closing(event, "completed"),
            event("response.output_item.added", output_index=ids()["output_index"], item=item),
            event("response.content_part.added", **ids(), part=output_text("", [])),
        ]

    def start(before: int) -> None:
        """The message's text starts after ``before`` characters of the answer: the entries spelling them are the
        reasoning's (all of them have come: an entry comes with the delta of its text)."""
        nonlocal started, handed
        started, handed = True, message.spelling.take(entry_bytes(entries_seen), before) if before else 0
        message.start = before

    def message_entries() -> list[dict[str, Any]]:
        """The entries not yet given to the message, once its text has started."""
        nonlocal handed
        if not started:
            return []
        given, handed = entries_seen[handed:], len(entries_seen)
        return given

    def text_events(delta: str) -> list[str]:
        """``delta`` with the entries of the tokens it spells."""
        if not delta:  # entries wait for a delta to go with (an empty token's too)
            return []
        released = message.add(delta, message_entries())
        opened_now = opening()  # numbered before the delta
        return [*opened_now, event("response.output_text.delta", **ids(), delta=delta, logprobs=released)]

    def split_events(reasoning: str, content: str, held: str = "") -> list[str]:
        """The answer's next reasoning and content (``held``: the text the split still holds): the reasoning's
        events, then the content's (calls held back)."""
        if content and not started:  # the message's text starts here
            start(len(raw) - len(held) - len(content))
        return [*thought.add(event, reasoning), *text_events(content if calls is None else calls.feed(content))]

    def closing(status: str, logprobs: list[Any]) -> list[str]:
        """The message's last events: its item, as it ends."""
        item = message_item(message_id, message.text, logprobs, status)
        return [
            *opening(),
            event("response.output_text.done", **ids(), text=message.text, logprobs=logprobs),
            event("response.content_part.done", **ids(), part=item["content"][0]),
            event("response.output_item.done", output_index=ids()["output_index"], item=item),
        ]

    yield event("response.created", response=response_object(api, echo, response_id, [], None))
    yield event("response.in_progress", response=response_object(api, echo, response_id, [], None))
    while True:
        try:
            _, engine_event = await asyncio.wait_for(events.get(), track.seconds_left())  # the one choice's
        except TimeoutError:
            engine_event = track.timeout()
        if isinstance(engine_event, TokenDelta):
            raw += engine_event.text
            entries_seen += logprob_entries(api, engine_event.logprobs, spell)
            if thoughts is None:
                parts = split_events("", engine_event.text)
            else:
                parts = split_events(*thoughts.feed(engine_event.text), held=thoughts.held)
            for sent in parts:
                yield sent
            continue
        if not isinstance(engine_event, RequestFinished):  # failed, or past its time: what was sent, then why
            error = failure(engine_event) if isinstance(engine_event, RequestFailed) else engine_event
            if thoughts is not None:  # what the reasoning split held
                left = thoughts.state == "content"  # the reasoning was whole: the answer had left it
                for sent in [*split_events(*thoughts.finish()), *thought.closing(event, "completed" if left else "")]:
                    yield sent
            output = [*thought.items("incomplete")]
            for sent in thought.closing(event, "incomplete"):
                yield sent
            if opened:
                for sent in closing("incomplete", message.sent):
                    yield sent
                output.append(message_item(message_id, message.text, message.sent, "incomplete"))
            yield event("response.failed", response=response_object(api, echo, response_id, output, None, error))
            return
        result, found, status = engine_event.result, [], answer_status(engine_event.result)
        if thoughts is not None:  # what the reasoning split held at the end
            for sent in split_events(*thoughts.finish()):
                yield sent
            if not started:  # no text after the reasoning: the message, if any, has the tokens after it
                start(reasoning_split(api.thinking, raw)[2])
        if calls is not None and api.tools is not None:
            content, found = api.tools.split_calls(calls.text)
            for sent in text_events(content[calls.sent :]):  # the held text that was no call
                yield sent
        for sent in thought.closing(event, "completed" if found else status):  # the answer went on past it, or not
            yield sent
        output: list[dict[str, Any]] = [*thought.items(status)]
        only_calls = api.tools is not None and api.tools.only_calls  # a cut call is no message
        if opened or not (found or thought.opened or only_calls):  # an answer with no text still has its message
            unsent = message.pending + message_entries()
            logprobs = message.spelled(unsent) if found else message.sent + unsent
            for sent in closing(status, logprobs):
                yield sent
            output.append(message_item(message_id, message.text, logprobs, status))
        for call in found:
            index, item = len(output), call_item(call)
            yield event("response.output_item.added", output_index=index, item=call_item(call, "", "in_progress"))
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])  # fmt: skip
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=item["name"], arguments=item["arguments"])  # fmt: skip
            output.append(item)
            yield event("response.output_item.done", output_index=index, item=item)
        finished = response_object(api, echo, response_id, output, result, spell=spell)
        yield event("response.incomplete" if finished["status"] == "incomplete" else "response.completed",
                    response=finished)  # fmt: skip
        return


class StreamedReasoning:
    """A streamed answer's reasoning item (output index 0): opened at its first text, closed once as the answer
    leaves it or ends."""

    def __init__(self) -> None:
        self.item_id, self.text, self.opened, self.status = f"rs_{uuid.uuid4().hex}", "", False, None

    def add(self, event: Any, delta: str) -> list[str]:
        if not delta:
            return []
        place = {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        sent = []
        if not self.opened:
            self.opened, item = True, reasoning_item(self.item_id, None, "in_progress")
            sent += [
                event("response.output_item.added", output_index=0, item=item),
                event("response.content_part.added", **place, part=reasoning_text("")),
            ]
        self.text += delta
        return [*sent, event("response.reasoning_text.delta", **place, delta=delta)]

    def closing(self, event: Any, status: str) -> list[str]:
        """The item's last events, once (``status`` "": not yet)."""
        if not self.opened or self.status is not None or not status:
            return []
        self.status, place = status, {"item_id": self.item_id, "output_index": 0, "content_index": 0}
        item = reasoning_item(self.item_id, self.text, status)
        return [
            event("response.reasoning_text.done", **place, text=self.text),
            event("response.content_part.done", **place, part=item["content"][0]),
            event("response.output_item.done", output_index=0, item=item),
        ]

    def items(self, status: str) -> list[dict[str, Any]]:
        """The item in the Response's output (none if the answer did not reason)."""
        return [reasoning_item(self.item_id, self.text, self.status or status)] if self.opened else []
