"""Pythonic calls (``[name(key=value, ...), ...]``, as Llama 3.2 and Llama 4 write them with their pythonic chat
templates): found, read with their literal values, streamed and constrained, and through the server with and without
speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Server, serving
from test_tools import (
    TIME,
    WEATHER,
    assert_a_required_call_goes_round,
    assert_grammar_accepts,
    assert_streamed_as_whole,
    char_pipeline,
)

from quickdraft.server.errors import ApiError
from quickdraft.server.tool_formats import HERMES, LLAMA3_JSON, PYTHONIC, QWEN_XML, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

# Tells the model the format as the pythonic templates do, and renders earlier calls the same way
PYTHONIC_TEMPLATE = (
    "{% if tools %}Call as [func_name1(params_name1=params_value1), func_name2(params)]: "
    "{% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.tool_calls %}[{% for c in m.tool_calls %}{{ c.function.name }}("
    "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v | tojson }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}){% if not loop.last %}, {% endif %}{% endfor %}]{% endif %}\n{% endfor %}assistant: "
)
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
    "filters": {"type": "object"}}, "required": ["query"]}}}  # fmt: skip


def test_the_pythonic_template_has_its_format() -> None:
    assert tool_format(PYTHONIC_TEMPLATE) is PYTHONIC
    assert tool_format('"parameters": dictionary of argument name and its value') is LLAMA3_JSON


def test_a_list_of_calls_is_read_with_its_literal_values() -> None:
    request = ToolRequest((SEARCH, TIME), "auto", frozenset({"search", "get_time"}), PYTHONIC)
    content, calls = request.split_calls(
        ' [search(query="fast", limit=3, exact=true, filters={"year": 2024, "tags": [None, -1.5]}), get_time()]\n'
    )
    assert content == "" and [call["function"]["name"] for call in calls] == ["search", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "query": "fast", "limit": 3, "exact": True, "filters": {"year": 2024, "tags": [None, -1.5]}}  # fmt: skip
    assert calls[1]["function"]["arguments"] == "{}" and calls[0]["id"].startswith("call_")
    python = request.split_calls("[search(query='x', exact=False, filters=None)]")[1]
    assert json.loads(python[0]["function"]["arguments"]) == {"query": "x", "exact": False, "filters": None}
    for not_calls in ('Sure: [search(query="x")]', '[search("x")]', "[nope()]", "[search(query=x)]", "[]",
                      'search(query="x")', "[search(**kwargs)]", "[search(query=1e999)]", "[search(query=f())]",
                      "[os.system(query='x')]", "[" * 10_000 + "]" * 10_000, "[search(query='x'"):  # fmt: skip
        assert request.split_calls(not_calls) == (not_calls, []), not_calls


def test_strings_read_as_json_reads_them_and_lone_surrogates_are_no_call() -> None:
    request = ToolRequest((SEARCH,), "auto", frozenset({"search"}), PYTHONIC)
    emoji = request.split_calls('[search(query="\\ud83d\\ude00")]')[1]  # a pair, as JSON escapes an emoji
    assert json.loads(emoji[0]["function"]["arguments"]) == {"query": "\U0001f600"}
    url = request.split_calls('[search(query="http:\\/\\/x.org", filters={"a\\/b": ["\\/"]})]')[1]  # JSON's \/
    assert json.loads(url[0]["function"]["arguments"]) == {"query": "http://x.org", "filters": {"a/b": ["/"]}}
    python = request.split_calls("[search(query='\\x41' \"b\")]")[1]  # Python's strings stay Python's
    assert json.loads(python[0]["function"]["arguments"]) == {"query": "Ab"}
    for lone in ('[search(query="\\ud800")]', '[search(query=["\\udfff"])]'):
        assert request.split_calls(lone) == (lone, []), lone  # no UTF-8 text a client could read


def test_names_a_pythonic_call_cannot_spell_are_400s() -> None:
    def tool(name: str, key: str = "q") -> dict[str, Any]:
        return {"type": "function", "function": {"name": name, "parameters": {"properties": {key: {}}}}}

    for bad in (tool("get-weather"), tool("f", "from"), tool("f", "user id"), tool("f", "\ufb01nd"), tool("class")):
        with pytest.raises(ApiError, match="not a Python name"):
            parse_tools({"tools": [bad]}, PYTHONIC)
    assert parse_tools({"tools": [tool("get_weather", "city")]}, PYTHONIC) is not None
    assert parse_tools({"tools": [tool("get-weather")]}, LLAMA3_JSON) is not None  # JSON formats spell any name


def test_parameters_that_are_no_schema_are_400s_not_500s() -> None:
    for parameters in ({"properties": ["q"]}, {"properties": {"q": {}}, "required": True}):
        bad = {"type": "function", "function": {"name": "f", "parameters": parameters}}
        for found in (PYTHONIC, QWEN_XML):
            for choice in ("auto", "required"):  # refused before any grammar is made
                with pytest.raises(ApiError, match="not a JSON schema") as error:
                    parse_tools({"tools": [bad], "tool_choice": choice}, found)
                assert error.value.status == 400 and error.value.param == "tools"


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((SEARCH, TIME), "auto", frozenset({"search", "get_time"}), PYTHONIC)
    answers = ['[search(query="x"), get_time()]', "The weather is fine.", "[1, 2] are numbers", "[search(",
               ' [get_time()] ', "a [get_time()]"]  # fmt: skip
    assert_streamed_as_whole(request, answers)


def test_pythonic_grammars_follow_each_property() -> None:
    for parallel in (True, False):
        body = {"tools": [SEARCH, TIME], "tool_choice": "required", "parallel_tool_calls": parallel}
        request = parse_tools(body, PYTHONIC)
        one = '[search(query="a b", limit=3, filters={"y": 1})]'
        accepted = {one: True, '[search(query="x")]': True, "[get_time()]": True,
                    '[search(query="x", exact=false)]': True, '[search(query="x"), get_time()]': parallel,
                    "[search(limit=3)]": False, '[search(limit=3, query="x")]': False,  # no query; order
                    '[search(query="x",)]': False, '[search(query="x", limit="3")]': False, "get_time()": False,
                    "[]": False, f"{one}x": False}  # fmt: skip
        assert_grammar_accepts(request, accepted, parallel)  # type: ignore[arg-type]


def test_a_strict_function_it_cannot_constrain_asks_nothing_it_cannot_enforce() -> None:
    """Pythonic calls open with no text of their own, so strict constrains none: a schema no constrained call could
    enforce is no 400 then (the Responses API makes every function strict by default)."""
    unique = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    tool = {"type": "function", "function": {"name": "pick", "parameters": unique, "strict": True}}
    assert parse_tools({"tools": [tool]}, PYTHONIC).grammar() is None  # type: ignore[union-attr]
    with pytest.raises(ApiError, match="cannot enforce"):
        parse_tools({"tools": [tool]}, HERMES).grammar()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def pythonic_server() -> Iterator[Server]:
    with serving(char_pipeline(PYTHONIC_TEMPLATE)) as running:
        yield running


def test_pythonic_calls_through_the_server(pythonic_server: Server) -> None:
    call = assert_a_required_call_goes_round(pythonic_server)
    assert call.function.name in (WEATHER["function"]["name"], TIME["function"]["name"])
