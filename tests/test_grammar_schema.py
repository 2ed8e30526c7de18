"""``grammar_schema.py``: a JSON schema part xgrammar's converter reads past is refused, naming where (each rule held
to an instance xgrammar lets through without it); what it enforces passes; a string's length alone is compiled as a
pattern no JSON string escapes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from quickdraft.errors import ConfigError
from quickdraft.grammar import GrammarKind, GrammarSpec, grammar_of
from quickdraft.grammar_schema import compiled_schema, unenforced_part

UNENFORCED = {  # a schema with a part xgrammar reads past, and an instance that breaks it
    "not": ({"type": "integer", "not": {"const": 3}}, "3"),
    "if": ({"type": "integer", "if": {"minimum": 5}, "then": {"maximum": 6}}, "9"),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    "dependentRequired": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        '{"a": 1}',
    ),
    "dependentSchemas": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentSchemas": {"a": {"required": ["b"]}}},
        '{"a": 1}',
    ),
    "dependencies": ({"type": "object", "properties": {"a": {}, "b": {}}, "dependencies": {"a": ["b"]}}, '{"a": 1}'),
    "allOf of 2 schemas": ({"allOf": [{"type": "integer", "minimum": 2}, {"maximum": 3}]}, "9"),
    "multipleOf on values": ({"type": "number", "multipleOf": 0.5}, "0.3"),
    # a keyword the converter reads past because of where it stands
    "type beside anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}], "type": "integer"}, '""'),
    "maxLength beside enum": ({"enum": ["aaaa", "b"], "maxLength": 2}, '"aaaa"'),
    "type beside const": ({"type": "string", "const": 1}, "1"),
    "minimum beside allOf": ({"allOf": [{"type": "integer"}], "minimum": 3}, "1"),
    "maxLength beside pattern": ({"type": "string", "pattern": "^a+$", "maxLength": 2}, '"aaaa"'),
    "pattern beside format": ({"type": "string", "format": "date", "pattern": "^1"}, '"2020-01-01"'),
    "minLength on a schema of no type": ({"minLength": 3}, '"a"'),
    "minItems on a schema of no type": ({"minItems": 2}, "[1]"),
    "required 'b', which properties does not define": ({"type": "object", "required": ["b"]}, "{}"),
    "multipleOf 2.5, not a whole number": ({"type": "integer", "multipleOf": 2.5}, "2"),
    "patternProperties on a schema of no type": ({"patternProperties": {"^a": {"type": "integer"}}}, '{"a": "x"}'),
    "propertyNames beside properties": (
        {"type": "object", "properties": {"abc": {"type": "integer"}}, "propertyNames": {"maxLength": 2}},
        '{"abc": 1}',
    ),
    "patternProperties '^a', which the listed property 'ab' matches": (
        {"type": "object", "properties": {"ab": {"type": "string"}}, "patternProperties": {"^a": {"type": "integer"}}},
        '{"ab": "x"}',
    ),
    "multipleOf beside bounds": ({"type": "integer", "minimum": 0, "multipleOf": 2}, "3"),
    "additionalProperties beside properties": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
        '{"\\u0061": "s"}',
    ),
    "propertyNames beside patternProperties": (
        {"type": "object", "patternProperties": {"^[0-9]": {"type": "integer"}}, "propertyNames": {"enum": ["p"]}},
        '{"1": 1}',
    ),
    "minProperties beside keys a name may repeat": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
        '{"a": 1, "a": 2}',
    ),
    "pattern '^(?=.*\\\\d).+$' ((?=)": ({"type": "string", "pattern": "^(?=.*\\d).+$"}, '"abc"'),
    "pattern '^a\"b$', which may write a raw character": ({"type": "string", "pattern": '^a"b$'}, '"a"b"'),
    "format json-pointer": ({"type": "string", "format": "json-pointer"}, '"/a"b"'),
    "$ref '#a', not a JSON pointer into this schema": (
        {"$defs": {"a": {"$anchor": "a", "type": "integer"}}, "$ref": "#a"},
        '"x"',
    ),
    "an integer of the enum or const past 2**53": ({"enum": [12345678901234567890]}, "1.2345678901234567e+19"),
    "oneOf of schemas an answer could match two of": ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
}


@pytest.mark.parametrize("part", UNENFORCED)
def test_a_schema_part_the_compiler_does_not_enforce_is_refused(part: str) -> None:
    """Each part is one xgrammar lets an instance break (were it enforced now, its refusal could go), and a schema
    asking for it, however deep, is a ConfigError naming where."""
    import xgrammar

    schema, breaking = UNENFORCED[part]
    compiled = xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=True)
    assert xgrammar.testing._is_grammar_accept_string(compiled, breaking)
    deep = {"type": "object", "properties": {"x": {"type": "array", "items": schema}}}
    with pytest.raises(ConfigError, match=rf"cannot enforce \(#/properties/x/items: {re.escape(part)}") as refused:
        GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(deep))
    assert refused.value.setting == "json_schema"


def test_data_and_property_names_are_not_read_as_schema_keywords() -> None:
    properties = {"not": {"enum": [{"if": 1}]}, "contains": {"const": {"not": 2}}}
    schema = {"type": "object", "properties": properties, "required": ["not", "contains"]}
    assert unenforced_part(schema) is None
    GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema))


@pytest.mark.parametrize(
    "schema",
    [  # the shapes pydantic, zod and OpenAI's guide write: annotations beside a selector, a type its values have
        {"type": "string", "enum": ["a", "b"], "title": "Color", "description": "d"},
        {"type": ["string", "null"], "enum": ["a", None]},
        {"const": "x", "type": "string"},
        {"type": "integer", "enum": [1, 2.0]},
        {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}], "default": None, "title": "X"},
        {"$defs": {"C": {"type": "string"}}, "$ref": "#/$defs/C", "description": "d", "default": "c"},
        {"allOf": [{"type": "integer"}], "title": "wrapped"},
        {"properties": {"a": {}}, "required": ["a"]},
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 3}},
        {"type": "integer", "multipleOf": 2, "minimum": 0, "maximum": 100},  # kept within a range it enumerates
        {"type": "integer", "multipleOf": 5},
        {"type": "string", "format": "enum", "enum": ["a", "b"]},  # Gemini's: each value follows what is beside
        {"type": "string", "maxLength": 3, "enum": ["ab"]},
        {"type": "array", "items": {"type": "integer"}, "uniqueItems": False},  # asks for nothing
        {"type": "object", "properties": {"a": {}}, "dependentRequired": {}},
        {"type": "string", "pattern": "^[^\\x00-\\x1f]+$"},  # a class that leaves the escaped ones out
        {"type": "string", "pattern": "^[ -~]+$"},  # kept as a JSON string's regex: xgrammar escapes what it writes
        {"type": "string", "pattern": "^(?<year>\\d{4})-(?<month>\\d{2})$"},  # ECMA's named groups
        {"type": "string", "pattern": "^\\S+$"},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},  # types no value shares
        {  # pydantic's discriminated union: each branch requires its own const of pet_type
            "$defs": {
                kind: {
                    "type": "object",
                    "properties": {"pet_type": {"const": kind, "type": "string"}},
                    "required": ["pet_type"],
                }
                for kind in ("cat", "dog")
            },
            "oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}],
            "discriminator": {"propertyName": "pet_type"},
        },
        {"type": "string", "pattern": "^a+$"},
        {"const": "cat", "enum": ["cat"], "type": "string"},  # pydantic 2.9's Literal["cat"]
        {"type": "string", "format": "uri", "minLength": 1},  # a URL is never empty
        {"type": "string", "format": "x-unknown", "maxLength": 3},  # an annotation to xgrammar: the length is kept
        {"type": "object", "propertyNames": {"$ref": "#/$defs/C"}, "$defs": {"C": {"enum": ["red", "blue"]}}},
    ],
)
def test_what_the_converter_enforces_passes(schema: dict[str, Any]) -> None:
    assert unenforced_part(schema) is None


def test_a_strings_length_alone_is_compiled_as_a_pattern_no_json_string_escapes() -> None:
    """The converter writes a tab raw under a length alone (no JSON reader takes it); compiled as a pattern, the
    length holds and what a JSON string escapes cannot be written."""
    import xgrammar

    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 3}}}
    raw = xgrammar.Grammar.from_json_schema(json.dumps(schema))
    assert xgrammar.testing._is_grammar_accept_string(raw, '{"a": "a\tb"}')
    compiled = grammar_of(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema)))
    for text, allowed in (
        ('{"a": "a\tb"}', False),
        ('{"a": "abc"}', True),
        ('{"a": "abcd"}', False),
        ('{"a": ""}', False),
    ):
        assert xgrammar.testing._is_grammar_accept_string(compiled, text) is allowed, text
    assert compiled_schema(schema) != schema and schema["properties"]["a"]["maxLength"] == 3  # a copy is changed


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "string", "maxLength": 200}, '"' + "a" * 200 + '"', '"' + "a" * 201 + '"'),  # past one repeat's 128
        ({"type": "string", "minLength": 300, "maxLength": 300}, '"' + "é" * 300 + '"', '"' + "a" * 299 + '"'),
        ({"type": ["string", "null"], "maxLength": 3}, "null", '"abcd"'),
        ({"type": "string", "format": "password", "minLength": 1}, '"a"', '""'),  # pydantic's SecretStr: an annotation
        ({"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"maxLength": 3}},
         '{"ab": 1}', '{"abcd": 1}'),
    ],
)  # fmt: skip
def test_every_strings_length_is_compiled_so(schema: dict[str, Any], good: str, bad: str) -> None:
    """Past 128 characters, beside another type, or a property name's: the length holds and no tab comes raw."""
    import xgrammar

    compiled = grammar_of(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema)))
    tab = '{"a\tb": 1}' if "propertyNames" in schema else '"a\tb"'
    assert xgrammar.testing._is_grammar_accept_string(compiled, good)
    assert not xgrammar.testing._is_grammar_accept_string(compiled, bad)
    assert not xgrammar.testing._is_grammar_accept_string(compiled, tab)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "string", "format": ["x"]}, "['x'] is not of type 'string'"),
        ({"type": "object", "patternProperties": 5}, "5 is not of type 'object'"),
        ({"type": "nonsense"}, "'nonsense' is not valid"),
        ({"$schema": 5}, "its $schema must be a URI"),
    ],
)
def test_a_schema_that_is_no_json_schema_is_refused_saying_why(schema: dict[str, Any], why: str) -> None:
    """Checked against its meta-schema first, as a tool's parameters are: a format or patternProperties of the wrong
    type was a TypeError (a 500 through the server), and the converter's own errors do not say where."""
    with pytest.raises(ConfigError, match=re.escape(f"the JSON schema is not a valid JSON schema: {why}")):
        GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema))
