"""A JSON schema as the grammar compiler (xgrammar's converter) gets it: refused where the converter would read
past a part of it (:func:`unenforced_part`: an answer could break it), and rewritten where the converter would write
what is no JSON (:func:`compiled_schema`). ``tests/test_grammar_schema.py`` holds each rule to an instance xgrammar lets
through without it."""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import is_int, is_number

# JSON Schema keywords xgrammar's converter reads past without enforcing them: a schema asking for one is refused,
# never half-kept (but for the value of each that asks for nothing)
UNENFORCED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
})  # fmt: skip
ASKS_NOTHING = {"uniqueItems": False, "dependentRequired": {}, "dependentSchemas": {}, "dependencies": {}}
# the string formats the converter writes as no JSON (a raw quote or control character), and a pattern's parts it
# reads past (lookarounds)
BROKEN_FORMATS = frozenset({"json-pointer", "relative-json-pointer"})
UNREAD_PATTERN = re.compile(r"\(\?<?[=!]")
RAW_CHARACTERS = (0, 0x1F, 0x22, 0x5C)  # what a JSON string escapes: the control characters, '"' and '\\'
MAX_EXACT_INTEGER = 2**53  # a larger enum or const integer is written as the double nearest it
# an integer's multipleOf the converter enforces: at most this, and beside no bound or a range of at most so many
MULTIPLE_MAX, MULTIPLE_RANGE = 1024, 10_000
MAX_COUNT = 128  # the largest count of a pattern's repeat xgrammar compiles (one of 129 fails to)
# where a schema holds the schemas looked in: maps of them, lists of them, and single ones (old ``items``: a list)
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_VALUES = ("items", "additionalItems", "additionalProperties", "propertyNames", "unevaluatedItems",
                 "unevaluatedProperties")  # fmt: skip
# a node holding one of these is that alone to the converter: each validation keyword beside it goes unread
SELECTORS = ("$ref", "const", "enum", "anyOf", "oneOf", "allOf")
STRING_KEYWORDS = ("minLength", "maxLength", "pattern", "format")
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
# on a node of no type: the keywords from which the converter infers an object or an array, and the keywords of
# one it reads only where it inferred it
INFERRED = {
    ("properties", "additionalProperties"): (
        "required", "minProperties", "maxProperties", "patternProperties", "propertyNames"),
    ("items", "prefixItems"): ("minItems", "maxItems"),
}  # fmt: skip
# the string formats the converter enforces (others are annotations to it, as JSON Schema 2020-12 has them by
# default: a length or pattern beside one of those is enforced), and those of them an empty string may have
FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer",
})  # fmt: skip
EMPTY_FORMATS = frozenset({"uri-reference", "uri-template", "json-pointer"})
VALIDATION_KEYWORDS = frozenset({
    "type", *SELECTORS, *STRING_KEYWORDS, *NUMBER_KEYWORDS, *SCHEMA_VALUES, "properties", "patternProperties",
    "prefixItems", *(keyword for pair in INFERRED.values() for keyword in pair),
})  # fmt: skip


