"""Tool calls, OpenAI's semantics over the tool-call format of the model's chat template.

Rules:
- The format is found once per chat template (:func:`tool_format`), by text only its family's templates hold:
  Hermes (``<tool_call>{"name", "arguments"}</tool_call>``, as Qwen2.5, Qwen3 and SmolLM3 write them), Mistral's
  (``[TOOL_CALLS]`` and a JSON list of calls), Mistral's named calls (``[TOOL_CALLS]name[ARGS]{arguments}``, one
  after another, as Mistral Small 3.2, Ministral 3 and Devstral write them; ``[CALL_ID]`` and the model's id before
  ``[ARGS]`` where the template renders one) and Llama 3's JSON (``{"name", "parameters"}``, the whole answer). A
  template with none of them cannot take tools (400).
- A format's markers that are special tokens (Mistral's named calls') keep their text in a tool request's answer,
  as vLLM keeps them, so its calls can be read (and stop strings can match them); every other special token has
  none.
- ``tools`` are rendered by the chat template. ``tool_choice``: ``auto`` (the default with tools) lets the model
  answer or call; ``none`` renders no tools and parses no calls; ``required`` and a named function constrain the
  answer to calls of the offered functions (of that function): one or more, one with ``parallel_tool_calls`` false
  or a format whose template renders one call a turn (Llama 3's), each call's arguments following its function's
  JSON schema (structured output).
- A call is a JSON object with a known ``name`` and an object of arguments (``arguments``, or ``parameters`` as Llama 3
  writes them). Hermes: each ``<tool_call>`` block holding one, the text before the first block being the message's
  content. Named calls: the text before the first ``[TOOL_CALLS]`` is content, then each tag's call that names an
  offered function (its id the model's, where it wrote one of the right shape, unused before). Every format: an answer
  that is nothing but one call (Mistral's: a JSON list of calls), bare or in a json fence, after the format's opening
  token where the text spells it, is calls; Qwen2.5-Coder answers so. Anything else is content, and so is a call whose
  arguments JSON cannot carry (1e999, NaN). An answer with calls finishes as :meth:`ToolRequest.finish_reason` says.
- Streamed, the content goes out as it comes except what may open a call (all of an answer that opens as a whole
  answer of calls would; Hermes' blocks and named calls from their tag on); the calls go out whole at the end.
- Earlier turns: an assistant message's ``tool_calls`` (arguments as JSON text) and ``tool`` messages go to the
  template as it expects them (arguments as objects). A call's id is OpenAI's ``call_…``, or the length of
  alphanumerics the format's templates check (Mistral's 9), or the model's own where it writes one of that shape.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quickdraft.grammar import GrammarKind, GrammarSpec, xgrammar_reason
from quickdraft.server.errors import ApiError
from quickdraft.server.tool_stream import CallFilter

FENCE = "```json"
MAX_TOOLS = 128  # OpenAI's limit of functions per request
ARGUMENT_KEYS = ("arguments", "parameters")  # where a call's arguments may be, in the order looked at
WHOLE = re.compile(r"\s*(?:```json\s*([\[{].*[\]}])\s*```|([\[{].*[\]}]))\s*", re.DOTALL)  # one JSON value


@dataclass(frozen=True)
class ToolFormat:
    """How the models of one family of chat templates write their calls."""

    name: str
    marker: str  # text only a template of this format holds
    tags: tuple[str, str] | None  # what opens and closes each call (Hermes'; a named call's JSON ends it: ""); None:
    # the calls are the whole answer
    opener: str  # what a whole answer of calls may start with where the text spells it (a special token it loses)
    arguments: str  # the key of a call's arguments, as the format writes it
    listed: bool  # the calls of a whole answer are a JSON list
    parallel: bool  # the template renders an assistant turn of several calls
    id_length: int = 0  # 0: OpenAI's call_ ids; else ids of this many alphanumerics, as the templates check
    unless: str = ""  # text of a later variant of the family's templates, which writes calls another way
    named: str = ""  # a call is its function's name, this, then its arguments' JSON ("": a call is a JSON object)
    id_marker: str = ""  # what comes between a named call's name and the id the model gives it ("": no id)
    kept: tuple[str, ...] = ()  # special tokens a tool request's answer keeps as text: its calls are read from them

    def written_by(self, template: str) -> bool:
        """Whether a chat template's text has its model write calls in this format."""
        return self.marker in template and not (self.unless and self.unless in template)

    def call_id(self) -> str:
        return uuid.uuid4().hex[: self.id_length] if self.id_length else f"call_{uuid.uuid4().hex[:24]}"

    def valid_id(self, given: str) -> bool:
        """Whether an id the model wrote has the shape its templates check."""
        return len(given) == self.id_length and given.isascii() and given.isalnum()

    @property
    def opening(self) -> str:
        """What opens each call ("" for a format whose calls are the whole answer)."""
        return self.tags[0] if self.tags else ""

    @functools.cached_property
    def named_head(self) -> re.Pattern[str]:
        """A named call from its opening tag to its arguments' JSON: the name (group 1), the id the model gives it
        (group 2, where the format has one), the separator (which a text may have lost)."""
        given = rf"(?:{re.escape(self.id_marker)}\s*([^\s\[{{]+)\s*)?" if self.id_marker else "()"
        return re.compile(rf"\s*(.+?)\s*{given}(?:{re.escape(self.named)})?\s*(?=\{{)")


