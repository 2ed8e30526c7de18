"""What a request body asks the model to read: a completion's prompt, or a chat's messages as chat templates take
them (roles of :data:`ROLES`, text content or text parts, earlier tool calls and results)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quickdraft.server.errors import ApiError
from quickdraft.server.fields import text_parts
from quickdraft.server.tool_formats import ToolFormat
from quickdraft.server.tools import template_message

ROLES = ("system", "developer", "user", "assistant", "tool")  # as chat templates render them; developer = system


def prompt_batch(body: Any) -> list[Any] | None:
    """A completion body's prompts where it gives several (a list of texts or of token-id lists, each checked as one
    prompt when its request is read); None for one prompt, or a body that is not an object (refused when read)."""
    prompt = body.get("prompt") if isinstance(body, Mapping) else None
    several = isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(item, str | list) for item in prompt)
    return prompt if several else None


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


def chat_messages(body: Mapping[str, Any], found: ToolFormat | None = None) -> list[dict[str, Any]]:
    """A chat body's messages, checked, as the chat template takes them (its tool-call format ``found`` renders
    earlier tool turns: :func:`template_message`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    parsed, called = [], {}  # called: each earlier call's id -> its function's name
    answered: set[str] | None = None  # the ids of the calls tool messages may answer now (None: no call to answer)
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ApiError(400, "every message needs a role and a content", "messages")
        if message["role"] not in ROLES:
            raise ApiError(400, f"unknown message role {message['role']!r}; roles: {', '.join(ROLES)}", "messages")
        content = message.get("content")
        if content is None and message["role"] == "assistant" and message.get("tool_calls"):
            content = ""  # an assistant turn that only called tools
        if isinstance(content, list):  # content parts: text only, a line each (as vLLM joins them)
            article = "an" if message["role"] == "assistant" else "a"
            content = text_parts(content, f"{article} {message['role']} message", "messages", "\n")
        if not isinstance(content, str):
            raise ApiError(400, "a message's content must be text", "messages")
        role = "system" if message["role"] == "developer" else message["role"]
        if role == "tool":
            check_answer(message.get("tool_call_id"), answered)
        parsed.append(template_message({**message, "role": role}, content, called, found))
        calls = (message.get("tool_calls") if role == "assistant" else None) or []  # checked by template_message
        if role != "tool":
            answered = {call.get("id") for call in calls} if calls else None
        for call in calls:
            if isinstance(call.get("id"), str):
                called[call["id"]] = call["function"]["name"]
    if not any(message["content"].strip() for message in parsed):
        raise ApiError(400, "the prompt is empty: the messages hold no text", "messages")
    return parsed


def check_answer(call_id: Any, answered: set[Any] | None) -> None:
    """A tool message answers a call of the assistant message before it (other tool messages between), by its
    ``tool_call_id`` where that message's calls have ids, as OpenAI requires."""
    if answered is None:
        raise ApiError(400, "a tool message must answer a call in the assistant message's tool_calls before it",
                       "messages")  # fmt: skip
    ids = {known for known in answered if isinstance(known, str)}
    if ids and isinstance(call_id, str) and call_id not in ids:
        message = f"a tool message's tool_call_id {call_id!r} answers no call of the assistant message before it"
        raise ApiError(400, message, "messages")