def unenforced_part(schema: Any) -> str | None:
    """Where ``schema`` (a parsed JSON Schema) asks for what the compiler would not enforce, as ``path: what``: a
    keyword of :data:`UNENFORCED_KEYWORDS`, an ``allOf`` of more than one schema, a ``multipleOf`` on values that may
    be other than integers, or a keyword the converter reads past where it stands (:func:`_unread_beside`); None
    where it asks for none. Data (``enum``, ``const``, ``default``) is not looked in."""
    pending: list[tuple[Any, str]] = [(schema, "#")]
    while pending:
        node, path = pending.pop()
        if not isinstance(node, dict):
            continue
        asked = [name for name in UNENFORCED_KEYWORDS & node.keys() if not _asks_nothing(name, node[name])]
        if unenforced := sorted(asked):
            return f"{path}: {unenforced[0]}"
        if (unwritten := _unwritten(node, path)) is not None:
            return f"{path}: {unwritten}"
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
            return f"{path}: allOf of {len(node['allOf'])} schemas"
        if "multipleOf" in node and node.get("type") != "integer":
            return f"{path}: multipleOf on values that may be other than integers"
        if "multipleOf" in node and not _whole(node["multipleOf"]):
            return f"{path}: multipleOf {node['multipleOf']!r}, not a whole number"
        if "multipleOf" in node and node["multipleOf"] != 1 and not _multiple_kept(node):
            return f"{path}: multipleOf beside bounds it is not kept with (none, or both within {MULTIPLE_RANGE})"
        if (unread := _unread_beside(node)) is not None:
            return f"{path}: {unread}"
        branches = node.get("oneOf")
        if isinstance(branches, list) and not _disjoint(branches, schema):
            return f"{path}: oneOf of schemas an answer could match two of (the converter keeps it as anyOf)"
        pending += [
            ({"type": "string"} | child if named else child, at) for child, at, named in _subschemas(node, path)
        ]
    return None


def _disjoint(branches: list[Any], root: Any) -> bool:
    """Whether no value could match two of ``branches`` (``$ref``s into ``root`` resolved), as far as their types,
    their ``const`` or ``enum`` values, or such values of a property each requires tell (a discriminated union's)."""
    schemas = [resolved(branch, root) for branch in branches]
    return all(_apart(a, b, root) for i, a in enumerate(schemas) for b in schemas[i + 1 :])


def _apart(a: Any, b: Any, root: Any) -> bool:
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    kinds = [{k} if isinstance(k := s.get("type"), str) else set(k) if isinstance(k, list) else set() for s in (a, b)]
    for kind in kinds:
        kind |= {"number"} if "integer" in kind else set()  # an integer is a number
    if all(kinds) and not kinds[0] & kinds[1]:
        return True
    if _values_apart(a, b):
        return True
    required = [set(s["required"]) if isinstance(s.get("required"), list) else set() for s in (a, b)]
    shared = required[0] & required[1]
    properties = [s.get("properties") if isinstance(s.get("properties"), dict) else {} for s in (a, b)]
    return any(
        _values_apart(resolved(properties[0].get(name), root), resolved(properties[1].get(name), root))
        for name in shared
    )


