"""Tool calls, OpenAI's semantics over the tool-call format of the model's chat template.

Rules:
- The format is found once per chat template (:func:`~quickdraft.server.tool_formats.tool_format`), by text only its
  family's templates hold: Hermes (``<tool_call>{"name", "arguments"}</tool_call>``, as Qwen2.5, Qwen3 and SmolLM3 write
  them), Qwen3-Coder's XML (``<tool_call><function=name><parameter=key>value</parameter>…``, as Qwen3-Coder and Qwen3.5
  write them), Mistral's (``[TOOL_CALLS]`` and a JSON list of calls), Mistral's named calls
  (``[TOOL_CALLS]name[ARGS]{arguments}``, one after another, as Mistral Small 3.2, Ministral 3 and Devstral write them;
  ``[CALL_ID]`` and the model's id before ``[ARGS]`` where the template renders one), Llama 3's JSON (``{"name",
  "parameters"}``, the whole answer) and pythonic lists (``[name(key=value, ...), ...]``, the whole answer, as Llama 3.2
  and 4 write them with their pythonic templates), Phi-4-mini's (``functools`` and a JSON list of calls, the whole
  answer), Granite 3's (``<|tool_call|>``, or 3.1-3.3's plain ``<tool_call>``, and a JSON list of calls, the whole
  answer) and OLMo 3's (``<function_calls>`` blocks of Python calls, one a line). A template with none of them
  cannot take tools (400).
- A format's markers that are special tokens (Mistral's named calls') keep their text in a tool request's answer, as
  vLLM keeps them, so its calls can be read (and stop strings can match them); other special tokens have none but
  a thinking template's tags (:mod:`quickdraft.server.reasoning`).
- ``tools`` are rendered by the chat template. ``tool_choice``: ``auto`` (the default with tools) lets the model answer
  or call; ``none`` renders no tools and parses no calls; ``required`` and a named function constrain the answer to
  calls of the offered functions (of that function): one or more, one with ``parallel_tool_calls`` false or a format
  whose template renders one call a turn (Llama 3's), each call's arguments following its function's JSON schema
  (structured output).
- A call is a JSON object with a known ``name`` and an object of arguments (``arguments``, or ``parameters`` as Llama 3
  writes them; or JSON text of one, as OpenAI's messages carry them). Hermes: each ``<tool_call>`` block holding one,
  the text before the first block being the message's content; a block runs to its object's end and its closing tag (a
  tag inside a string is text), and a tag no call follows is text. XML calls: the same blocks, each a
  ``<function=name>`` of ``<parameter=key>`` blocks and nothing else, a value less one newline at each end, text for a
  string property, else JSON where it reads as JSON (to the first of the next :data:`MAX_CLOSINGS` ``</parameter>`` at
  which it does). Named calls: the text before the first ``[TOOL_CALLS]`` is content, then each tag's call that names an
  offered function (its id the model's, where it wrote one of the right shape, unused before). Pythonic: an answer that
  is only a Python list of calls by plain names with literal keyword arguments (Python's parser reads it, nothing is
  evaluated); OLMo 3's: each block whose every statement is such a call (to the first of the next :data:`MAX_CLOSINGS`
  closing tags before which they parse), the text before the first block being content. Every other format: an answer
  that is nothing but one call (Mistral's: a JSON list of calls), bare or in a json fence, after the format's opening
  token where the text spells it, is calls; Qwen2.5-Coder answers so. Anything else is content, and so is a call whose
  arguments JSON cannot carry (1e999, NaN). An answer with calls finishes as :meth:`ToolRequest.finish_reason` says.
- Streamed, the content goes out as it comes except what may open a call (all of an answer that opens as a whole answer
  of calls would; Hermes' blocks and named calls from their tag on); the calls go out whole at the end.
- A call's id is OpenAI's ``call_…``, or the length of alphanumerics the format's templates check (Mistral's 9), or the
  model's own where it writes one of that shape. Earlier turns go to the template as
  :func:`~quickdraft.server.messages.template_message` says.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from quickdraft.grammar import GrammarSpec
from quickdraft.grammar_schema import resolved
from quickdraft.server.errors import ApiError
from quickdraft.server.tool_checks import check_definitions, check_shapes, properties
from quickdraft.server.tool_formats import TOOL_FORMATS, CallBody, ToolFormat
from quickdraft.server.tool_grammar import (
    PARAMETER_END,
    calls_grammar,
    content_or_calls,
    is_text,
    lazy_calls_grammar,
    value_kinds,
)
from quickdraft.server.tool_python import python_calls
from quickdraft.server.tool_stream import CallFilter

FENCE = "```json"
MAX_TOOLS = 128  # OpenAI's limit of functions per request
BAD_CHOICE = "tool_choice must be none, auto, required or one of the tools' functions"
ARGUMENT_KEYS = ("arguments", "parameters")  # where a call's arguments may be, in the order looked at
XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?")  # a parameter block's head: its key
XML_NEXT = re.compile(r"\s*(?:<parameter=|\Z)")  # what follows a parameter block's end: another, or the call's end
PYTHON_LITERALS = {"True": True, "False": False, "None": None}
UNREAD = object()  # an XML value to be read as JSON that is none (kept as text, where no later end reads)
SPACE = re.compile(r"\s*")
DECODER = json.JSONDecoder()  # reads one JSON value from a position: a call that runs on past it
MAX_CLOSINGS = 4  # closing tags a block of Python calls or a JSON value is tried up to (a tag inside a string is text)
WHOLE = re.compile(r"\s*(?:```json\s*([\[{].*[\]}])\s*```|([\[{].*[\]}]))\s*", re.DOTALL)  # one JSON value


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

    def grammar(
        self, content: GrammarSpec | None = None, think: tuple[str, str, bool] | None = None
    ) -> GrammarSpec | None:
        """What the answer follows (:mod:`~quickdraft.server.tool_grammar`), several calls where ``parallel`` and
        the format allow them: ``required`` or a named function, calls of the offered functions (of that one);
        ``auto``, the ``content`` constraint (``response_format``) or calls, else with a strict function any text
        (``think``'s reasoning block free) and calls by their schemas once one opens, else nothing."""
        several, offered = self.parallel and self.format.parallel, list(self.tools)
        if self.choice != "auto":
            chosen = [tool for tool in offered if self.choice == "required" or tool["function"]["name"] == self.choice]
            return calls_grammar(self.format, chosen, several)
        if content is not None:
            return content_or_calls(self.format, offered, several, content)
        strict = any(tool["function"].get("strict") is True for tool in offered)
        return lazy_calls_grammar(self.format, offered, several, think) if strict else None

    @property
    def only_calls(self) -> bool:
        """Whether the answer is constrained to calls (``required`` or a named function): all its text is calls', a
        call cut off by the budget included, and none of it is content."""
        return self.choice != "auto"

    def split_calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """An answer's content (Hermes: the text before its first call; all of it without calls; none where
        :attr:`only_calls`) and its calls, OpenAI's ``tool_calls`` entries. What is not a JSON object naming an
        offered function is not a call."""
        content, calls = self._split_calls(text)
        return ("" if self.only_calls else content), calls

    def _split_calls(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        if self.format.body is CallBody.NAMED:
            if named := self._named_calls(text):
                return text[: text.find(self.format.opening)].rstrip(), named
        elif self.format.tags is not None:
            calls, first = [], None
            for start, block in self._blocks(text):
                first = start if first is None else first
                calls.extend(block)
            if calls:
                return text[:first].rstrip(), calls
        if self.format.body is CallBody.PYTHONIC:
            pythonic = self._pythonic_calls(text) if self.format.tags is None else []
            return ("", pythonic) if pythonic else (text, [])
        answer = text.lstrip()
        opener = next((opener for opener in self.format.openers if answer.startswith(opener)), "")
        answer = answer.removeprefix(opener)  # its opener, where the text spells it
        whole = WHOLE.fullmatch(answer)
        value = _json(whole.group(1) or whole.group(2)) if whole is not None else None
        entries = value if isinstance(value, list) and self.format.listed else [value]
        found = [self._call(entry, needs_arguments=True) for entry in entries]
        if not entries or any(call is None for call in found):
            return text, []
        return "", [call for call in found if call is not None]

    def call_filter(self) -> CallFilter:
        """A streamed answer's filter, holding back what may open a call of this format."""
        extra = (("[",) if self.format.listed else ()) + self.format.openers
        openers = ("{", FENCE, *extra)
        tags = tuple(tag for tag in (self.format.opening, self.format.bare) if tag)
        return CallFilter(openers, tags, self.only_calls)

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
                    arguments, start = DECODER.raw_decode(text, head.end())
                except (ValueError, RecursionError):  # RecursionError: lists nested past the parser's depth
                    arguments = None
                call = self._call({"name": head.group(1), "arguments": arguments}, needs_arguments=True)
            if call is not None:
                given, taken = head.group(2) if head else None, {earlier["id"] for earlier in calls}
                if given and self.format.valid_id(given) and given not in taken:
                    call["id"] = given  # the id the model wrote, which its next turn will refer to
                calls.append(call)
            at = text.find(self.format.opening, start)
        return calls

    def _blocks(self, text: str) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        """Each tagged block's start and calls, in order: an XML call (:attr:`ToolFormat.block`), or from an opening
        tag to the closing tag at which the block first reads as calls (:meth:`_block_at`), the search going on
        after it; an opening tag that opens none (prose naming the tag) is passed over."""
        if self.format.body is CallBody.XML:
            for match in self.format.block.finditer(text):
                if (call := self._xml_call(match)) is not None:
                    yield match.start(), [call]
            return
        opening, closing = self.format.tags or ("", "")
        at = text.find(opening)
        while at >= 0:
            calls, end = self._block_at(text, at + len(opening), closing)
            if calls:
                yield at, calls
            at = text.find(opening, end if calls else at + len(opening))

    def _block_at(self, text: str, start: int, closing: str) -> tuple[list[dict[str, Any]], int]:
        """The calls of a block whose text starts at ``start``, and where its closing tag ends: its one JSON call, read
        to the object's end (a tag inside its strings is text), then its closing tag; or its lines of Python calls,
        all of them, up to the first of the next :data:`MAX_CLOSINGS` closing tags before which they parse."""
        if self.format.body is not CallBody.PYTHONIC:
            try:
                parsed, end = DECODER.raw_decode(text, SPACE.match(text, start).end())  # type: ignore[union-attr]
            except (ValueError, RecursionError):  # RecursionError: lists nested past the parser's depth
                return [], start
            end = SPACE.match(text, end).end()  # type: ignore[union-attr]
            call = self._call(parsed, needs_arguments=False) if text.startswith(closing, end) else None
            return ([], start) if call is None else ([call], end + len(closing))
        end = text.find(closing, start)
        for _ in range(MAX_CLOSINGS):
            if end < 0:
                break
            if calls := self._pythonic_calls(text[start:end], lines=True):
                return calls, end + len(closing)
            end = text.find(closing, end + 1)
        return [], start

    def _pythonic_calls(self, text: str, lines: bool = False) -> list[dict[str, Any]]:
        """A whole answer that is a Python list of calls (``lines``: Python calls, one a statement) of offered
        functions (:func:`~quickdraft.server.tool_python.python_calls`); none if anything else is."""
        calls = [self._call({"name": name, "arguments": arguments}, needs_arguments=True)
                 for name, arguments in python_calls(text, lines)]  # fmt: skip
        return [] if None in calls else calls  # type: ignore[return-value]

    @functools.cached_property
    def properties(self) -> dict[str, Mapping[str, Any]]:
        """Each offered function's parameters' properties, by the function's name, each ``$ref`` into the parameters
        resolved (as the call's grammar reads them): an XML call's values are typed by them."""
        return {
            tool["function"]["name"]: {
                key: resolved(schema, tool["function"].get("parameters") or {})
                for key, schema in properties(tool["function"]).items()
            }
            for tool in self.tools
        }

    def _xml_call(self, block: re.Match[str]) -> dict[str, Any] | None:
        """An XML call: ``<function=name>`` and its ``<parameter=key>`` blocks, in its tags or not; each value less
        one newline at each end, kept as text for a property that may be a string (or one the function does not
        have), else read as JSON (or as the ``True``, ``False``, ``None`` a template's ``| string`` writes), else
        kept as text."""
        name = block.group(1).strip()
        arguments = _xml_arguments(block.group(2), self.properties.get(name, {}))
        return self._call({"name": name, "arguments": arguments}, needs_arguments=True)

    def _call(self, parsed: Any, needs_arguments: bool) -> dict[str, Any] | None:
        """OpenAI's ``tool_calls`` entry for a JSON object naming an offered function; None for anything else. Its
        arguments are an object, or JSON text of one (as OpenAI's messages carry them, which a model may copy).
        Without arguments a call has none, unless ``needs_arguments`` (a whole answer's JSON must be a call's)."""
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str) or parsed["name"] not in self.names:
            return None
        key = next((key for key in ARGUMENT_KEYS if key in parsed), None)
        arguments = parsed[key] if key is not None else (None if needs_arguments else {})
        if isinstance(arguments, str):  # "" is none, as an earlier turn's
            arguments = _json(arguments) if arguments.strip() else {}
        if not isinstance(arguments, dict):
            return None
        try:
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
            text.encode()  # a lone surrogate ("\\ud800") is no UTF-8 text a client can read
        except (ValueError, UnicodeEncodeError):  # 1e999 or NaN: no JSON a client can read
            return None
        return {
            "id": self.format.call_id(),
            "type": "function",
            "function": {"name": parsed["name"], "arguments": text},
        }


def _xml_arguments(body: str, properties: Mapping[str, Any]) -> dict[str, Any]:
    """An XML call's ``<parameter=key>`` blocks as arguments. A value runs to a ``</parameter>`` that the next block or
    the end follows: the first one, except that a value to be read as JSON runs to the first of the next
    :data:`MAX_CLOSINGS` at which it reads as JSON, if any (a tag inside a JSON string is text; a string's constrained
    value never holds one)."""
    arguments, at = {}, 0
    while (head := XML_PARAMETER.match(body, at)) is not None:
        key, start = head.group(1).strip(), head.end()
        ends = list(itertools.islice(_parameter_ends(body, start), MAX_CLOSINGS))
        if not ends:
            break
        schema, end, value = properties.get(key), ends[0], body[start : ends[0]].removesuffix("\n")  # else: as text
        for candidate in ends:
            if (typed := _typed(body[start:candidate].removesuffix("\n"), schema)) is not UNREAD:
                end, value = candidate, typed
                break
        arguments[key], at = value, end + len(PARAMETER_END)
    return arguments


def _parameter_ends(body: str, start: int) -> Iterator[int]:
    """Where a parameter value starting at ``start`` may end: each ``</parameter>`` that the next block or the end
    follows, in order."""
    end = body.find(PARAMETER_END, start)
    while end >= 0:
        if XML_NEXT.match(body, end + len(PARAMETER_END)):
            yield end
        end = body.find(PARAMETER_END, end + 1)


def _typed(value: str, schema: Any) -> Any:
    """An XML call's value as its schema asks: text for a property that may be a string (or one the function does not
    have), else JSON (or a template's ``True``, ``False``, ``None``); :data:`UNREAD` where it is to be JSON and is
    not."""
    if not isinstance(schema, Mapping):
        return value
    if is_text(schema):
        return None if value.strip() == "null" and "null" in value_kinds(schema) else value
    parsed = _json(value)
    if parsed is not None or value.strip() == "null":
        return parsed
    return PYTHON_LITERALS.get(value.strip(), UNREAD)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: lists nested past the parser's depth
        return None


def parse_tools(body: Mapping[str, Any], found: ToolFormat | None) -> ToolRequest | None:
    """The request's tools, checked; None without tools or with ``tool_choice`` none. ``found``: the chat
    template's tool-call format (:func:`tool_format`); tools that may be called and earlier tool turns need one."""
    tools, choice = body.get("tools") or [], body.get("tool_choice")
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    tool_turns = any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)
    check_shapes(tools)
    if any(not isinstance(tool["function"].get("strict"), bool | None) for tool in tools):
        raise ApiError(400, "a function's strict must be true or false", "tools")
    if choice == "none" and not tool_turns and found is None:  # nothing to render or read: as OpenAI, no error
        return None
    if (tools or tool_turns) and found is None:
        known = ", ".join(known.name for known in TOOL_FORMATS)
        message = f"this model's chat template has no tool-call format quickdraft reads ({known})"
        raise ApiError(400, message, "tools" if tools else "messages")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")
    if not tools:
        if choice in (None, "none", "auto"):
            return None
        if choice == "required" or isinstance(choice, Mapping):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        raise ApiError(400, BAD_CHOICE, "tool_choice")
    assert found is not None
    if len(tools) > MAX_TOOLS:
        raise ApiError(400, f"a request may offer at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
    try:
        json.dumps(tools, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a JSON body's lone surrogate ("\\ud800"), which no chat template's text can hold
        raise ApiError(400, "tools hold text that is not UTF-8 (a lone surrogate)", "tools") from None
    except (TypeError, ValueError):  # not JSON's values at all: the template would fail on them
        raise ApiError(400, "tools must be JSON values", "tools") from None
    names = check_definitions(tools, python_names=found.body is CallBody.PYTHONIC)
    if choice in (None, "auto", "required", "none"):
        return None if choice == "none" else ToolRequest(tuple(tools), choice or "auto", names, found, parallel)
    function = choice.get("function") if isinstance(choice, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or name not in names:
        raise ApiError(400, BAD_CHOICE, "tool_choice")
    return ToolRequest(tuple(tools), name, names, found, parallel)
