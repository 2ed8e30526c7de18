"""What a request body asks the model to read: a completion's prompt, or a chat's messages as chat templates take
them (roles of :data:`ROLES`, text content or text parts, earlier tool calls and results).

Earlier turns: an assistant message's ``tool_calls`` (arguments as JSON text) and ``tool`` messages go to the template
as it expects them (arguments as objects; where a format's templates read calls as the model writes them, so
written: after the turn's content for Granite 3's, in a ``function_calls`` field for OLMo 3's; results under the
format's role).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from quickdraft.server.errors import ApiError
from quickdraft.server.fields import check_keys, text_parts
from quickdraft.server.tool_formats import ToolFormat

ROLES = ("system", "developer", "user", "assistant", "tool")  # as chat templates render them; developer = system
# the keys a message of each role may have: OpenAI's, the reasoning_content a thinking model's answer gave, and the
# parsed answer the openai client's parse() adds to a message (its content, as an object: read from content here)
ROLE_KEYS = {
    "assistant": ("tool_calls", "reasoning_content", "refusal", "annotations", "audio", "function_call", "parsed"),
    "tool": ("tool_call_id",),
}
UNSUPPORTED = {  # an assistant message's fields this server cannot render, with what to send instead
    "audio": "this server reads text only: give the audio's transcript as content",
    "function_call": "give the call in tool_calls, as OpenAI's tools do",
}


def prompt_batch(body: Mapping[str, Any]) -> list[Any] | None:
    """A completion body's prompts where it gives several (a list of texts or one of token-id lists, as OpenAI's, each
    checked as one prompt when its request is read); None for one prompt, or for a list that mixes texts and lists
    (refused as no prompt when read)."""
    prompt = body.get("prompt")
    several = isinstance(prompt, list) and len(prompt) > 1
    return prompt if several and {type(item) for item in prompt} in ({str}, {list}) else None


def prompt_of(body: Mapping[str, Any]) -> str | list[int]:
    """A completion body's one prompt: text, or token ids (a list of several is answered prompt by prompt:
    :func:`prompt_batch`)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt  # token ids
    raise ApiError(400, "prompt must be a non-empty string or a list of token ids, or a list of such prompts", "prompt")


def chat_messages(
    body: Mapping[str, Any], found: ToolFormat | None = None, answered: bool = True
) -> list[dict[str, Any]]:
    """A chat body's messages, checked, as the chat template takes them (its tool-call format ``found`` renders
    earlier tool turns: :func:`template_message`). ``answered``: every call has a tool message with its result, as a
    request to answer the conversation needs (counting its tokens does not)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    parsed, called = [], {}  # called: each earlier call's id -> its function's name
    made_calls = False  # an earlier assistant message called tools: a tool message has something to answer
    answers: set[str] = set()  # the ids the tool messages answer
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ApiError(400, "every message needs a role and a content", "messages")
        if message["role"] not in ROLES:
            raise ApiError(400, f"unknown message role {message['role']!r}; roles: {', '.join(ROLES)}", "messages")
        content = check_message(message, f"messages[{index}]")
        if content is None and message["role"] == "assistant" and message.get("tool_calls"):
            content = ""  # an assistant turn that only called tools
        if isinstance(content, list):  # content parts: text only, a line each (as vLLM joins them)
            if message["role"] == "assistant":  # a refusal part is what the model said, as a message's refusal is
                content = [refusal_as_text(part) for part in content]
            article = "an" if message["role"] == "assistant" else "a"
            content = text_parts(content, f"{article} {message['role']} message", "messages", "\n")
        if not isinstance(content, str):
            raise ApiError(400, "a message's content must be text", "messages")
        role = "system" if message["role"] == "developer" else message["role"]
        if role == "tool":
            check_answer(message.get("tool_call_id"), made_calls, called)
            if isinstance(message.get("tool_call_id"), str):
                answers.add(message["tool_call_id"])
        parsed.append(template_message({**message, "role": role}, content, called, found))
        calls = (message.get("tool_calls") if role == "assistant" else None) or []  # checked by template_message
        made_calls = made_calls or bool(calls)
        for call in calls:
            if isinstance(call.get("id"), str):
                called[call["id"]] = call["function"]["name"]
    if answered and (unanswered := [call_id for call_id in called if call_id not in answers]):  # OpenAI's rule
        message = f"the tool call {unanswered[0]!r} has no tool message with its result: give each call's result"
        raise ApiError(400, message, "messages")
    if not any(message["content"].strip() for message in parsed):
        raise ApiError(400, "the prompt is empty: the messages hold no text", "messages")
    return parsed


def check_message(message: Mapping[str, Any], where: str) -> Any:
    """The message's content, its other fields checked: each one its role may have (an unknown one is refused, not
    dropped), ``name`` text, nothing in the fields this server cannot render (:data:`UNSUPPORTED`), and an
    assistant's ``refusal`` its content where it has none (what it said, as the model reads it)."""
    check_keys(message, ("role", "content", "name", *ROLE_KEYS.get(message["role"], ())), where)
    if message.get("name") is not None and not isinstance(message["name"], str):
        raise ApiError(400, "a message's name must be text", f"{where}.name")
    for name, instead in UNSUPPORTED.items():
        if message.get(name) is not None:
            message_text = f"an assistant message's {name} is not supported: {instead}"
            raise ApiError(400, message_text, f"{where}.{name}", code="unsupported_parameter")
    content, refusal = message.get("content"), message.get("refusal")
    if refusal is not None and (not isinstance(refusal, str) or content not in (None, "")):
        raise ApiError(400, "an assistant message's refusal is text, given in place of content", f"{where}.refusal")
    return refusal if refusal is not None else content