HERMES = ToolFormat("Hermes <tool_call> tags", "<tool_call>", ("<tool_call>", "</tool_call>"), "", "arguments",
                    listed=False, parallel=True)  # fmt: skip
MISTRAL = ToolFormat("Mistral's [TOOL_CALLS]", "[TOOL_CALLS]", None, "[TOOL_CALLS]", "arguments", listed=True,
                     parallel=True, id_length=9, unless="[ARGS]")  # fmt: skip
LLAMA3_JSON = ToolFormat("Llama 3's JSON", '"parameters": dictionary of argument name', None, "<|python_tag|>",
                         "parameters", listed=False, parallel=False)  # fmt: skip
MISTRAL_NAMED = ToolFormat("Mistral's [TOOL_CALLS]name[ARGS]", "[ARGS]", ("[TOOL_CALLS]", ""), "", "arguments",
                           listed=False, parallel=True, id_length=9, unless="[CALL_ID]", named="[ARGS]",
                           kept=("[TOOL_CALLS]", "[ARGS]"))  # fmt: skip
MISTRAL_CALL_ID = ToolFormat("Mistral's [TOOL_CALLS]name[CALL_ID]id[ARGS]", "[CALL_ID]", ("[TOOL_CALLS]", ""), "",
                             "arguments", listed=False, parallel=True, id_length=9, named="[ARGS]",
                             id_marker="[CALL_ID]", kept=("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"))  # fmt: skip
TOOL_FORMATS = (HERMES, MISTRAL, MISTRAL_NAMED, MISTRAL_CALL_ID, LLAMA3_JSON)  # looked for in this order


def tool_format(template: str) -> ToolFormat | None:
    """The tool-call format of a chat template's text; None for a template without one."""
    return next((found for found in TOOL_FORMATS if found.written_by(template)), None)


