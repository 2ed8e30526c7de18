"""Qwen3-Coder's XML calls (``<tool_call><function=name><parameter=key>value</parameter></function></tool_call>``, as
Qwen3-Coder and Qwen3.5 write them): found, split with each value typed by its property, streamed and constrained,
and through the server with and without speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Server, serving
from test_tools import (
    HERMES_TEMPLATE,
    TIME,
    assert_a_required_call_goes_round,
    assert_grammar_accepts,
    assert_streamed_as_whole,
    char_pipeline,
)

from quickdraft.server.tool_formats import HERMES, QWEN_XML, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

# As Qwen3-Coder's template describes and renders calls (tools by name only)
XML_TEMPLATE = (  # its instructions' example in a comment: a tokenizer of single characters reads them slowly
    "{# <tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter> #}"
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}\n<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n{{ v if v is string else v | tojson }}\n"
    "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}\n"
    "{% if m.role == 'tool' %}<tool_response>{{ m.content }}</tool_response>{% endif %}{% endfor %}assistant: "
)
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
    "filters": {"type": "object"}, "unit": {"enum": ["km", "mi"]}}, "required": ["query"]}}}  # fmt: skip


def xml(*blocks: str, function: str = "search") -> str:
    body = "".join(f"<parameter={block}</parameter>\n" for block in blocks)
    return f"<tool_call>\n<function={function}>\n{body}</function>\n</tool_call>"


def test_the_xml_template_has_its_format() -> None:
    assert tool_format(XML_TEMPLATE) is QWEN_XML and tool_format(HERMES_TEMPLATE) is HERMES  # both hold <tool_call>
    assert tool_format("<seed:tool_call> <parameter=") is None  # Seed-OSS's tags are not Qwen's


def test_xml_calls_are_split_and_typed_by_their_properties() -> None:
    request = ToolRequest((SEARCH, TIME), "auto", frozenset({"search", "get_time"}), QWEN_XML)
    text = "Let me look.\n" + xml("query>\nfast <b> & </para\n", "limit>\n3\n", "exact>\nTrue\n",
                                  'filters>\n{"year": 2024}\n', "unit>\nkm\n", "other>\n7\n")  # fmt: skip
    content, calls = request.split_calls(text + "\n" + xml(function="get_time"))
    assert content == "Let me look." and [call["function"]["name"] for call in calls] == ["search", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "query": "fast <b> & </para", "limit": 3, "exact": True, "filters": {"year": 2024}, "unit": "km",
        "other": "7"}  # fmt: skip
    assert calls[1]["function"]["arguments"] == "{}" and calls[0]["id"].startswith("call_")
    assert json.loads(request.split_calls(xml("query>\n42\n", "limit>\nmany\n"))[1][0]["function"]["arguments"]) == {
        "query": "42", "limit": "many"}  # fmt: skip  # a string stays text; what is not JSON stays as written
    bare = "Sure.\n<function=search>\n<parameter=query>\nx </tool_call> </function> y\n</parameter>\n</function>"
    content, calls = request.split_calls(bare)  # no tags, as Qwen3-Coder leaves them out at times; tags in a value
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {
        "query": "x </tool_call> </function> y"
    }
    loose = ToolRequest(({"type": "function", "function": {"name": "f", "parameters": {"properties": {
        "a": {}, "b": {"type": ["string", "null"]}, "c": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}},),
        "auto", frozenset({"f"}), QWEN_XML)  # fmt: skip
    found = loose.split_calls(xml("a>\n42\n", "b>\n2024\n", "c>\nnull\n", function="f"))[1]
    assert json.loads(found[0]["function"]["arguments"]) == {"a": "42", "b": "2024", "c": None}  # may be strings
    for not_a_call in (xml(function="nope"), "<tool_call>\n<function=search>\n",
                       "<tool_call>\n<function=search>\nstray text\n</function>\n</tool_call>"):  # fmt: skip
        assert request.split_calls(not_a_call) == (not_a_call, []), not_a_call


def test_a_json_value_runs_to_the_closing_tag_at_which_it_reads_as_json() -> None:
    request = ToolRequest((SEARCH,), "auto", frozenset({"search"}), QWEN_XML)
    text = xml("query>\nhi\n", 'filters>\n{"html": "</parameter>", "n": 1}\n', "limit>\n2\n")
    assert json.loads(request.split_calls(text)[1][0]["function"]["arguments"]) == {
        "query": "hi", "filters": {"html": "</parameter>", "n": 1}, "limit": 2}  # fmt: skip
    kept = xml("query>\nhi\n", "filters>\n{oops</parameter> x\n")  # no end reads as JSON: the first, as text
    assert json.loads(request.split_calls(kept)[1][0]["function"]["arguments"]) == {
        "query": "hi", "filters": "{oops</parameter> x"}  # fmt: skip


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((SEARCH,), "auto", frozenset({"search"}), QWEN_XML)
    query, limit = xml("query>\nx\n"), xml("limit>\n2\n")
    answers = [query, f"Sure.\n{query}\n{limit}", "Paris is sunny.", "<tool_", "<tool_call>\n<function=search>\n<p",
               '{"name": "search", "arguments": {"query": "x"}}', "Ok <function=search>\n</function>",
               "a <func"]  # fmt: skip
    assert_streamed_as_whole(request, answers)


def test_xml_grammars_follow_each_property() -> None:
    for parallel in (True, False):
        body = {"tools": [SEARCH, TIME], "tool_choice": "required", "parallel_tool_calls": parallel}
        request = parse_tools(body, QWEN_XML)
        one = xml("query>\na <b> </para x\n", "limit>\n3\n", "unit>\nmi\n")
        accepted = {one: True, xml("query>\nx\n"): True, xml(function="get_time"): True,
                    f"{one}\n{xml(function='get_time')}": parallel, xml("limit>\n3\n"): False,  # no query
                    xml("query>\nx </parameter>\n"): False, xml("query>\nx\n", "limit>\nthree\n"): False,
                    xml("query>\nx\n", "unit>\nm\n"): False, xml("limit>\n3\n", "query>\nx\n"): False,  # order
                    f"{one}x": False}  # fmt: skip
        assert_grammar_accepts(request, accepted, parallel)  # type: ignore[arg-type]


def test_a_property_that_points_into_the_parameters_is_typed_as_its_grammar_writes_it() -> None:
    """A ``$ref`` property (pydantic's nested models) is read through the pointer by the call's grammar and by the
    parser alike: an object's JSON is an object, not its text; a string stays text."""
    parameters = {"type": "object", "$defs": {"Addr": {"type": "object", "properties": {"street": {"type": "string"}},
                  "required": ["street"]}, "Name": {"type": "string"}},
                  "properties": {"addr": {"$ref": "#/$defs/Addr"}, "name": {"$ref": "#/$defs/Name"}},
                  "required": ["addr", "name"]}  # fmt: skip
    tool = {"type": "function", "function": {"name": "post", "parameters": parameters}}
    request = parse_tools({"tools": [tool], "tool_choice": "required"}, QWEN_XML)
    assert request is not None
    call = xml('addr>\n{"street": "x"}\n', "name>\n42\n", function="post")
    assert_grammar_accepts(request, {call: True}, True)
    arguments = json.loads(request.split_calls(call)[1][0]["function"]["arguments"])
    assert arguments == {"addr": {"street": "x"}, "name": "42"}


@pytest.fixture(scope="module")
def xml_server() -> Iterator[Server]:
    with serving(char_pipeline(XML_TEMPLATE)) as running:
        yield running


def test_xml_calls_through_the_server(xml_server: Server) -> None:
    assert_a_required_call_goes_round(xml_server, max_tokens=110)  # a call spelled in characters: 95 of them
