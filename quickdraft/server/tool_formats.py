"""The tool-call formats of chat templates: how each family's models write their calls, as data
(:mod:`quickdraft.server.tools` reads calls by it, :mod:`quickdraft.server.tool_grammar` constrains them).

A format is found once per chat template (:func:`tool_format`), by text only its family's templates hold."""

from __future__ import annotations

import enum
import functools
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any


class CallBody(enum.Enum):
    """What a call holds between its opening tag and its end."""

    JSON = "a JSON object of its name and arguments"
    NAMED = "the function's name, then its arguments' JSON object (Mistral's)"
    XML = "<function=name>, then a <parameter=key> block for each argument (Qwen3-Coder's, Qwen3.5's)"
    PYTHONIC = (
        "Python calls with keyword arguments: a list, [name(key=value, ...), ...] (Llama 3.2's and 4's), or lines"
    )


@dataclass(frozen=True)
class ToolFormat:
    """How the models of one family of chat templates write their calls."""

    name: str
    marker: str  # text only a template of this format holds
    tags: tuple[str, str] | None  # what opens and closes each call ("" when its JSON ends it); None: the calls are the
    # whole answer
    opener: str  # what a whole answer of calls may start with where the text spells it (a special token it loses)
    arguments: str  # the key of a call's arguments, as the format writes it
    listed: bool  # the calls of a whole answer are a JSON list
    parallel: bool  # the template renders an assistant turn of several calls
    id_length: int = 0  # 0: OpenAI's call_ ids; else ids of this many alphanumerics, as the templates check
    unless: tuple[str, ...] = ()  # texts of other families' templates that hold the marker too, or of a later
    # variant of this family's, which write calls another way
    body: CallBody = CallBody.JSON
    separator: str = ""  # a named call's, between its name and its arguments
    id_marker: str = ""  # what comes between a named call's name and the id the model gives it ("": no id)
    bare: str = ""  # what opens a call its model writes without its tags at times (Qwen3-Coder's <function=)
    kept: tuple[str, ...] = ()  # special tokens a tool request's answer keeps as text: its calls are read from them
    tool_role: str = "tool"  # the role its templates render a tool's result under
    spelled_into: str = ""  # where its templates read an earlier turn's calls as the model writes them
    # (:meth:`spelled`): "content" (after the turn's text: they render no tool_calls) or a field of the message;
    # "": they render tool_calls
    also_opened_by: tuple[str, ...] = ()  # what later models of the family open a whole answer of calls with instead
    # (Granite 3.1-3.3's plain <tool_call>); read, never spelled
    opener_in_prose: bool = False  # its opener is a word prose may hold too (Phi-4-mini's functools), not a token of
    # its own: it cannot open a constrained call

    def __post_init__(self) -> None:
        spellable = self.body is CallBody.PYTHONIC or (self.tags is None and self.listed and self.body is CallBody.JSON)
        if self.spelled_into and not spellable:
            raise ValueError(f"{self.name}: only a JSON list of calls or Python calls are spelled for its templates")

    def written_by(self, template: str) -> bool:
        """Whether a chat template's text has its model write calls in this format."""
        return self.marker in template and not any(text in template for text in self.unless)

    def call_id(self) -> str:
        return uuid.uuid4().hex[: self.id_length] if self.id_length else f"call_{uuid.uuid4().hex[:24]}"

    def valid_id(self, given: str) -> bool:
        """Whether an id the model wrote has the shape its templates check."""
        return len(given) == self.id_length and given.isascii() and given.isalnum()

    def spelled(self, calls: list[dict[str, Any]]) -> str:
        """Earlier calls (a template's ``tool_calls``: each function's name and arguments object) as the model
        writes them: the opener, then their JSON list; Python calls one a line, each value in JSON (as OLMo 3's
        templates write them)."""
        functions = [(call["function"]["name"], call["function"]["arguments"]) for call in calls]
        if self.body is CallBody.PYTHONIC:
            spell = functools.partial(json.dumps, ensure_ascii=False)
            return "\n".join(f"{name}({', '.join(f'{key}={spell(value)}' for key, value in arguments.items())})"
                             for name, arguments in functions)  # fmt: skip
        entries = [{"name": name, self.arguments: arguments} for name, arguments in functions]
        return self.opener + json.dumps(entries, ensure_ascii=False)

    @property
    def openers(self) -> tuple[str, ...]:
        """What a whole answer of calls may start with where the text spells it: the opener, then the others."""
        return tuple(opener for opener in (self.opener, *self.also_opened_by) if opener)

    @property
    def opening(self) -> str:
        """What opens each call ("" for a format whose calls are the whole answer)."""
        return self.tags[0] if self.tags else ""

    @functools.cached_property
    def block(self) -> re.Pattern[str]:
        """An XML call: group 1 its name, group 2 its parameter blocks, its tags optional where the model may leave
        them out. Values run to their closing tags: a value cannot end a call."""
        opening, closing = (re.escape(tag) for tag in self.tags or ("", ""))
        parameters = r"((?:<parameter=[^>\n]+>.*?</parameter>\s*)*)"
        return re.compile(
            rf"(?:{opening}\s*)?<function=([^>\n]+)>\s*{parameters}</function>(?:\s*{closing})?", re.DOTALL
        )

    @functools.cached_property
    def named_head(self) -> re.Pattern[str]:
        """A named call from its opening tag to its arguments' JSON: the name (group 1), the id the model gives it
        (group 2, where the format has one), the separator (which a text may have lost)."""
        given = rf"(?:{re.escape(self.id_marker)}\s*([^\s\[{{]+)\s*)?" if self.id_marker else "()"
        return re.compile(rf"\s*(.+?)\s*{given}(?:{re.escape(self.separator)})?\s*(?=\{{)")