def tool_format_of(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format of a tokenizer's chat template (None without a template or a format)."""
    template = getattr(tokenizer, "chat_template", None)
    return tool_format(template) if isinstance(template, str) else None


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools (OpenAI's ``tools`` entries), how it may use them, and the format its model writes."""

    tools: tuple[dict[str, Any], ...]
    choice: str  # "auto", "required", or the one function's name
    names: frozenset[str]
    format: ToolFormat
    parallel: bool = True  # OpenAI's parallel_tool_calls: several calls may come in one answer

    def finish_reason(self, reason: str, called: bool) -> str:
        """The engine's finish ``reason`` of an answer that ``called`` functions, or not: a cut answer stays
        "length" (its last call may be cut off); calls end with "tool_calls", except a named function's, which
        OpenAI ends with "stop"."""
        if not called or reason == "length":
            return reason
        return "stop" if self.choice not in ("auto", "required") else "tool_calls"

    def grammar(self) -> GrammarSpec | None:
        """The constraint of ``required`` or a named function: calls in the format's shape (Hermes: each in its own
        tags, a newline between them; named calls one after another, each with an id where the format has one;
        else one call, or a JSON list of them), one unless ``parallel`` and the format allow more, each call's
        arguments by its function's schema."""
        if self.choice == "auto":
            return None
        chosen = [tool for tool in self.tools if self.choice == "required" or tool["function"]["name"] == self.choice]
        call = {"anyOf": [call_schema(tool["function"], self.format.arguments) for tool in chosen]}
        several = self.parallel and self.format.parallel
        try:
            import xgrammar
        except ImportError:
            raise ApiError(400, "tool_choice required needs xgrammar: pip install 'quickdraft[serve]'") from None
        if self.format.named:
            return self._named_grammar(chosen, several)
        if self.format.tags is None and self.format.listed:  # a whole answer of calls: their list
            call = {"type": "array", "items": call, "minItems": 1} | ({} if several else {"maxItems": 1})
        try:
            shaped = xgrammar.Grammar.from_json_schema(json.dumps(call), any_whitespace=False)
        except (RuntimeError, ValueError) as error:  # xgrammar's word on a schema it cannot follow
            message = f"a tool's parameters are not a JSON schema a call can follow: {xgrammar_reason(error)}"
            raise ApiError(400, message, "tools") from None
        if self.format.tags is None:  # a whole answer of calls: the one call, or their list
            return GrammarSpec(GrammarKind.EBNF, str(shaped))
        opening, closing = self.format.tags
        tags = (xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(tag)}") for tag in (opening + "\n", "\n" + closing))
        tagged = str(xgrammar.Grammar.concat(next(tags), shaped, next(tags)))
        if not several:
            return GrammarSpec(GrammarKind.EBNF, tagged)
        renamed = re.sub(r"^root ::=", "tool_call_block ::=", tagged, count=1, flags=re.MULTILINE)
        return GrammarSpec(GrammarKind.EBNF, f'{renamed}\nroot ::= tool_call_block ("\\n" tool_call_block)*\n')

    def _named_grammar(self, chosen: list[dict[str, Any]], several: bool) -> GrammarSpec:
        """Named calls, each its opening tag, a chosen function's name, an id where the format has the model give
        one, the separator and arguments by the function's schema; one call, or several in a row."""
        import xgrammar

        def literal(text: str) -> Any:
            return xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")

        alphanumerics = xgrammar.Grammar.from_ebnf(f"root ::= [a-zA-Z0-9]{{{self.format.id_length}}}")
        given_id = [literal(self.format.id_marker), alphanumerics] if self.format.id_marker else []
        separator, calls = literal(self.format.named), []
        for tool in chosen:
            function = tool["function"]
            schema = json.dumps(function.get("parameters") or {"type": "object"})
            try:
                arguments = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)
            except (RuntimeError, ValueError) as error:  # xgrammar's word on a schema it cannot follow
                message = f"a tool's parameters are not a JSON schema a call can follow: {xgrammar_reason(error)}"
                raise ApiError(400, message, "tools") from None
            calls.append(xgrammar.Grammar.concat(literal(self.format.opening + function["name"]), *given_id, separator,
                                                 arguments))  # fmt: skip
        call = str(xgrammar.Grammar.union(*calls))
        if not several:
            return GrammarSpec(GrammarKind.EBNF, call)
        renamed = re.sub(r"^root ::=", "named_call ::=", call, count=1, flags=re.MULTILINE)
        return GrammarSpec(GrammarKind.EBNF, f"{renamed}\nroot ::= named_call+\n")

    def split_calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """An answer's content (Hermes: the text before its first call; all of it without calls) and its calls,
        OpenAI's ``tool_calls`` entries. What is not a JSON object naming an offered function is not a call."""
        if self.format.named:
            if named := self._named_calls(text):
                return text[: text.find(self.format.opening)].rstrip(), named
        elif self.format.tags is not None:
            opening, closing = (re.escape(tag) for tag in self.format.tags)
            calls, first = [], None
            for match in re.finditer(opening + r"\s*(.*?)\s*" + closing, text, re.DOTALL):
                if (call := self._call(_json(match.group(1)), needs_arguments=False)) is not None:
                    first = match.start() if first is None else first
                    calls.append(call)
            if calls:
                return text[:first].rstrip(), calls
        answer = text.lstrip().removeprefix(self.format.opener)  # its opener, where the text spells it
        whole = WHOLE.fullmatch(answer)
        value = _json(whole.group(1) or whole.group(2)) if whole is not None else None
        entries = value if isinstance(value, list) and self.format.listed else [value]
        found = [self._call(entry, needs_arguments=True) for entry in entries]
        if not entries or any(call is None for call in found):
            return text, []
        return "", [call for call in found if call is not None]

    def call_filter(self) -> CallFilter:
        """A streamed answer's filter, holding back what may open a call of this format."""
        extra = (("[",) if self.format.listed else ()) + ((self.format.opener,) if self.format.opener else ())
        openers = ("{", FENCE, *extra)
        return CallFilter(openers, self.format.tags[0] if self.format.tags else None)

    def _named_calls(self, text: str) -> list[dict[str, Any]]:
        """The named calls after each opening tag, in order: a name (an offered function's), an id where the format
        has the model give one, the separator, then the arguments' JSON object, read to its end (a tag inside its
        strings is text); what is not one, a call cut off included, is not a call. An id becomes the call's if it
        has the format's shape and no earlier call has it."""
        calls: list[dict[str, Any]] = []
        at = text.find(self.format.opening)
        while at >= 0:
            start, call = at + len(self.format.opening), None
            if (head := self.format.named_head.match(text, start)) is not None:
                try:
                    arguments, start = json.JSONDecoder().raw_decode(text, head.end())
                except ValueError:  # RecursionError too: lists nested past the parser's depth
                    arguments = None
                call = self._call({"name": head.group(1), "arguments": arguments}, needs_arguments=True)
            if call is not None:
                given, taken = head.group(2) if head else None, {earlier["id"] for earlier in calls}
                if given and self.format.valid_id(given) and given not in taken:
                    call["id"] = given  # the id the model wrote, which its next turn will refer to
                calls.append(call)
            at = text.find(self.format.opening, start)
        return calls

    def _call(self, parsed: Any, needs_arguments: bool) -> dict[str, Any] | None:
        """OpenAI's ``tool_calls`` entry for a JSON object naming an offered function; None for anything else.
        Without arguments a call has none, unless ``needs_arguments`` (a whole answer's JSON must be a call's)."""
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or parsed["name"] not in self.names:
            return None
        key = next((key for key in ARGUMENT_KEYS if key in parsed), None)
        arguments = parsed[key] if key is not None else (None if needs_arguments else {})
        if not isinstance(arguments, dict):
            return None
        try:
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
        except ValueError:  # 1e999 or NaN: no JSON a client can read
            return None
        return {
            "id": self.format.call_id(),
            "type": "function",
            "function": {"name": parsed["name"], "arguments": text},
        }


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: lists nested past the parser's depth
        return None


def call_schema(function: Mapping[str, Any], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of ``function``: its name and its arguments (under ``arguments_key``)."""
    arguments = function.get("parameters") or {"type": "object"}
    properties = {"name": {"const": function["name"]}, arguments_key: arguments}
    return {"type": "object", "properties": properties, "required": ["name", arguments_key]}


def parse_tools(body: Mapping[str, Any], found: ToolFormat | None) -> ToolRequest | None:
    """The request's tools, checked; None without tools or with ``tool_choice`` none. ``found``: the chat
    template's tool-call format (:func:`tool_format`); tools and earlier tool turns need one."""
    tools, choice = body.get("tools") or [], body.get("tool_choice")
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    tool_turns = any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)
    if (tools or tool_turns) and found is None:
        known = ", ".join(known.name for known in TOOL_FORMATS)
        message = f"this model's chat template has no tool-call format quickdraft reads ({known})"
        raise ApiError(400, message, "tools" if tools else "messages")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        return None
    assert found is not None
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
        return None if choice == "none" else ToolRequest(tuple(tools), choice or "auto", names, found, parallel)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or name not in names:
        raise ApiError(400, "tool_choice must be none, auto, required or one of the tools' functions", "tool_choice")
    return ToolRequest(tuple(tools), name, names, found, parallel)


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


def template_message(
    message: Mapping[str, Any], content: str, called: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An earlier turn as chat templates take it: an assistant's calls with their arguments as objects; a tool
    message's result as its content, with its ``tool_call_id`` and the called function's ``name`` (the client's, or
    the one ``called`` maps its ``tool_call_id`` to: Hermes' templates need it, OpenAI's messages lack it)."""
    rendered: dict[str, Any] = {"role": message["role"], "content": content}
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
