"""The constraints of tool calls: of ``tool_choice`` required or a named function, an answer of calls of the chosen
functions in their format's shape (:mod:`quickdraft.server.tool_formats`), each call's arguments by its function's
JSON schema; of ``auto`` beside a ``response_format``, that content or such calls; of ``auto`` with a strict
function, any text, and such a call from each text that opens one.

Rules:
- Hermes: each call in its own tags, a newline between calls. A whole answer of calls (Mistral's list, Llama 3's
  JSON): the one call, or their list. Named calls (Mistral's): one after another, each with an id where the format
  has the model give one.
- XML calls (Qwen3-Coder's): each in its tags, ``<function=name>`` and a ``<parameter=key>`` block for each of the
  function's properties, in the schema's order, the required ones always, the others where the model writes them.
  A property that may be a string (:func:`is_text`) has raw text that never holds ``</parameter>`` (its ``enum`` or
  ``const``, where it gives one), any other the JSON its schema allows.
- Pythonic calls: a Python list of ``name(key=value, ...)``, the function's properties as keyword arguments in the
  schema's order, the required ones always, each value the JSON its schema allows, ``, `` between calls.
- One call, unless ``several``. A function without ``parameters`` takes none: its arguments are ``{}``, as OpenAI
  defines it. A schema xgrammar cannot follow is a 400 on ``tools``.
- A function's parameters are a JSON schema whose pointers (``$ref`` ``#/$defs/...``, ``#``) start at its own root.
  Placed inside a call's schema, they move under its ``$defs`` with their pointers rebased (:func:`rebased`); a
  property compiled alone (XML and pythonic calls) takes them along.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from quickdraft.grammar import GrammarKind, GrammarSpec, grammar_of, xgrammar_reason
from quickdraft.grammar_schema import SCHEMA_MAPS, compiled_schema, resolved, unenforced_part
from quickdraft.server.errors import ApiError
from quickdraft.server.tool_formats import CallBody, ToolFormat

PARAMETER_END = "</parameter>"
ARGUMENTS_DEFINITION = "quickdraft_arguments"  # where a function's parameters that point into themselves move
VALUE_KEYS = frozenset({"const", "enum", "default", "examples"})  # their values are data, not schemas
NO_PARAMETERS = {"type": "object", "properties": {}}  # a function without parameters takes none (OpenAI's rule),
# not any object


def calls_grammar(found: ToolFormat, chosen: list[dict[str, Any]], several: bool) -> GrammarSpec:
    """The grammar of an answer of calls of the ``chosen`` tools (OpenAI's ``tools`` entries) in ``found``'s
    format; one call unless ``several``."""
    _check_enforced(chosen, "leave tool_choice auto for this tool")
    return GrammarSpec(GrammarKind.EBNF, _calls(found, chosen, several, found.opening))


def content_or_calls(
    found: ToolFormat, tools: list[dict[str, Any]], several: bool, content: GrammarSpec
) -> GrammarSpec:
    """``tool_choice`` auto with its content constrained (``response_format``): that content, or an answer of calls
    of the offered ``tools`` as :func:`calls_grammar` has them, after the format's opener where it has one."""
    import xgrammar

    _check_enforced(tools, "beside a response_format every call is constrained: simplify it, or offer no tools")
    calls = xgrammar.Grammar.from_ebnf(_calls(found, tools, several, found.opening))
    if found.tags is None and found.opener:  # the model's own first token opens its calls: not masked away
        calls = xgrammar.Grammar.union(calls, xgrammar.Grammar.concat(_literal(found.opener), calls))
    return GrammarSpec(GrammarKind.EBNF, str(xgrammar.Grammar.union(grammar_of(content), calls)))


def lazy_calls_grammar(
    found: ToolFormat, tools: list[dict[str, Any]], several: bool, think: tuple[str, str, bool] | None = None
) -> GrammarSpec | None:
    """``tool_choice`` auto with a strict function: any text, and from each opening of a call (a tagged call's
    opening tag; the opener of a whole answer of calls, a token of its own) calls of the offered functions, each by
    its function's schema, one unless ``several``. Calls that open with no text of their own (pythonic lists, Llama
    3's JSON without ``<|python_tag|>``), or with a word prose may hold (Phi-4-mini's ``functools``), cannot be told
    from text as it is written: None for a format whose calls always do (nothing is constrained, so no schema is
    checked). ``think``: a template's reasoning tags and
    whether its answers open inside them; a reasoning block is free text, its mention of a call's opening too."""
    import xgrammar

    trigger = found.opening if found.tags is not None else found.opener
    if not trigger or (found.tags is None and found.opener_in_prose):
        return None  # nothing is constrained, so nothing need be enforceable
    remedy = "with a strict function offered every call is constrained: simplify it, or make every tool not strict"
    _check_enforced(tools, remedy)
    if found.tags is not None:  # each tagged call dispatched alone (OLMo 3's block holds its lines)
        content, stop = _calls(found, tools, found.body is CallBody.PYTHONIC and several, ""), not several
    else:  # the calls after the opener are the whole answer
        content, stop = _calls(found, tools, several, ""), True
    tag = {"begin": trigger, "content": {"type": "grammar", "grammar": content}, "end": ""}
    answer: dict[str, Any] = {"type": "triggered_tags", "triggers": [trigger], "tags": [tag], "stop_after_first": stop}
    if think is not None:
        opening, closing, opened = think
        reasoning = {"type": "any_text", "excludes": [closing]}
        thought = {"type": "tag", "begin": "" if opened else opening, "content": reasoning, "end": closing}
        answer = (  # opened: an answer may also end within its reasoning
            {"type": "or", "elements": [{"type": "sequence", "elements": [thought, answer]}, reasoning]}
            if opened
            else {"type": "sequence", "elements": [{"type": "optional", "content": thought}, answer]}
        )
    grammar = xgrammar.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": answer}))
    return GrammarSpec(GrammarKind.EBNF, str(grammar), opens_free=True)


def _check_enforced(tools: list[dict[str, Any]], remedy: str) -> None:
    """A 400 on ``tools`` where a function's parameters ask for what its constrained calls could not enforce: they
    are constrained wholly or not at all; ``remedy`` says how to leave them free."""
    try:
        import xgrammar  # noqa: F401
    except ImportError:
        raise ApiError(400, "constrained tool calls need xgrammar: pip install 'quickdraft[serve]'", "tools") from None
    for tool in tools:
        if (part := unenforced_part(tool["function"].get("parameters"))) is not None:
            name = tool["function"]["name"]
            message = f"the parameters of {name} ask for what a constrained call cannot enforce ({part})"
            raise ApiError(400, f"{message}: {remedy}", "tools")


def _calls(found: ToolFormat, chosen: list[dict[str, Any]], several: bool, opening: str) -> str:
    """The EBNF of calls of the ``chosen`` tools in ``found``'s format, a tagged call opened by ``opening`` (its tag,
    or "" where a dispatch has read it); one call unless ``several``."""
    import xgrammar

    if found.body is CallBody.PYTHONIC:  # a Python list of calls, or a block of them one a line
        calls = xgrammar.Grammar.union(*(_pythonic_call(tool["function"]) for tool in chosen))
        separator, around = (", ", ("[", "]")) if found.tags is None else ("\n", (opening, found.tags[1]))
        return _repeated(calls, several, separator, around)
    if found.body is not CallBody.JSON:  # named calls one after another, XML calls a newline between them
        build, separator = (_named_call, "") if found.body is CallBody.NAMED else (_xml_call, "\n")
        calls = xgrammar.Grammar.union(*(build(found, tool["function"], opening) for tool in chosen))
        return _repeated(calls, several, separator)
    branches, definitions = [], {}
    for index, tool in enumerate(chosen):
        arguments, key = tool["function"].get("parameters") or NO_PARAMETERS, f"{ARGUMENTS_DEFINITION}{index}"
        if (moved := _definitions(arguments, key)) is not None:  # it points into itself: under the $defs
            definitions.update(moved)
            arguments = {"$ref": f"#/$defs/{key}"}
        branches.append(call_schema(tool["function"]["name"], arguments, found.arguments))
    call: dict[str, Any] = {"anyOf": branches}
    if found.tags is None and found.listed:  # a whole answer of calls: their list
        call = {"type": "array", "items": call, "minItems": 1} | ({} if several else {"maxItems": 1})
    if definitions:
        call["$defs"] = definitions
    shaped = _schema(call)
    if found.tags is None:  # a whole answer of calls: the one call, or their list
        return str(shaped)
    tagged = xgrammar.Grammar.concat(_literal(opening + "\n"), shaped, _literal("\n" + found.tags[1]))
    return _repeated(tagged, several, "\n")


def call_schema(name: str, arguments: Any, arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of the function ``name``: its name, and its ``arguments`` under ``arguments_key``."""
    properties = {"name": {"const": name}, arguments_key: arguments}
    return {"type": "object", "properties": properties, "required": ["name", arguments_key]}


def rebased(schema: Any, base: str) -> Any:
    """``schema`` placed at ``base`` (a JSON pointer such as ``#/$defs/tool0``) of another document: a copy whose
    pointers into itself point there. Listed values (``const``, ``enum``, ...) are data, not schemas, and are kept;
    the names of a map of schemas (``properties``, ``$defs``, ...) are names, whatever they spell."""
    if isinstance(schema, list):
        return [rebased(item, base) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    copied: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            copied[key] = base + value[1:]
        elif key in SCHEMA_MAPS and isinstance(value, Mapping):
            copied[key] = {name: rebased(part, base) for name, part in value.items()}
        else:
            copied[key] = value if key in VALUE_KEYS else rebased(value, base)
    return copied


def _definitions(parameters: Mapping[str, Any], key: str = ARGUMENTS_DEFINITION) -> dict[str, Any] | None:
    """``$defs`` holding ``parameters`` as ``key``, rebased there (what a call's schema, or a property of them compiled
    on its own, takes along); None where they point nowhere into themselves."""
    moved = rebased(parameters, f"#/$defs/{key}")
    return None if moved == parameters else {key: moved}


def _alone(schema: Any, definitions: dict[str, Any] | None) -> Any:
    """A property's ``schema`` compiled on its own, with its parameters' :func:`_definitions` beside it."""
    if definitions is None or not isinstance(schema, Mapping):
        return schema
    own = rebased(schema, f"#/$defs/{ARGUMENTS_DEFINITION}")
    return {**own, "$defs": {**(own.get("$defs") or {}), **definitions}}


def is_text(schema: Mapping[str, Any]) -> bool:
    """Whether an XML call writes a property of this schema as raw text: one that may be a string (by its type, a
    type among others, a branch of ``anyOf``/``oneOf``, its enum or const), or says nothing of its type (vLLM's
    default)."""
    values = enum_values(schema)
    if values:
        return all(isinstance(value, str) for value in values)
    kinds = value_kinds(schema)
    return not kinds or "string" in kinds


def value_kinds(schema: Mapping[str, Any]) -> set[str]:
    """The JSON types a property's schema names (its type or types, its ``anyOf``/``oneOf`` branches'); none: any."""
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if isinstance(kind, str) else set()
    branches = [*(schema.get("anyOf") or ()), *(schema.get("oneOf") or ())]
    return kinds.union(*(value_kinds(branch) for branch in branches if isinstance(branch, Mapping)))


def enum_values(schema: Mapping[str, Any]) -> list[Any] | None:
    """A property's enum, or its const as one value; None for neither."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return values if isinstance(values, list) and values else None


def _named_call(found: ToolFormat, function: Mapping[str, Any], opening: str) -> Any:
    import xgrammar

    alphanumerics = xgrammar.Grammar.from_ebnf(f"root ::= [a-zA-Z0-9]{{{found.id_length}}}")
    given_id = [_literal(found.id_marker), alphanumerics] if found.id_marker else []
    arguments = _schema(function.get("parameters") or NO_PARAMETERS)
    return xgrammar.Grammar.concat(
        _literal(opening + function["name"]), *given_id, _literal(found.separator), arguments
    )


def _xml_call(found: ToolFormat, function: Mapping[str, Any], opening: str) -> Any:
    import xgrammar

    properties, required = _properties(function)
    parameters = function.get("parameters") or {}
    definitions = _definitions(parameters)
    parts = [_literal(f"{opening}\n<function={function['name']}>\n")]
    for key, schema in properties.items():
        read = resolved(schema, parameters)  # what the call's parser types the value by too
        text = isinstance(read, Mapping) and is_text(read)
        value = _text_value(read) if text else _schema(_alone(schema, definitions))
        block = xgrammar.Grammar.concat(_literal(f"<parameter={key}>\n"), value, _literal(f"\n{PARAMETER_END}\n"))
        parts.append(block if key in required else xgrammar.Grammar.union(block, _literal("")))
    parts.append(_literal(f"</function>\n{found.tags[1] if found.tags else ''}"))
    return xgrammar.Grammar.concat(*parts)


def _pythonic_call(function: Mapping[str, Any]) -> Any:
    """``name(key=value, ...)``: the function's properties as keyword arguments in the schema's order, the required
    ones always, the others where the model writes them, each value the JSON its schema allows."""
    import xgrammar

    properties, required = _properties(function)
    definitions = _definitions(function.get("parameters") or {})
    blocks = [(key in required, _literal(f"{key}="), _schema(_alone(schema, definitions)))
              for key, schema in properties.items()]  # fmt: skip

    def after(start: int) -> Any:  # blocks[start:] after an argument: each one written is preceded by ", "
        parts = [xgrammar.Grammar.concat(_literal(", "), key, value) for _, key, value in blocks[start:]]
        kept = [part if must else xgrammar.Grammar.union(part, _literal("")) for (must, _, _), part in
                zip(blocks[start:], parts, strict=True)]  # fmt: skip
        return xgrammar.Grammar.concat(*kept) if kept else _literal("")

    def first(start: int) -> Any:  # blocks[start:] before any argument
        if start == len(blocks):
            return _literal("")
        must, key, value = blocks[start]
        written = xgrammar.Grammar.concat(key, value, after(start + 1))
        return written if must else xgrammar.Grammar.union(written, first(start + 1))

    return xgrammar.Grammar.concat(_literal(f"{function['name']}("), first(0), _literal(")"))


def _properties(function: Mapping[str, Any]) -> tuple[Mapping[str, Any], set[str]]:
    """A function's parameters' properties and the names of the required ones; a 400 on ``tools`` where they are
    not an object and a list."""
    parameters = function.get("parameters") or {}
    properties, required = parameters.get("properties") or {}, parameters.get("required") or []
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        message = "a tool's parameters are not a JSON schema a call can follow: properties must be an object"
        raise ApiError(400, f"{message} and required a list", "tools")
    return properties, {name for name in required if isinstance(name, str)}


def _text_value(schema: Mapping[str, Any]) -> Any:
    """A string property's raw value: one of its enum (or its const), else any text without ``</parameter>``."""
    import xgrammar

    values = enum_values(schema)
    if values:
        return xgrammar.Grammar.union(*(_literal(value) for value in values))
    # t_i: i characters of </parameter> just read; any other character starts over ("<" from one)
    rules = ["root ::= t0", 't0 ::= "" | [^<] t0 | "<" t1']
    for i in range(1, len(PARAMETER_END)):
        ahead = PARAMETER_END[i]
        next_rule = f" | {json.dumps(ahead)} t{i + 1}" if i + 1 < len(PARAMETER_END) else ""
        rules.append(f't{i} ::= "" | "<" t1{next_rule} | [^<{ahead}] t0')
    return xgrammar.Grammar.from_ebnf("\n".join(rules))


def _repeated(call: Any, several: bool, separator: str = "", around: tuple[str, str] = ("", "")) -> str:
    """The EBNF of ``call`` once, or one or more times ``separator`` between them where ``several``; ``around`` the
    whole."""
    text = str(call)
    if not several and around == ("", ""):
        return text
    renamed = re.sub(r"^root ::=", "one_call ::=", text, count=1, flags=re.MULTILINE)
    more = "" if not several else f"({json.dumps(separator)} one_call)*" if separator else "one_call*"
    opening, closing = (f" {json.dumps(tag)} " if tag else " " for tag in around)
    return f"{renamed}\nroot ::={opening}one_call {more}{closing}\n"


def _literal(text: str) -> Any:
    import xgrammar

    return xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")


def _schema(schema: Any) -> Any:
    import xgrammar

    try:
        return xgrammar.Grammar.from_json_schema(json.dumps(compiled_schema(schema)), any_whitespace=False)
    except (RuntimeError, ValueError, TypeError) as error:  # xgrammar's word on a schema it cannot follow
        message = f"a tool's parameters are not a JSON schema a call can follow: {xgrammar_reason(error)}"
        raise ApiError(400, message, "tools") from None
