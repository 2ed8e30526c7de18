"""Tool calls, OpenAI's semantics over a chat template's Hermes format (``<tool_call>{"name", "arguments"}
</tool_call>``, as Qwen2.5 and Qwen3 write them).

Rules:
- ``tools`` are rendered by the model's chat template; a template without the Hermes tags cannot take them (400).
- ``tool_choice``: ``auto`` (the default with tools) lets the model answer or call; ``none`` renders no tools and
  parses no calls; ``required`` and a named function constrain the answer to calls of the offered functions (of
  that function): one or more blocks, one with ``parallel_tool_calls`` false, each call's arguments following its
  function's JSON schema (structured output).
- A call is parsed from the answer's text: each ``<tool_call>`` block holding a JSON object with a known ``name``;
  the text before the first block is the message's content. Without such blocks, an answer that is nothing but
  one JSON object (bare or in a json fence) naming an offered function and its ``arguments`` is a call too:
  Qwen2.5-Coder answers so. An answer with calls finishes as :meth:`ToolRequest.finish_reason` says.
- Streamed, the content goes out as it comes except what may open a call (all of an answer that opens with
  ``{`` or a json fence); the calls go out whole at the end.
- Earlier turns: an assistant message's ``tool_calls`` (arguments as JSON text) and ``tool`` messages go to the
  template as it expects them (arguments as objects).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quickdraft.grammar import GrammarKind, GrammarSpec, xgrammar_reason
from quickdraft.server.errors import ApiError

OPEN_TAG, CLOSE_TAG, FENCE = "<tool_call>", "</tool_call>", "```json"
MAX_TOOLS = 128  # OpenAI's limit of functions per request
CALL = re.compile(re.escape(OPEN_TAG) + r"\s*(.*?)\s*" + re.escape(CLOSE_TAG), re.DOTALL)
WHOLE = re.compile(r"\s*(?:```json\s*(\{.*\})\s*```|(\{.*\}))\s*", re.DOTALL)  # an answer that is one object


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools (OpenAI's ``tools`` entries) and how it may use them."""

    tools: tuple[dict[str, Any], ...]
    choice: str  # "auto", "required", or the one function's name
    names: frozenset[str]
    parallel: bool = True  # OpenAI's parallel_tool_calls: several calls may come in one answer

    def finish_reason(self, reason: str, called: bool) -> str:
        """The engine's finish ``reason`` of an answer that ``called`` functions, or not: a cut answer stays
        "length" (its last call may be cut off); calls end with "tool_calls", except a named function's, which
        OpenAI ends with "stop"."""
        if not called or reason == "length":
            return reason
        return "stop" if self.choice not in ("auto", "required") else "tool_calls"

    def grammar(self) -> GrammarSpec | None:
        """The constraint of ``required`` or a named function: a call (one or more where ``parallel``, each in its
        own tags, a newline between them), its arguments by the function's schema."""
        if self.choice == "auto":
            return None
        chosen = [tool for tool in self.tools if self.choice == "required" or tool["function"]["name"] == self.choice]
        schema = {"anyOf": [call_schema(tool["function"]) for tool in chosen]}
        try:
            import xgrammar
        except ImportError:
            raise ApiError(400, "tool_choice required needs xgrammar: pip install 'quickdraft[serve]'") from None
        try:
            call = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)
        except (RuntimeError, ValueError) as error:  # xgrammar's word on a schema it cannot follow
            message = f"a tool's parameters are not a JSON schema a call can follow: {xgrammar_reason(error)}"
            raise ApiError(400, message, "tools") from None
        opening, closing = (
            xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(tag)}") for tag in (OPEN_TAG + "\n", "\n" + CLOSE_TAG)
        )
        block = str(xgrammar.Grammar.concat(opening, call, closing))
        if not self.parallel:
            return GrammarSpec(GrammarKind.EBNF, block)
        renamed = re.sub(r"^root ::=", "tool_call_block ::=", block, count=1, flags=re.MULTILINE)
        return GrammarSpec(GrammarKind.EBNF, f'{renamed}\nroot ::= tool_call_block ("\\n" tool_call_block)*\n')


