"""``server/tool_checks.py``: a hosted tool is refused by its type, an unknown key by its name; a function's name
follows OpenAI's rule."""

from __future__ import annotations

import re
from typing import Any

import pytest

from quickdraft.server.errors import ApiError
from quickdraft.server.tool_checks import check_definitions, check_shapes


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


@pytest.mark.parametrize("kind", ["web_search", "file_search", "custom"])
def test_a_hosted_tool_is_refused_by_its_type(kind: str) -> None:
    with pytest.raises(ApiError, match=f"this server runs function tools only, got '{kind}'") as error:
        check_shapes([function("f"), {"type": kind}])
    assert (error.value.param, error.value.code) == ("tools", "unsupported_parameter")
    with pytest.raises(ApiError, match="tools must be a list of"):
        check_shapes([{"function": {"name": "f"}}])  # no type at all: the shape is wrong


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "function", "function": {"name": "f", "paramters": {}}}, "tools[1].function.paramters"),
        ({"type": "function", "function": {"name": "f"}, "strict": True}, "tools[1].strict"),
    ],
)
def test_an_unknown_key_is_refused_not_dropped(tool: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError, match=f"unknown parameter: '{re.escape(param)}'") as error:
        check_shapes([function("g"), tool])
    assert (error.value.param, error.value.code) == (param, "unknown_parameter")
    described = {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False}
    check_shapes([{"type": "function", "function": described}])  # every key OpenAI defines passes


@pytest.mark.parametrize("name", ["a b!", "x" * 65, "get.weather", "ﬁnd"])
def test_a_name_openai_would_refuse_is_a_400(name: str) -> None:
    with pytest.raises(ApiError, match="a function's name is 1 to 64 letters, digits") as error:
        check_definitions([function(name)], python_names=False)
    assert error.value.param == "tools"


def test_names_openai_allows_pass_once_each() -> None:
    names = check_definitions([function("get_weather"), function("Get-Weather2"), function("x" * 64)], False)
    assert names == {"get_weather", "Get-Weather2", "x" * 64}
    with pytest.raises(ApiError, match="two tools have the same function name"):
        check_definitions([function("f"), function("f")], python_names=False)


@pytest.mark.parametrize(
    ("function_fields", "words"),
    [
        ({"parameters": {"type": "string"}}, "parameters must be a JSON schema of type object, got type 'string'"),
        ({"parameters": {"type": "array"}}, "of type object, got type 'array'"),
        ({"description": 5}, "a function's description must be text"),
        ({"parameters": True}, "of type object, got type 'bool'"),
    ],
)
def test_parameters_that_are_no_object_and_a_description_that_is_no_text_are_a_400(
    function_fields: dict[str, Any], words: str
) -> None:
    """A call's arguments are an object (a required call of a string's schema would be written, then dropped), as
    OpenAI refuses such a function; a schema that names no type still describes one."""
    tool = {"type": "function", "function": {"name": "f", **function_fields}}
    with pytest.raises(ApiError, match=re.escape(words)) as error:
        check_definitions([tool], python_names=False)
    assert error.value.param == "tools"
    untyped = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {}}}}}
    listed = {"type": "function", "function": {"name": "g", "parameters": {"type": ["object"]}}}
    assert check_definitions([untyped, listed], python_names=False) == {"f", "g"}
