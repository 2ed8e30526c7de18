"""Qwen3-Coder's XML calls (``<tool_call><function=name><parameter=key>value</parameter></function></tool_call>``, as
Qwen3-Coder and Qwen3.5 write them): found, split with each value typed by its property, streamed and constrained,
and through the server with and without speculation."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import xgrammar
from conftest import MODEL, Server, serving
from test_tools import ASK, HERMES_TEMPLATE, TIME, WEATHER, char_pipeline

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


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((SEARCH,), "auto", frozenset({"search"}), QWEN_XML)
    query, limit = xml("query>\nx\n"), xml("limit>\n2\n")
    answers = [query, f"Sure.\n{query}\n{limit}", "Paris is sunny.", "<tool_", "<tool_call>\n<function=search>\n<p",
               '{"name": "search", "arguments": {"query": "x"}}', "Ok <function=search>\n</function>",
               "a <func"]  # fmt: skip
    generator = random.Random(0)
    for answer in answers:
        whole_content, whole_calls = request.split_calls(answer)
        for _ in range(20):
            held, streamed, start = request.call_filter(), "", 0
            while start < len(answer):
                end = start + generator.randint(1, 6)
                streamed += held.feed(answer[start:end])
                start = end
            content, calls = request.split_calls(held.text)
            assert streamed + content[held.sent :] == whole_content, answer
            assert [c["function"] for c in calls] == [c["function"] for c in whole_calls], answer


def test_xml_grammars_follow_each_property() -> None:
    for parallel in (True, False):
        body = {"tools": [SEARCH, TIME], "tool_choice": "required", "parallel_tool_calls": parallel}
        request = parse_tools(body, QWEN_XML)
        grammar = xgrammar.Grammar.from_ebnf(request.grammar().text)  # type: ignore[union-attr]
        one = xml("query>\na <b> </para x\n", "limit>\n3\n", "unit>\nmi\n")
        accepted = {one: True, xml("query>\nx\n"): True, xml(function="get_time"): True,
                    f"{one}\n{xml(function='get_time')}": parallel, xml("limit>\n3\n"): False,  # no query
                    xml("query>\nx </parameter>\n"): False, xml("query>\nx\n", "limit>\nthree\n"): False,
                    xml("query>\nx\n", "unit>\nm\n"): False, xml("limit>\n3\n", "query>\nx\n"): False,  # order
                    f"{one}x": False}  # fmt: skip
        for text, expected in accepted.items():
            assert xgrammar.testing._is_grammar_accept_string(grammar, text) == expected, (parallel, text)
        assert request.split_calls(one)[1], "what the grammar allows is read as a call"  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def xml_server() -> Iterator[Server]:
    with serving(char_pipeline(XML_TEMPLATE)) as running:
        yield running


def test_xml_calls_through_the_server(xml_server: Server) -> None:
    """A required call, the same with and without speculation and streamed, and the conversation it starts rendered
    again by the template (its call, the tool's result)."""
    client = xml_server.client()

    def call(drafter: str, stream: bool = False) -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=110, temperature=0,
            extra_body={"drafter": drafter}, stream=stream, parallel_tool_calls=False,
        )  # fmt: skip

    answers = [call(drafter).choices[0] for drafter in ("none", "draft-model", "hybrid")]
    first = answers[0].message.tool_calls
    assert answers[0].finish_reason == "tool_calls" and len(first) == 1 and answers[0].message.content is None
    for answer in answers[1:]:
        assert [(c.function.name, c.function.arguments) for c in answer.message.tool_calls] == [
            (c.function.name, c.function.arguments) for c in first]  # fmt: skip
    chunks = list(call("none", stream=True))
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in streamed] == [c.function.name for c in first]
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [first[0].model_dump()]},
                {"role": "tool", "tool_call_id": first[0].id, "content": "sunny"}]  # fmt: skip
    again = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=8)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