def _values_apart(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` both list their values (``const``, ``enum``) and share none (as JSON compares them)."""
    first, second = _listed_values(a), _listed_values(b)
    if first is None or second is None:
        return False
    return not {_json_key(value) for value in first} & {_json_key(value) for value in second}


def _json_key(value: Any) -> tuple[str, Any]:
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", float(value))
    return ("json", json.dumps(value, sort_keys=True))


def resolved(branch: Any, root: Any) -> Any:
    """``branch``, or the schema its ``$ref`` points at in ``root`` (a JSON pointer such as ``#/$defs/Cat``)."""
    reference = branch.get("$ref") if isinstance(branch, dict) else None
    if not (isinstance(reference, str) and reference.startswith("#/")):
        return branch
    target = root
    for part in reference[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        target = target.get(part) if isinstance(target, dict) else None
    return target if isinstance(target, dict) else branch


def _asks_nothing(name: str, value: Any) -> bool:
    return name in ASKS_NOTHING and value == ASKS_NOTHING[name] and type(value) is type(ASKS_NOTHING[name])


def _unwritten(node: dict[str, Any], path: str) -> str | None:
    """What of ``node`` the converter would write as no JSON or would not find: a format of :data:`BROKEN_FORMATS`, a
    pattern with a part :data:`UNREAD_PATTERN` finds or a character a JSON string escapes, an enum or const integer
    past :data:`MAX_EXACT_INTEGER`, a ``$ref`` other than a JSON pointer into this document, an ``$id`` below
    the root."""
    if node.get("format") in BROKEN_FORMATS:
        return f"format {node['format']}"
    patterns = [node.get("pattern"), *(node.get("patternProperties") or {})]
    for pattern in (pattern for pattern in patterns if isinstance(pattern, str)):
        if (found := UNREAD_PATTERN.search(pattern)) is not None or _writes_raw(pattern):
            return f"pattern {pattern!r}" + (f" ({found.group()})" if found else ", which may write a raw character")
    if any(isinstance(value, int) and abs(value) > MAX_EXACT_INTEGER for value in _listed_values(node) or ()):
        return "an integer of the enum or const past 2**53"
    reference = node.get("$ref")
    if reference is not None and not (isinstance(reference, str) and (reference == "#" or reference.startswith("#/"))):
        return f"$ref {reference!r}, not a JSON pointer into this schema"
    return "$id below the root" if "$id" in node and path != "#" else None


@functools.lru_cache(maxsize=1024)  # a request's schema is checked each time it comes: its patterns compile once
def _writes_raw(pattern: str) -> bool:
    """Whether the converter would write a character of ``pattern`` raw: where it keeps the pattern as a regex of a
    JSON string (it then escapes what it writes) never; where it spells the pattern out, one :func:`_spells_raw`
    finds. A pattern it cannot compile is left to the compiler's own error."""
    import xgrammar

    try:
        grammar = xgrammar.Grammar.from_json_schema(json.dumps({"type": "string", "pattern": pattern}))
    except (RuntimeError, ValueError):
        return False
    return "json_string=true" not in str(grammar) and _spells_raw(pattern)


def _spells_raw(pattern: str) -> bool:
    """Whether ``pattern`` names a character a JSON string escapes (a literal or a range holding one: the converter
    writes those raw), as Python's parser reads it; one it cannot read: as if it did."""
    try:  # ECMA's named groups as Python spells them
        parsed = re._parser.parse(re.sub(r"\(\?<(?![=!])", "(?P<", pattern))  # type: ignore[attr-defined]
    except (re.error, RecursionError):
        return True
    low, high, quote, backslash = RAW_CHARACTERS
    pending = list(parsed)
    while pending:
        op, argument = pending.pop()
        name = str(op)
        if name == "LITERAL" and (low <= argument <= high or argument in (quote, backslash)):
            return True
        if name == "RANGE" and (argument[0] <= high or argument[0] <= quote <= argument[1]
                                or argument[0] <= backslash <= argument[1]):  # fmt: skip
            return True
        if name == "IN" and not any(str(item[0]) == "NEGATE" for item in argument):
            pending += argument
        elif name in ("SUBPATTERN", "MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT", "ATOMIC_GROUP", "BRANCH"):
            pending += _parts(argument)
    return False


def _parts(argument: Any) -> list[Any]:
    """The parsed items inside a group's, a repeat's or a branch's argument (its sub-patterns, however nested)."""
    found, pending = [], [argument]
    while pending:
        value = pending.pop()
        if isinstance(value, re._parser.SubPattern):  # type: ignore[attr-defined]
            found += list(value)
        elif isinstance(value, list | tuple):
            pending += list(value)
    return found


def _subschemas(node: dict[str, Any], path: str) -> list[tuple[Any, str, bool]]:
    """The schemas ``node`` holds, each with its path and whether it is a name's: ``propertyNames``' (but for a
    selector's), which constrains strings whatever its type says."""
    found: list[tuple[Any, str, bool]] = []
    for name in SCHEMA_MAPS:
        if isinstance(node.get(name), dict):
            found += [(value, f"{path}/{name}/{key}", False) for key, value in node[name].items()]
    for name in (*SCHEMA_LISTS, *SCHEMA_VALUES):
        value = node.get(name)
        named = name == "propertyNames" and isinstance(value, dict) and not any(key in value for key in SELECTORS)
        found += (
            [(item, f"{path}/{name}/{i}", False) for i, item in enumerate(value)]
            if isinstance(value, list)
            else [(value, f"{path}/{name}", named)]
        )
    return found


def _unread_beside(node: dict[str, Any]) -> str | None:
    """A keyword of ``node`` the converter reads past because of another: any beside a selector (:data:`SELECTORS`;
    a ``type`` beside ``enum`` or ``const`` only where a value is not of it, an ``enum`` beside a ``const`` only
    where it lacks it), a string's length beside its ``pattern`` or a format of :data:`FORMATS` (and a pattern
    beside such a format; a redundant ``minLength`` passes), a string's or number's bound on a node of no type, an
    object's or array's keyword without the one that makes it one (:data:`INFERRED`), a ``patternProperties``
    pattern or ``propertyNames`` that a listed property would have to follow, and a ``required`` name
    ``properties`` does not define."""
    keys = node.keys() & VALIDATION_KEYWORDS
    if selector := next((name for name in SELECTORS if name in node), None):
        beside = sorted(keys - {selector})
        values = _listed_values(node)
        if beside and selector in ("const", "enum") and values is not None and "$ref" not in beside:
            beside = [] if _values_follow(values, {name: node[name] for name in beside}) else beside
        return f"{beside[0]} beside {selector}" if beside else None
    if node.get("format") in FORMATS and _redundant_length(node):
        keys -= {"minLength"}
    if "pattern" in node and (beside := [name for name in ("minLength", "maxLength") if name in keys]):
        return f"{beside[0]} beside pattern"
    if node.get("format") in FORMATS and (beside := [name for name in STRING_KEYWORDS[:3] if name in keys]):
        return f"{beside[0]} beside format"
    if "type" not in node:
        if typed := [name for name in (*STRING_KEYWORDS, *NUMBER_KEYWORDS) if name in node]:
            return f"{typed[0]} on a schema of no type"
        for makers, counts in INFERRED.items():
            if not any(name in node for name in makers) and (counted := [name for name in counts if name in node]):
                return f"{counted[0]} on a schema of no type"
    listed = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    more = [name for name in ("additionalProperties", "unevaluatedProperties") if node.get(name, False) is not False]
    if listed and more:  # a listed name spelt with escapes ("\\u0061") would be another key to the converter
        return f"{more[0]} beside properties (leave it out or set it false)"
    if "propertyNames" in node and (listed or "patternProperties" in node):
        return "propertyNames beside " + ("properties" if listed else "patternProperties")
    required = node["required"] if isinstance(node.get("required"), list) else []
    least = node.get("minProperties")
    if isinstance(least, int) and least > len(required) and (more or "patternProperties" in node):
        return "minProperties beside keys a name may repeat"
    for pattern in node.get("patternProperties") or {}:
        if isinstance(pattern, str) and (named := [name for name in listed if _matches(pattern, name)]):
            return f"patternProperties {pattern!r}, which the listed property {named[0]!r} matches"
    if missing := [name for name in required if name not in listed]:
        return f"required {missing[0]!r}, which properties does not define"
    return None


def _values_follow(values: list[Any], siblings: dict[str, Any]) -> bool:
    """Whether every value of an ``enum`` or ``const`` is valid under the keywords beside it (which the converter
    reads past: they then ask for nothing more)."""
    from jsonschema import Draft202012Validator, SchemaError

    try:
        validator = Draft202012Validator(siblings, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return all(validator.is_valid(value) for value in values)
    except (SchemaError, RecursionError, ValueError, TypeError):
        return False


def _multiple_kept(node: dict[str, Any]) -> bool:
    """Whether the converter keeps an integer's ``multipleOf``: one of at most :data:`MULTIPLE_MAX`, beside no
    bound, or a lower and an upper one at most :data:`MULTIPLE_RANGE` apart."""
    lows = [node[name] for name in ("minimum", "exclusiveMinimum") if name in node]
    highs = [node[name] for name in ("maximum", "exclusiveMaximum") if name in node]
    if node["multipleOf"] > MULTIPLE_MAX:
        return False
    if not lows and not highs:
        return True
    if not (lows and highs) or not all(is_number(bound) for bound in (*lows, *highs)):
        return False
    return max(highs) - min(lows) <= MULTIPLE_RANGE


def _redundant_length(node: dict[str, Any]) -> bool:
    """Whether a string's ``minLength`` beside its ``format`` asks for nothing the format does not (at most 1, of
    a format no empty string has: pydantic's URLs write ``minLength: 1``)."""
    least = node.get("minLength")
    return is_number(least) and (least <= 0 or (least <= 1 and node["format"] not in EMPTY_FORMATS))


def _matches(pattern: str, name: str) -> bool:
    """Whether ``name`` matches the ECMA-262 ``pattern`` as Python reads it (one it cannot read: as if it did)."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def _whole(value: Any) -> bool:
    """A JSON integer: an int, or a float with no fraction (``2.0``), never a bool."""
    return is_int(value) or (isinstance(value, float) and value.is_integer())


def _listed_values(schema: Any) -> list[Any] | None:
    """The values a schema lists: its ``const`` as one, else its ``enum``; None where it lists none."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def check_enforced(schema: Any, setting: str) -> None:
    """``ConfigError`` (on ``setting``) for a schema :func:`unenforced_part` finds a part of."""
    if (part := unenforced_part(schema)) is not None:
        raise ConfigError(
            f"the JSON schema asks for what structured output cannot enforce ({part}): an answer could break it",
            setting,
        )


def compiled_schema(schema: Any) -> Any:
    """``schema`` as the converter is given it: a string's ``minLength``/``maxLength`` with no pattern, and no format
    it enforces (:data:`FORMATS`; another is an annotation to it), becomes a pattern of that many characters no JSON
    string escapes (:func:`length_pattern`): a string's by its type, among others too, or a ``propertyNames``' of
    none. The converter writes a control character raw under a length alone, which no JSON reader takes, and it
    already wrote no escape under one."""
    schema = copy.deepcopy(schema)
    pending: list[tuple[Any, bool]] = [(schema, False)]  # (node, a name: a string whatever its type says)
    while pending:
        node, named = pending.pop()
        if not isinstance(node, dict):
            continue
        kind = node.get("type", "string" if named else None)  # a name is a string
        stringy = kind == "string" or (isinstance(kind, list) and "string" in kind)
        lengths = [node.get("minLength", 0), node.get("maxLength")]
        counts = all(value is None or (_whole(value) and value >= 0) for value in lengths)
        enforced = "pattern" in node or (isinstance(node.get("format"), str) and node["format"] in FORMATS)
        if stringy and not enforced and lengths != [0, None] and counts:
            pattern = length_pattern(*(None if value is None else int(value) for value in lengths))
            if pattern is not None:
                node.pop("minLength", None), node.pop("maxLength", None)
                node["pattern"] = pattern
        pending += [(child, named) for child, _, named in _subschemas(node, "#")]
    return schema


def length_pattern(least: int, most: int | None) -> str | None:
    """A pattern of ``least`` to ``most`` (None: any more) characters no JSON string escapes, no repeat counting past
    :data:`MAX_COUNT` (xgrammar compiles none that does); None past what two levels of repeats reach."""
    unit = '[^\\x00-\\x1f"\\\\]'
    whole, part = divmod(least, MAX_COUNT)
    extra = None if most is None else most - least
    if whole > MAX_COUNT or (extra is not None and (extra < 0 or extra // MAX_COUNT > MAX_COUNT)):
        return None
    pieces = [f"(?:{unit}{{{MAX_COUNT}}}){{{whole}}}"] if whole else []
    pieces += [f"{unit}{{{part}}}"] if part else []
    if extra is None:
        pieces.append(f"{unit}*")
    else:
        blocks, rest = divmod(extra, MAX_COUNT)
        pieces += [f"(?:{unit}{{0,{MAX_COUNT}}}){{0,{blocks}}}"] if blocks else []
        pieces += [f"{unit}{{0,{rest}}}"] if rest else []
    return "^" + "".join(pieces) + "$"
