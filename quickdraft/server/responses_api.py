"""OpenAI's Responses API (``/v1/responses``) over the chat path, the request: translated to the chat request it
means and validated as one (:func:`quickdraft.server.protocol.parse_request`); the answer is
:mod:`quickdraft.server.responses_output`'s.

Rules:
- ``input`` is a string (one user message) or a list of items: messages (role user, system, developer or assistant;
  content text or ``input_text`` / ``output_text`` parts; ``type`` message or null), ``function_call`` items (the
  assistant's calls; consecutive ones, and those after an assistant message, are one assistant turn),
  ``function_call_output`` items (tool messages, each after the function_call with its call_id) and ``reasoning``
  items (a thinking model's reasoning, as its answers give it: the ``reasoning_content`` of the assistant turn that
  follows; one with no ``reasoning_text`` is left out).
  ``instructions`` is a system message before them (``""``: none).
- ``max_output_tokens`` is chat's ``max_tokens``; ``text.format`` (text, json_object, json_schema) its
  ``response_format``; function ``tools`` (flat: name, description, parameters, strict: true unless false) and
  ``tool_choice`` (auto, none, required, ``{"type": "function", "name"}``) its tools;
  ``include: ["message.output_text.logprobs"]`` or ``top_logprobs`` its log-probabilities. quickdraft's extras,
  ``seed``, ``stop`` and ``chat_template_kwargs`` pass as in chat.
- This server keeps no responses: ``store`` true, ``previous_response_id``, ``conversation`` and ``background`` are
  refused (send the whole conversation as ``input``), as are reasoning settings (effort, summaries), prompt
  templates, ``max_tool_calls``, ``truncation`` auto, context management, hosted tools, other ``include`` values and
  parts that are not text, each with its reason. A null field asks for nothing. Every Response says ``store: false``.
- A chat error names this API's fields (``input``, ``max_output_tokens``, ``text.format``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quickdraft.server.errors import ApiError, no_endpoint
from quickdraft.server.fields import HARMLESS, check_harmless, check_keys, flag
from quickdraft.server.tool_checks import FUNCTION_KEYS, SHAPE

MESSAGE_ROLES = ("user", "system", "developer", "assistant")  # a tool's result is a function_call_output item
LOGPROBS = "message.output_text.logprobs"  # the one ``include`` value this server answers
PASSED = frozenset({
    "model", "temperature", "top_p", "stream", "stream_options", "parallel_tool_calls", "top_logprobs",
    # quickdraft's extras and chat's, as chat reads them
    "seed", "stop", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "drafter",
    "policy", "num_draft_tokens", "max_draft_tokens", "regex", "grammar", "cache_prompt", "prediction",
    "chat_template_kwargs",
})  # fmt: skip
READ = frozenset({"input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "include",
                  "metadata", "reasoning"})  # fmt: skip
CHOICES = {"truncation": ("auto", "disabled")}  # OpenAI's values
ECHOED = ("user", "safety_identifier", "prompt_cache_key")  # repeated in the Response as sent, as OpenAI does
STRICT = True  # a function tool's strict when not given: the Responses API's default, unlike chat's
RAN_AT = "default"  # the service_tier a Response says it ran at, as OpenAI's says the tier it used: this server has one
# what this server cannot do (it keeps no responses, runs no hosted tools, no reasoning), why, and the values that ask
# for none of it
KEEPS_NONE = "this server keeps no responses: send the whole conversation as input"
KEPT_RESPONSE = "/v1/responses/{response_id:path}"  # retrieving, deleting or cancelling one: a 404 here
OTHER_ENDPOINTS = ("input_tokens", "compact")  # the Responses API's endpoints under that path (counting, compacting)
REFUSED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "store": (KEEPS_NONE, (False,)), "previous_response_id": (KEEPS_NONE, ()), "conversation": (KEEPS_NONE, ()),
    "background": ("this server answers while the client waits", (False,)),
    "prompt": ("this server keeps no prompt templates: send the prompt as input", ()),
    "max_tool_calls": ("this server does not count an answer's calls", ()),
    "truncation": ("this server does not cut a conversation to fit: a prompt that does not fit is refused",
                   ("disabled",)),
    "context_management": ("this server does not compact a conversation", ()),
}  # fmt: skip
TOOL_EXTRAS: dict[str, tuple[Callable[[Any], bool], str, str | None]] = {  # a function tool's keys beyond chat's:
    # which values ask for nothing here, why others cannot be, and their code. output_schema describes what the tool
    # returns, for which chat templates have no place: a model here never sees it
    "defer_loading": (lambda value: value is False, "this server does not search tools: send each tool loaded",
                      "unsupported_parameter"),
    "allowed_callers": (lambda value: isinstance(value, list) and "direct" in value,
                        "this server's model calls a tool directly, or not at all", "unsupported_parameter"),
    "output_schema": (lambda value: isinstance(value, Mapping), "must be a JSON schema object", None),
}  # fmt: skip
ITEM_KEYS = {  # the keys of each input item this server reads (OpenAI's; what describes a past turn passes)
    "message": ("type", "role", "content", "id", "status", "phase"),
    "function_call": ("type", "call_id", "name", "arguments", "id", "status", "namespace", "caller", "async"),
    "function_call_output": ("type", "call_id", "output", "id", "status", "name", "namespace", "caller"),
    "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status"),
}
PART_KEYS = {"input_text": ("type", "text", "prompt_cache_breakpoint"), "output_text": ("type", "text", "annotations",
                                                                                          "logprobs")}  # fmt: skip
PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format"}
CHAT_NAMES = (  # chat's names in its messages -> this API's
    (r"response_format\.json_schema\.", "text.format."), (r"response_format\.json_schema\b", "text.format"),
    (r"\bresponse_format \(json\)", "text.format"),
    (r"\bresponse_format\b", "text.format"), (r"\bmax_tokens\b", "max_output_tokens"),
    (r"^messages must be a non-empty list of \{role, content\} objects$", "input holds no message to answer"),
    (r"\bthe messages hold\b", "input holds"), (r"^a tool message\b", "a function_call_output"),
    (re.escape(SHAPE), 'tools must be a list of {"type": "function", "name", "parameters"}'),
)  # fmt: skip


@dataclass(frozen=True)
class Echo:
    """What a Response repeats of its request."""

    instructions: str | None
    max_output_tokens: int | None
    tools: list[Any]
    tool_choice: Any
    parallel_tool_calls: bool
    text: dict[str, Any]  # its format and verbosity
    top_logprobs: int | None
    metadata: dict[str, Any]
    given: dict[str, Any] = field(default_factory=dict)  # the fields that change nothing here, as sent (user, ...)


def chat_request(body: Any) -> tuple[dict[str, Any], Echo]:
    """The chat completion body a Responses request means, and what its Response repeats; raises :class:`ApiError`
    for what it cannot mean here (the rules above)."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the request body must be a JSON object")
    check_harmless(body)  # a mistyped value is wrong before it is unsupported: store "false" is no boolean
    flag(body, "background", False)
    options = body.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage") is not None:  # chat's; usage is always here
        message = "unrecognized stream option 'include_usage': a response's usage is in its response.completed event"
        raise ApiError(400, message, "stream_options.include_usage", code="unrecognized_parameter")
    for name, allowed in CHOICES.items():
        if body.get(name) is not None and body[name] not in allowed:
            raise ApiError(400, f"{name} must be {' or '.join(allowed)}, got {body[name]!r}", name)
    for name, value in body.items():
        if value is None:  # a null field asks for nothing
            continue
        if name in REFUSED and not any(
            value == allowed and type(value) is type(allowed) for allowed in REFUSED[name][1]
        ):
            raise ApiError(400, f"{name} is not supported: {REFUSED[name][0]}", name, code="unsupported_parameter")
        if name not in PASSED | READ | REFUSED.keys() | HARMLESS:
            raise ApiError(400, f"unrecognized request argument: {name}", name, code="unrecognized_parameter")
    reasoning = body.get("reasoning")
    if reasoning is not None and not (isinstance(reasoning, Mapping) and all(v is None for v in reasoning.values())):
        message = "reasoning is not supported: this server does not set a model's reasoning effort or summarize it"
        raise ApiError(400, message, "reasoning", code="unsupported_parameter")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "instructions must be text", "instructions")
    chat = {name: body[name] for name in PASSED if body.get(name) is not None}
    chat["messages"] = [{"role": "system", "content": instructions}] if instructions else []  # "": none
    chat["messages"] += _messages(body.get("input"))
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    text = _text(body.get("text"))
    text_format = text["format"]
    if text_format["type"] != "text":
        schema = {key: value for key, value in text_format.items() if key != "type"}  # each checked as chat's
        chat["response_format"] = {"type": text_format["type"]} | (
            {"json_schema": schema} if text_format["type"] == "json_schema" else {}
        )
    tools = _list(body["tools"], "tools") if body.get("tools") is not None else []
    if body.get("tools") is not None:
        chat["tools"] = [_tool(tool, index) for index, tool in enumerate(tools)]
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
    if include or body.get("top_logprobs") is not None:  # top_logprobs alone asks for them too
        chat["logprobs"] = True
    echoed_tools = [dict(tool) | {"strict": chat_tool["function"]["strict"]}  # as it ran: its default filled in
                    for tool, chat_tool in zip(tools, chat.get("tools", []), strict=True)]  # fmt: skip
    echo = Echo(
        instructions, body.get("max_output_tokens"), echoed_tools, body.get("tool_choice") or "auto",
        flag(body, "parallel_tool_calls", True), text, body.get("top_logprobs"), dict(body.get("metadata") or {}),
        {name: body[name] for name in ECHOED if body.get(name) is not None} | {"service_tier": RAN_AT},
    )  # fmt: skip
    return chat, echo