def refusal_as_text(part: Any) -> Any:
    """An assistant's ``{"type": "refusal", "refusal": ...}`` part as a text part; any other part as it is."""
    if isinstance(part, Mapping) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    return part


def check_answer(call_id: Any, made_calls: bool, called: Mapping[str, str]) -> None:
    """A tool message answers a call an earlier assistant message made, by its ``tool_call_id`` (text) where the
    calls have ids. Not necessarily the message just before: a Responses API conversation may put an assistant's text or
    reasoning between a call and its output."""
    if not made_calls:
        message = "a tool message must answer a call in an earlier assistant message's tool_calls"
        raise ApiError(400, message, "messages")
    if called and not isinstance(call_id, str):  # the calls have ids: OpenAI's tool message names the one it answers
        raise ApiError(400, "a tool message needs the tool_call_id of the call it answers, as text", "messages")
    if called and call_id not in called:
        message = f"a tool message's tool_call_id {call_id!r} answers no call of an earlier assistant message"
        raise ApiError(400, message, "messages")


def template_message(
    message: Mapping[str, Any], content: str, called: Mapping[str, str] | None = None, found: ToolFormat | None = None
) -> dict[str, Any]:
    """An earlier turn as chat templates take it: its ``name`` where given; an assistant's calls with their arguments
    as objects; a tool message's result as its content, with its ``tool_call_id`` and the called function's ``name``
    (the client's, or the one ``called`` maps its ``tool_call_id`` to: Hermes' templates need it, OpenAI's messages
    lack it). In the
    template's format ``found``: a tool message under the format's role, and an assistant's calls as the model writes
    them where the format's templates read them so (:attr:`ToolFormat.spelled_into`: after its content for Granite
    3's, a ``function_calls`` field for OLMo 3's)."""
    rendered: dict[str, Any] = {"role": message["role"], "content": content}
    if isinstance(message.get("name"), str):
        rendered["name"] = message["name"]  # the participant's: a template may render it
    if message["role"] == "assistant" and isinstance(message.get("reasoning_content"), str):
        rendered["reasoning_content"] = message["reasoning_content"]  # Qwen3's template renders it in tool loops
    calls = message.get("tool_calls")
    if message["role"] == "assistant" and calls:
        if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
            raise ApiError(400, "an assistant's tool_calls must be OpenAI's function calls", "messages")
        rendered["tool_calls"] = [
            {"type": "function", "id": call.get("id"), "function": {
                "name": call["function"]["name"], "arguments": _arguments(call["function"].get("arguments"))}}
            for call in calls
        ]  # fmt: skip
    if message["role"] == "tool":
        call_id, name = message.get("tool_call_id"), message.get("name")
        if call_id is not None:
            rendered["tool_call_id"] = call_id
        if not isinstance(name, str):
            name = (called or {}).get(call_id) if isinstance(call_id, str) else None
        if name is not None:
            rendered["name"] = name
        if found is not None:
            rendered["role"] = found.tool_role
    if found is not None and found.spelled_into and "tool_calls" in rendered:
        if not all(isinstance(call["function"]["arguments"], dict) for call in rendered["tool_calls"]):
            raise ApiError(400, "a tool call's arguments must be a JSON object", "messages")
        spelled = found.spelled(rendered.pop("tool_calls"))
        if found.spelled_into == "content":
            rendered["content"] = content + spelled
        else:
            rendered[found.spelled_into] = spelled
    return rendered


def _is_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, Mapping) else None
    return isinstance(function, Mapping) and isinstance(function.get("name"), str)


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ApiError(400, "a tool call's arguments must be JSON text", "messages") from None
    return arguments if arguments is not None else {}