HERMES = ToolFormat("Hermes <tool_call> tags", "<tool_call>", ("<tool_call>", "</tool_call>"), "", "arguments",
                    listed=False, parallel=True, unless=("<parameter=", "<arg_key>"))  # fmt: skip
QWEN_XML = ToolFormat("Qwen3-Coder's <function=name> XML", "<parameter=", ("<tool_call>", "</tool_call>"), "",
                      "arguments", listed=False, parallel=True, unless=("<seed:tool_call>",), body=CallBody.XML,
                      bare="<function=")  # fmt: skip
MISTRAL = ToolFormat("Mistral's [TOOL_CALLS]", "[TOOL_CALLS]", None, "[TOOL_CALLS]", "arguments", listed=True,
                     parallel=True, id_length=9, unless=("[ARGS]",))  # fmt: skip
MISTRAL_NAMED = ToolFormat("Mistral's [TOOL_CALLS]name[ARGS]", "[ARGS]", ("[TOOL_CALLS]", ""), "", "arguments",
                           listed=False, parallel=True, id_length=9, unless=("[CALL_ID]",), body=CallBody.NAMED,
                           separator="[ARGS]", kept=("[TOOL_CALLS]", "[ARGS]"))  # fmt: skip
MISTRAL_CALL_ID = ToolFormat("Mistral's [TOOL_CALLS]name[CALL_ID]id[ARGS]", "[CALL_ID]", ("[TOOL_CALLS]", ""), "",
                             "arguments", listed=False, parallel=True, id_length=9, body=CallBody.NAMED,
                             separator="[ARGS]", id_marker="[CALL_ID]",
                             kept=("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"))  # fmt: skip
LLAMA3_JSON = ToolFormat("Llama 3's JSON", '"parameters": dictionary of argument name', None, "<|python_tag|>",
                         "parameters", listed=False, parallel=False)  # fmt: skip
PYTHONIC = ToolFormat("pythonic [name(key=value)]", "[func_name1(", None, "", "arguments", listed=True,
                      parallel=True, body=CallBody.PYTHONIC)  # fmt: skip
PHI4_MINI = ToolFormat("Phi-4-mini's functools[...]", "functools[", None, "functools", "arguments", listed=True,
                       parallel=True, opener_in_prose=True)  # fmt: skip
GRANITE = ToolFormat("Granite 3's <|tool_call|>[...]", "available_tools<|end_of_role|>", None, "<|tool_call|>",
                     "arguments", listed=True, parallel=True, tool_role="tool_response",
                     spelled_into="content", also_opened_by=("<tool_call>",))  # fmt: skip
OLMO3 = ToolFormat("OLMo 3's <function_calls> lines", "<function_calls></function_calls>",
                   ("<function_calls>", "</function_calls>"), "", "arguments", listed=False, parallel=True,
                   body=CallBody.PYTHONIC, tool_role="environment", spelled_into="function_calls")  # fmt: skip
TOOL_FORMATS = (
    HERMES,
    QWEN_XML,
    MISTRAL,
    MISTRAL_NAMED,
    MISTRAL_CALL_ID,
    LLAMA3_JSON,
    PYTHONIC,
    PHI4_MINI,
    GRANITE,
    OLMO3,
)  # in order: the first a template holds is its format


def tool_format(template: str) -> ToolFormat | None:
    """The tool-call format of a chat template's text; None for a template without one."""
    return next((found for found in TOOL_FORMATS if found.written_by(template)), None)


def tool_format_of(tokenizer: Any) -> ToolFormat | None:
    """The tool-call format of a tokenizer's chat template (None without a template or a format)."""
    template = getattr(tokenizer, "chat_template", None)
    return tool_format(template) if isinstance(template, str) else None
