"""OpenAI's Responses API (``/v1/responses``) over the chat path: a request is translated to the chat request it
means and validated as one (:func:`quickdraft.server.protocol.parse_request`); the answer is a Response object, or
its typed events when streamed.

Rules:
- ``input`` is a string (one user message) or a list of items: messages (role user, system, developer or assistant;
  content text or ``input_text`` / ``output_text`` parts), ``function_call`` items (the assistant's calls; consecutive
  ones, and those after an assistant message, are one assistant turn) and ``function_call_output`` items (tool
  messages). ``instructions`` is a system message before them.
- ``max_output_tokens`` is chat's ``max_tokens``; ``text.format`` (text, json_object, json_schema) its
  ``response_format``; function ``tools`` (flat: name, description, parameters, strict) and ``tool_choice`` (auto,
  none, required, ``{"type": "function", "name"}``) its tools; ``include: ["message.output_text.logprobs"]`` with
  ``top_logprobs`` its log-probabilities. quickdraft's extras, ``seed`` and ``stop`` pass as in chat.
- This server keeps no responses: ``store`` true, ``previous_response_id``, ``conversation`` and ``background`` are
  refused (send the whole conversation as ``input``), as are reasoning, prompt templates, hosted tools, other
  ``include`` values and parts that are not text. Every Response says ``store: false``.
- An answer cut by ``max_output_tokens`` is ``incomplete`` (reason ``max_output_tokens``); any other is
  ``completed``. Its output: a message with the answer's text (left out when the answer is only calls), then each
  call, as the chat answer's content and ``tool_calls``.
- Streamed: ``response.created`` and ``response.in_progress``; the message's ``output_item.added`` and
  ``content_part.added`` at its first text, an ``output_text.delta`` per delta, then ``output_text.done``,
  ``content_part.done`` and ``output_item.done``; each call's ``output_item.added``, its arguments in one
  ``function_call_arguments.delta`` and ``.done``, and ``output_item.done``; last ``response.completed`` (or
  ``.incomplete``, or ``.failed`` with the error). Every event carries its ``sequence_number``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quickdraft.engine import Event, GenerationResult, RequestFailed, RequestFinished, TokenDelta
from quickdraft.server.errors import ApiError, failure
from quickdraft.server.fields import HARMLESS, flag
from quickdraft.server.protocol import ApiRequest
from quickdraft.server.responses import logprobs_body, speculation
from quickdraft.server.tools import CallFilter, split_calls

LOGPROBS = "message.output_text.logprobs"  # the one ``include`` value this server answers
PASSED = frozenset({
    "model", "temperature", "top_p", "stream", "stream_options", "parallel_tool_calls", "top_logprobs",
    # quickdraft's extras and chat's, as chat reads them
    "seed", "stop", "top_k", "drafter", "policy", "num_draft_tokens", "max_draft_tokens", "regex", "grammar",
    "cache_prompt", "prediction",
})  # fmt: skip
READ = frozenset({"input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "include"})
# what a server that keeps no responses and runs no hosted tools cannot do, with the values that ask for none of it
REFUSED: dict[str, tuple[Any, ...]] = {
    "store": (None, False), "previous_response_id": (None,), "conversation": (None,), "background": (None, False),
    "reasoning": (None,), "prompt": (None,), "max_tool_calls": (None,), "truncation": (None, "disabled"),
}  # fmt: skip
PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}


@dataclass(frozen=True)
class Echo:
    """What a Response repeats of its request."""

    instructions: str | None
    max_output_tokens: int | None
    tools: list[Any]
    tool_choice: Any
    parallel_tool_calls: bool
    text_format: dict[str, Any]
    top_logprobs: int | None
    metadata: dict[str, Any]


def chat_request(body: Any) -> tuple[dict[str, Any], Echo]:
    """The chat completion body a Responses request means, and what its Response repeats; raises :class:`ApiError`
    for what it cannot mean here (the rules above)."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the request body must be a JSON object")
    for name, value in body.items():
        if name in REFUSED and not any(value == allowed and type(value) is type(allowed) for allowed in REFUSED[name]):
            reason = "keeps no responses: send the whole conversation as input" if name != "reasoning" else "has none"
            raise ApiError(400, f"{name} is not supported: this server {reason}", name, code="unsupported_parameter")
        if name not in PASSED | READ | REFUSED.keys() | HARMLESS:
            raise ApiError(400, f"unrecognized request argument: {name}", name, code="unrecognized_parameter")
    chat = {name: body[name] for name in PASSED if name in body}
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") is not None else []
    chat["messages"] = messages + _messages(body.get("input"))
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    text_format = _text_format(body.get("text"))
    if text_format["type"] != "text":
        schema = {key: text_format.get(key) for key in ("name", "schema", "strict", "description")}
        chat["response_format"] = {"type": text_format["type"]} | (
            {"json_schema": schema} if text_format["type"] == "json_schema" else {}
        )
    if body.get("tools") is not None:
        chat["tools"] = [_tool(tool) for tool in _list(body["tools"], "tools")]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ApiError(
                400, 'tool_choice must be none, auto, required or {"type": "function", "name"}', "tool_choice"
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    if choice is not None:
        chat["tool_choice"] = choice
    include = _list(body.get("include") or [], "include")
    if any(value != LOGPROBS for value in include):
        raise ApiError(400, f"include may hold only {LOGPROBS!r} here", "include", code="unsupported_parameter")
    if include:
        chat["logprobs"] = True
    metadata = body.get("metadata") or {}
    echo = Echo(
        body.get("instructions"), body.get("max_output_tokens"), list(body.get("tools") or []),
        body.get("tool_choice") or "auto", flag(body, "parallel_tool_calls", True), text_format,
        body.get("top_logprobs"), dict(metadata) if isinstance(metadata, Mapping) else {},
    )  # fmt: skip
    return chat, echo


def renamed(error: ApiError) -> ApiError:
    """A chat error in this API's names (``input``, not ``messages``)."""
    if error.param in PARAMS:
        error.param = PARAMS[error.param]
    error.message = re.sub(r"\bmax_tokens\b", "max_output_tokens", error.message)
    return error


def _list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise ApiError(400, f"{name} must be a list", name)
    return value


def _messages(value: Any) -> list[dict[str, Any]]:
    """Chat messages from ``input``: a string, or a list of message, function_call and function_call_output items."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "input must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for item in value:
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind == "message" and isinstance(item.get("role"), str):
            content = item.get("content")
            if isinstance(content, list):
                content = [_text_part(part) for part in content]
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
            if not all(isinstance(value, str) for value in (call["id"], *call["function"].values())):
                raise ApiError(400, "a function_call item needs call_id, name and arguments as strings", "input")
            if messages and messages[-1]["role"] == "assistant":  # one assistant turn: its text, then its calls
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if isinstance(output, list):
                output = [_text_part(part) for part in output]
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            what = f"an item of type {kind!r}" if isinstance(kind, str) else "an item that is not a message"
            message = f"input holds {what}; this server reads messages, function_call and function_call_output items"
            raise ApiError(400, message, "input", code="unsupported_parameter" if isinstance(kind, str) else None)
    return messages


def _text_part(part: Any) -> Any:
    """A Responses text part as chat's; any other is left for chat's check to refuse by its type."""
    if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text")}
    return part


def _text_format(text: Any) -> dict[str, Any]:
    if text is None:
        return {"type": "text"}
    if not isinstance(text, Mapping) or set(text) - {"format", "verbosity"}:
        raise ApiError(400, "text must be an object with format", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError(400, "text.verbosity is not supported by this server", "text", code="unsupported_parameter")
    text_format = text.get("format") or {"type": "text"}
    if not isinstance(text_format, Mapping) or text_format.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "text.format.type must be text, json_object or json_schema", "text.format")
    return dict(text_format)


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        message = f"this server runs function tools only, got {kind!r}"
        raise ApiError(400, message, "tools", code="unsupported_parameter" if isinstance(kind, str) else None)
    keys = ("name", "description", "parameters", "strict")
    return {"type": "function", "function": {key: tool[key] for key in keys if tool.get(key) is not None}}


# -- the answer --------------------------------------------------------------------------------------------


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def response_object(
    api: ApiRequest,
    echo: Echo,
    response_id: str,
    output: list[dict[str, Any]],
    result: GenerationResult | None,
    error: ApiError | None = None,
) -> dict[str, Any]:
    """The Response: in progress while ``result`` is None, else completed or incomplete; failed with ``error``."""
    incomplete = result is not None and result.finish_reason == "length"
    status = "failed" if error else "in_progress" if result is None else "incomplete" if incomplete else "completed"
    sampling = api.serve.config.sampling
    body = {
        "id": response_id, "object": "response", "created_at": api.created, "status": status, "background": False,
        "error": None if error is None else {"code": error.code or error.kind, "message": error.message},
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": echo.instructions, "max_output_tokens": echo.max_output_tokens, "max_tool_calls": None,
        "model": api.model, "output": output, "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": False,
        "temperature": sampling.temperature, "text": {"format": echo.text_format}, "tool_choice": echo.tool_choice,
        "tools": echo.tools, "top_logprobs": echo.top_logprobs, "top_p": sampling.top_p, "truncation": "disabled",
        "usage": None if result is None else usage(api, result), "metadata": echo.metadata,
    }  # fmt: skip
    return body | ({} if result is None else {"speculation": speculation(result)})


def usage(api: ApiRequest, result: GenerationResult) -> dict[str, Any]:
    input_tokens, output_tokens = len(api.serve.prompt_ids), len(result.token_ids)
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": result.stats.cached_prompt_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(item_id: str, text: str | None, logprobs: list[Any] | None, status: str) -> dict[str, Any]:
    """The assistant's message; ``text`` None: opened, no part yet."""
    content = [] if text is None else [output_text(text, logprobs)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def output_text(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []} | (
        {} if logprobs is None else {"logprobs": logprobs}
    )


def call_item(call: Mapping[str, Any], arguments: str | None = None, status: str = "completed") -> dict[str, Any]:
    """A chat tool call as a function_call item (``arguments``: what to show of its arguments, all by default)."""
    function = call["function"]
    return {
        "type": "function_call", "id": f"fc_{call['id'].removeprefix('call_')}", "call_id": call["id"],
        "name": function["name"], "arguments": function["arguments"] if arguments is None else arguments,
        "status": status,
    }  # fmt: skip


def output_items(api: ApiRequest, result: GenerationResult, spell: Callable[[int], tuple[str, bytes]]) -> list[Any]:
    """A whole answer's output: its message (unless it is only calls), then its calls."""
    content, calls = split_calls(result.text, api.tools.names) if api.tools else (result.text, [])
    status = "incomplete" if result.finish_reason == "length" else "completed"
    chosen = logprobs_body(api, result.logprobs or [], spell)
    message = (
        [] if calls and not content else [message_item(f"msg_{uuid.uuid4().hex}", content, _content(chosen), status)]
    )
    return message + [call_item(call) for call in calls]


def _content(logprobs: dict[str, Any] | None) -> list[Any] | None:
    return None if logprobs is None else logprobs["content"]


async def stream_events(
    api: ApiRequest,
    echo: Echo,
    events: asyncio.Queue[Event],
    track: Any,
    spell: Callable[[int], tuple[str, bytes]],
) -> AsyncIterator[str]:
    """The answer's events as server-sent events (the rules above); ``track``: the app's tracker of the request's
    time left (``seconds_left``, ``timeout``)."""
    response_id, message_id, numbers = new_response_id(), f"msg_{uuid.uuid4().hex}", itertools.count()
    calls = CallFilter() if api.tools else None
    text, chosen, opened = "", [], False

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(numbers)} | fields
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def in_progress() -> dict[str, Any]:
        return response_object(api, echo, response_id, [], None)

    def opening(logprobs: bool) -> list[str]:
        """The message and its text part, opened at the answer's first text (once)."""
        nonlocal opened
        if opened:
            return []
        opened, item = True, message_item(message_id, None, None, "in_progress")
        part = output_text("", [] if logprobs else None)
        return [
            event("response.output_item.added", output_index=0, item=item),
            event("response.content_part.added", item_id=message_id, output_index=0, content_index=0, part=part),
        ]

    def delta_event(delta: str, logprobs: list[Any] | None) -> str:
        fields = {} if logprobs is None else {"logprobs": logprobs}
        return event("response.output_text.delta", item_id=message_id, output_index=0, content_index=0, delta=delta,
                     **fields)  # fmt: skip

    yield event("response.created", response=in_progress())
    yield event("response.in_progress", response=in_progress())
    wanted = api.serve.config.logprobs is not None
    while True:
        try:
            engine_event = await asyncio.wait_for(events.get(), track.seconds_left())
        except TimeoutError:
            engine_event = track.timeout()
        if isinstance(engine_event, TokenDelta):
            logprobs = _content(logprobs_body(api, engine_event.logprobs, spell)) if wanted else None
            delta = engine_event.text if calls is None else calls.feed(engine_event.text)
            text, chosen = text + delta, chosen + (logprobs or [])
            if delta or logprobs:
                for sent in [*opening(wanted), delta_event(delta, logprobs)]:
                    yield sent
            continue
        if isinstance(engine_event, RequestFinished):
            result, found = engine_event.result, []
            if calls is not None and api.tools is not None:
                content, found = split_calls(calls.text, api.tools.names)
                if content[calls.sent :]:  # the held text that was no call
                    for sent in [*opening(wanted), delta_event(content[calls.sent :], None)]:
                        yield sent
                    text = content
            output: list[dict[str, Any]] = []
            if opened or not found:
                for sent in opening(wanted):  # an answer with no text still has its message
                    yield sent
                status = "incomplete" if result.finish_reason == "length" else "completed"
                part = output_text(text, chosen if wanted else None)
                ids = {"item_id": message_id, "output_index": 0, "content_index": 0}
                done_fields = {} if not wanted else {"logprobs": chosen}
                yield event("response.output_text.done", **ids, text=text, **done_fields)
                yield event("response.content_part.done", **ids, part=part)
                output.append(message_item(message_id, text, chosen if wanted else None, status))
                yield event("response.output_item.done", output_index=0, item=output[-1])
            for call in found:
                index, item = len(output), call_item(call)
                yield event("response.output_item.added", output_index=index, item=call_item(call, "", "in_progress"))
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=item["arguments"])  # fmt: skip
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=item["name"], arguments=item["arguments"])  # fmt: skip
                output.append(item)
                yield event("response.output_item.done", output_index=index, item=item)
            finished = response_object(api, echo, response_id, output, result)
            kind = "response.incomplete" if finished["status"] == "incomplete" else "response.completed"
            yield event(kind, response=finished)
            return
        error = failure(engine_event) if isinstance(engine_event, RequestFailed) else engine_event
        yield event("response.failed", response=response_object(api, echo, response_id, [], None, error))
        return
