"""OLMo 3's calls (a ``<function_calls>`` block of Python calls, one a line, values in JSON, as its templates ask for
them): found, read, streamed and constrained; earlier calls handed to its templates in the ``function_calls`` field
they read, results under its ``environment`` role; and through the server with and without speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from conftest import Server, serving
from test_tool_granite import CALLED
from test_tool_pythonic import SEARCH
from test_tools import (
    TIME,
    WEATHER,
    assert_a_required_call_goes_round,
    assert_grammar_accepts,
    assert_streamed_as_whole,
    char_pipeline,
)

from quickdraft.server.errors import ApiError
from quickdraft.server.messages import chat_messages
from quickdraft.server.tool_formats import OLMO3, PYTHONIC, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

# OLMo 3's shape (its instruction naming the tags, an assistant turn's function_calls field, tool results as the
# environment's turns), with tools by name only: a tokenizer of single characters reads a long prompt slowly
OLMO3_TEMPLATE = (
    "{% if tools %}Output any function calls within <function_calls></function_calls> XML tags.<functions>"
    "{% for t in tools %}{{ t.function.name }} {% endfor %}</functions>\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
    "{% if m.get('function_calls', none) is not none %}<function_calls>{{ m.function_calls }}</function_calls>"
    "{% endif %}\n{% endfor %}assistant: "
)


def test_the_olmo3_template_has_its_format() -> None:
    assert tool_format(OLMO3_TEMPLATE) is OLMO3


def test_a_block_of_calls_is_read_line_by_line() -> None:
    request = ToolRequest((SEARCH, TIME), "auto", frozenset({"search", "get_time"}), OLMO3)
    block = '<function_calls>search(query="fast", exact=true, filters={"tags": [null]})\nget_time()</function_calls>'
    for text, content in ((block, ""), (f"Let me look.\n{block}", "Let me look.")):
        found, calls = request.split_calls(text)
        assert found == content and [call["function"]["name"] for call in calls] == ["search", "get_time"], text
        assert json.loads(calls[0]["function"]["arguments"]) == {
            "query": "fast",
            "exact": True,
            "filters": {"tags": [None]},
        }
    spread = '<function_calls>search(\n    query="x",\n    limit=2,\n)</function_calls>'  # a call over several lines
    assert json.loads(request.split_calls(spread)[1][0]["function"]["arguments"]) == {"query": "x", "limit": 2}
    tagged = 'See <function_calls> below.\n<function_calls>search(query="a </function_calls> b")</function_calls>'
    content, calls = request.split_calls(tagged)  # a tag inside a string is text, and one no call follows too
    assert content == "See <function_calls> below." and json.loads(calls[0]["function"]["arguments"]) == {
        "query": "a </function_calls> b"}  # fmt: skip
    for not_calls in ('search(query="x")', '[search(query="x")]', "<function_calls>get_time(</function_calls>",
                      "<function_calls>nope()</function_calls>", "<function_calls>get_time()\nnope()</function_calls>",
                      "<function_calls>x = get_time()</function_calls>", "<function_calls></function_calls>",
                      "<function_calls>get_time()"):  # fmt: skip
        assert request.split_calls(not_calls) == (not_calls, []), not_calls


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), OLMO3)
    answers = ["<function_calls>get_time()</function_calls>", 'Sure.\n<function_calls>get_weather(city="Oslo")\n'
               "get_time()</function_calls>", "It is sunny.", "<function_", "[get_time()]"]  # fmt: skip
    assert_streamed_as_whole(request, answers)


def test_a_required_call_is_a_block_of_calls() -> None:
    request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, OLMO3)
    two = '<function_calls>get_weather(city="Oslo")\nget_time()</function_calls>'
    assert_grammar_accepts(request, {two: True, "[get_time()]": False, "<function_calls></function_calls>": False})
    one = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False}, OLMO3)
    assert_grammar_accepts(one, {two: False, "<function_calls>get_time()</function_calls>": True})


def test_earlier_calls_and_results_are_rendered_as_olmo3_reads_them() -> None:
    assistant, tool, _ = chat_messages({"messages": CALLED}, OLMO3)[1:]
    assert assistant == {"role": "assistant", "content": "", "function_calls": 'get_weather(city="Paris")\nget_time()'}
    assert tool["role"] == "environment" and tool["content"] == "sunny"
    assert chat_messages({"messages": CALLED}, PYTHONIC)[1]["tool_calls"]  # Llama's templates render tool_calls
    listed = [CALLED[0], {**CALLED[1], "tool_calls": [{**CALLED[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": "[1]"}}]}, CALLED[2]]  # fmt: skip
    with pytest.raises(ApiError, match="arguments must be a JSON object"):
        chat_messages({"messages": listed}, OLMO3)


@pytest.fixture(scope="module")
def olmo3_server() -> Iterator[Server]:
    with serving(char_pipeline(OLMO3_TEMPLATE)) as running:
        yield running


def test_olmo3_calls_through_the_server(olmo3_server: Server) -> None:
    assert_a_required_call_goes_round(olmo3_server)
