"""Phi-4-mini's calls (``functools[{"name", "arguments"}, ...]``, as Phi-4-mini writes them with vLLM's tool template
for it): found, read as a whole answer's JSON list, streamed and constrained, and through the server with and without
speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator

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

from quickdraft.server.tool_formats import PHI4_MINI, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

# Tells the model the format as the Phi-4-mini tool template does, and renders earlier calls as it does
FUNCTOOLS_TEMPLATE = (
    '{% if tools %}Call as functools[{"name": ..., "arguments": ...}]: '
    "{% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
    '{% for c in m.tool_calls or [] %}{"name": "{{ c.function.name }}", '
    '"arguments": {{ c.function.arguments | tojson }}}'
    "{% if not loop.last %},{% endif %}{% endfor %}\n{% endfor %}assistant: "
)


def test_the_functools_template_has_its_format() -> None:
    assert tool_format(FUNCTOOLS_TEMPLATE) is PHI4_MINI


def test_a_functools_list_is_calls() -> None:
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), PHI4_MINI)
    text = 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    content, calls = request.split_calls(text)
    assert content == "" and [call["function"]["name"] for call in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert request.split_calls(text.removeprefix("functools"))[1]  # as a constrained answer writes it
    for not_calls in ('Sure: functools[{"name": "get_time", "arguments": {}}]', 'functools[{"name": "nope"}]',
                      "functools[", "functools is a Python module"):  # fmt: skip
        assert request.split_calls(not_calls) == (not_calls, []), not_calls


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), PHI4_MINI)
    answers = ['functools[{"name": "get_time", "arguments": {}}]', "It is sunny.", "functools is a module", "func",
               ' functools[{"name": "get_time", "arguments": {}}] ']  # fmt: skip
    assert_streamed_as_whole(request, answers)


def test_a_required_call_is_a_list_of_calls() -> None:
    request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, PHI4_MINI)
    two = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'
    assert_grammar_accepts(request, {two: True, "[]": False})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def functools_server() -> Iterator[Server]:
    with serving(char_pipeline(FUNCTOOLS_TEMPLATE)) as running:
        yield running


def test_functools_calls_through_the_server(functools_server: Server) -> None:
    assert_a_required_call_goes_round(functools_server)