def renamed(error: ApiError) -> ApiError:
    """A chat error in this API's names (``input``, not ``messages``)."""
    if error.param in PARAMS:
        error.param = PARAMS[error.param]
    for chat_name, name in CHAT_NAMES:
        error.message = re.sub(chat_name, name, error.message)
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
    call_ids: set[str] = set()
    answered: set[str] = set()
    for index, item in enumerate(value):
        kind = (item.get("type") or "message") if isinstance(item, Mapping) else None  # the SDK sends type null
        if kind in ITEM_KEYS:
            check_keys(item, ITEM_KEYS[kind], f"input[{index}]")
        if kind == "message" and item.get("role") not in MESSAGE_ROLES:
            message = f"a message item's role is {', '.join(MESSAGE_ROLES)}, got {item.get('role')!r}"
            if item.get("role") == "tool":
                message += "; a tool's result is a function_call_output item"
            raise ApiError(400, message, "input")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = [_text_part(part, f"input[{index}].content[{at}]") for at, part in enumerate(content)]
            if item["role"] == "assistant" and _reasoning_only(messages):  # the reasoning's turn gets its text
                messages[-1]["content"] = content
            else:
                messages.append({"role": item["role"], "content": content})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": item.get("arguments")}
            if not all(isinstance(value, str) for value in (call["id"], *call["function"].values())):
                raise ApiError(400, "a function_call item needs call_id, name and arguments as strings", "input")
            if call["id"] in call_ids:  # its output could not say which call it answers
                raise ApiError(400, f"two function_call items have the call_id {call['id']!r}", "input")
            call_ids.add(call["id"])
            if messages and messages[-1]["role"] == "assistant":  # one assistant turn: its text, then its calls
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "reasoning":
            text = _reasoning_text(item.get("content"))
            if text and _reasoning_only(messages):  # one turn's reasoning in several items
                messages[-1]["reasoning_content"] += text
            elif text:
                messages.append({"role": "assistant", "content": "", "reasoning_content": text})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ApiError(400, "a function_call_output item needs the call_id of its call", "input")
            if item["call_id"] not in call_ids:  # this server keeps no responses: the call is in input or nowhere
                message = f"no function_call item before the function_call_output with call_id {item['call_id']!r}"
                raise ApiError(400, message, "input")
            output = item.get("output")
            if isinstance(output, list):
                output = [_text_part(part, f"input[{index}].output[{at}]") for at, part in enumerate(output)]
            elif not isinstance(output, str):
                message = f"a function_call_output's output must be text or a list of text parts, got {output!r}"
                raise ApiError(400, message, "input")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            answered.add(item["call_id"])
        else:
            what = f"an item of type {kind!r}" if isinstance(kind, str) else "an item that is not a message"
            readable = "message, function_call, function_call_output and reasoning items"
            message = f"input holds {what}; this server reads {readable}"
            raise ApiError(400, message, "input", code="unsupported_parameter" if isinstance(kind, str) else None)
    if unanswered := sorted(call_ids - answered):  # as OpenAI: each call's output is in the input
        message = f"no function_call_output item for the function_call with call_id {unanswered[0]!r}"
        raise ApiError(400, f"{message}: give each call's output", "input")
    return messages


