"""Whole answers of a JSON list of calls after an opening word: Phi-4-mini's (``functools[{"name", "arguments"}, ...]``,
with vLLM's tool template for it) and Granite's (``<|tool_call|>[...]``, a special token its answers keep): found,
read with the opener or without it, streamed and constrained, and through the server with and without speculation."""

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

from quickdraft.server.tool_formats import GRANITE, PHI4_MINI, ToolFormat, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools


def lists_template(found: ToolFormat) -> str:
    """Lists the tools after the format's marker, tells the model the format as the family's tool template does, and
    renders earlier calls as it does."""
    opener = found.opener
    return (
        f'{{% if tools %}}{found.marker} Call as {opener}[{{"name": ..., "arguments": ...}}]: '
        "{% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
        "{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
        f"{{% if m.tool_calls %}}{opener}{{{{ m.tool_calls | map(attribute='function') | list | tojson }}}}"
        "{% endif %}"
        "\n{% endfor %}assistant: "
    )


FORMATS = {"phi4-mini": (PHI4_MINI, ()), "granite": (GRANITE, ("<|tool_call|>",))}  # the format, its special tokens


@pytest.mark.parametrize("name", FORMATS)
def test_a_list_after_its_opener_is_calls(name: str) -> None:
    found, _ = FORMATS[name]
    assert tool_format(lists_template(found)) is found
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), found)
    calls = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    for text in (found.opener + calls, calls):  # as written, and as a constrained answer writes it
        content, read = request.split_calls(text)
        assert content == "" and [call["function"]["name"] for call in read] == ["get_weather", "get_time"]
        assert json.loads(read[0]["function"]["arguments"]) == {"city": "Paris"}
    for not_calls in (f'Sure: {found.opener}[{{"name": "get_time", "arguments": {{}}}}]',
                      f'{found.opener}[{{"name": "nope"}}]', found.opener, f"{found.opener} is a word"):  # fmt: skip
        assert request.split_calls(not_calls) == (not_calls, []), not_calls


@pytest.mark.parametrize("name", FORMATS)
def test_a_streamed_answer_is_split_as_the_whole_answer_is(name: str) -> None:
    found, _ = FORMATS[name]
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), found)
    call = f'{found.opener}[{{"name": "get_time", "arguments": {{}}}}]'
    assert_streamed_as_whole(
        request, [call, "It is sunny.", f"{found.opener} is a word", found.opener[:4], f" {call} "]
    )


@pytest.mark.parametrize("name", FORMATS)
def test_a_required_call_is_a_list_of_calls(name: str) -> None:
    request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, FORMATS[name][0])
    two = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'
    assert_grammar_accepts(request, {two: True, "[]": False})  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=list(FORMATS))
def lists_server(request: pytest.FixtureRequest) -> Iterator[tuple[ToolFormat, Server]]:
    found, specials = FORMATS[request.param]
    with serving(char_pipeline(lists_template(found), specials)) as running:
        yield found, running


def test_listed_calls_through_the_server(lists_server: tuple[ToolFormat, Server]) -> None:
    assert_a_required_call_goes_round(lists_server[1])