def call_schema(function: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call of ``function``: its name and its arguments."""
    arguments = function.get("parameters") or {"type": "object"}
    properties = {"name": {"const": function["name"]}, "arguments": arguments}
    return {"type": "object", "properties": properties, "required": ["name", "arguments"]}


def parse_tools(body: Mapping[str, Any], template: str) -> ToolRequest | None:
    """The request's tools, checked; None without tools or with ``tool_choice`` none. Earlier tool turns need a
    template that renders them."""
    tools, choice = body.get("tools") or [], body.get("tool_choice")
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    tool_turns = any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)
    if (tools or tool_turns) and OPEN_TAG not in template:
        message = "this model's chat template has no tool-call format quickdraft reads (Hermes <tool_call> tags)"
        raise ApiError(400, message, "tools" if tools else "messages")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(_is_function(tool) for tool in tools):
        message = 'tools must be a list of {"type": "function", "function": {"name", "parameters"}}'
        raise ApiError(400, message, "tools")
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"a request may offer at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    names = frozenset(tool["function"]["name"] for tool in tools)
    if len(names) < len(tools):
        raise ApiError(400, "two tools have the same function name", "tools")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    if choice in (None, "auto", "required", "none"):
        return None if choice == "none" else ToolRequest(tuple(tools), choice or "auto", names, parallel)
    name = (choice.get("function") or {}).get("name") if isinstance(choice, Mapping) else None
    if name not in names:
        raise ApiError(400, "tool_choice must be none, auto, required or one of the tools' functions", "tool_choice")
    return ToolRequest(tuple(tools), name, names, parallel)


def _is_function(tool: Any) -> bool:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        return False
    function = tool.get("function")
    parameters = function.get("parameters") if isinstance(function, Mapping) else None
    return (
        isinstance(function, Mapping)
        and isinstance(function.get("name"), str)
        and bool(function["name"])
        and (parameters is None or isinstance(parameters, Mapping))
    )


def template_message(message: Mapping[str, Any], content: str) -> dict[str, Any]:
    """An earlier turn as chat templates take it: an assistant's calls with their arguments as objects; a tool
    message's result as its content."""
    rendered: dict[str, Any] = {"role": message["role"], "content": content}
    calls = message.get("tool_calls")
    if message["role"] == "assistant" and calls:
        if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
            raise ApiError(400, "an assistant's tool_calls must be OpenAI's function calls", "messages")
        rendered["tool_calls"] = [
            {"type": "function", "id": call.get("id"), "function": {
                "name": call["function"]["name"], "arguments": _arguments(call["function"].get("arguments"))}}
            for call in calls
        ]  # fmt: skip
    if message["role"] == "tool" and message.get("tool_call_id") is not None:
        rendered["tool_call_id"] = message["tool_call_id"]
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


def split_calls(text: str, names: frozenset[str]) -> tuple[str, list[dict[str, Any]]]:
    """An answer's content (the text before its first call; all of it without calls) and its calls, OpenAI's
    ``tool_calls`` entries. A block that is not a JSON object naming an offered function is not a call."""
    calls, first = [], None
    for match in CALL.finditer(text):
        if (call := _call(match.group(1), names)) is not None:
            first = match.start() if first is None else first
            calls.append(call)
    if not calls and (whole := WHOLE.fullmatch(text)) is not None:
        call = _call(whole.group(1) or whole.group(2), names, needs_arguments=True)
        return ("", [call]) if call is not None else (text, [])
    return (text if first is None else text[:first].rstrip()), calls


def _call(text: str, names: frozenset[str], needs_arguments: bool = False) -> dict[str, Any] | None:
    """OpenAI's ``tool_calls`` entry for a JSON object naming an offered function; None for anything else."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("name") not in names:
        return None
    arguments = parsed.get("arguments", None if needs_arguments else {})
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
        "function": {"name": parsed["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }  # fmt: skip


class CallFilter:
    """A streamed answer's text with what may open a call held back: :meth:`feed` gives the content to send now;
    the held text is parsed for calls at the end (:func:`split_calls`)."""

    def __init__(self) -> None:
        self.text = ""  # all of the answer so far
        self.sent = 0  # characters of it sent as content
        self.whole: bool | None = None  # the answer opens as one whole-answer call would (None: not known yet)

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.whole is None:  # decided once its first characters tell
            start = self.text.lstrip()
            if start[:1] == "{" or start.startswith(FENCE):
                self.whole = True
            elif not FENCE.startswith(start):
                self.whole = False
        if self.whole is not False:
            return ""  # may be one whole-answer call: held to the end
        opened = self.text.find(OPEN_TAG, self.sent)
        if opened >= 0:
            end = opened
        else:  # a tail that may be the start of the tag waits for the next delta
            end = len(self.text)
            for size in range(min(len(OPEN_TAG) - 1, len(self.text) - self.sent), 0, -1):
                if OPEN_TAG.startswith(self.text[-size:]):
                    end = len(self.text) - size
                    break
        end = max(self.sent, len(self.text[:end].rstrip()))  # whitespace before a call is not content: held too
        out, self.sent = self.text[self.sent : end], end
        return out