def _reasoning_only(messages: list[dict[str, Any]]) -> bool:
    """Whether the last message is an assistant turn holding only a reasoning item's text so far."""
    last = messages[-1] if messages else {}
    alone = not last.get("content") and "tool_calls" not in last
    return last.get("role") == "assistant" and "reasoning_content" in last and alone


def _reasoning_text(content: Any) -> str:
    """A reasoning item's text: its ``reasoning_text`` parts, joined (its summary and encrypted content are not the
    reasoning itself)."""
    if content is None:
        return ""
    parts = content if isinstance(content, list) else None
    if parts is None or not all(isinstance(part, Mapping) and isinstance(part.get("text"), str) for part in parts):
        raise ApiError(400, 'a reasoning item\'s content must be a list of {"type": "reasoning_text", "text"}', "input")
    return "".join(part["text"] for part in parts if part.get("type") == "reasoning_text")


def _text_part(part: Any, where: str) -> Any:
    """A Responses text part as chat's (its keys checked); any other is left for chat's check to refuse by its type."""
    if isinstance(part, Mapping) and part.get("type") in PART_KEYS:
        check_keys(part, PART_KEYS[part["type"]], where)
        return {"type": "text", "text": part.get("text")}
    return part


def _text(text: Any) -> dict[str, Any]:
    """``text``: its format (text by default) and verbosity, checked."""
    if text is None:
        return {"format": {"type": "text"}}
    if not isinstance(text, Mapping) or set(text) - {"format", "verbosity"}:
        raise ApiError(400, "text must be an object with format", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise ApiError(400, "text.verbosity is not supported by this server", "text", code="unsupported_parameter")
    text_format = text.get("format") or {"type": "text"}
    if not isinstance(text_format, Mapping) or text_format.get("type") not in ("text", "json_object", "json_schema"):
        raise ApiError(400, "text.format.type must be text, json_object or json_schema", "text.format")
    return {"format": dict(text_format)} | ({"verbosity": text["verbosity"]} if text.get("verbosity") else {})


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        message = f"this server runs function tools only, got {kind!r}"
        raise ApiError(400, message, "tools", code="unsupported_parameter" if isinstance(kind, str) else None)
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise ApiError(400, 'a function tool needs a name: {"type": "function", "name", "parameters"}', "tools")
    check_keys(tool, ("type", *FUNCTION_KEYS, *TOOL_EXTRAS), f"tools[{index}]")
    for key, (asks_nothing, reason, code) in TOOL_EXTRAS.items():
        if tool.get(key) is not None and not asks_nothing(tool[key]):
            raise ApiError(400, f"tools[{index}].{key}: {reason}", f"tools[{index}].{key}", code=code)
    function = {key: tool[key] for key in FUNCTION_KEYS if tool.get(key) is not None}
    return {"type": "function", "function": {"strict": STRICT} | function}


def no_kept_response(response_id: str) -> ApiError:
    """The 404 of a request for a kept response (``/v1/responses/{id}...``): this server keeps none. The Responses
    API's own endpoints under that path (:data:`OTHER_ENDPOINTS`) are not served here, and their 404 says so."""
    name = response_id.split("/")[0]
    if name in OTHER_ENDPOINTS:
        return no_endpoint(f"/v1/responses/{name}")
    return ApiError(404, f"no response {name!r}: {KEEPS_NONE}", "response_id")
