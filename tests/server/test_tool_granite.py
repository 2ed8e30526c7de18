"""Granite 3's calls (``<|tool_call|>`` and a JSON list of ``{"name", "arguments"}``, the whole answer, as its
templates ask for them): found, read, streamed and constrained; earlier calls written into their turn's content and
results under Granite's ``tool_response`` role, since its templates render neither; and through the server with and
without speculation."""

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

from quickdraft.server.messages import chat_messages
from quickdraft.server.tool_formats import GRANITE, HERMES, CallBody, ToolFormat, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

# Granite 3's shape (tools under its available_tools role, every turn's role and content and nothing else), with
# short role markup: a tokenizer of single characters reads a long prompt slowly
GRANITE_TEMPLATE = (
    "{% if tools %}<|start_of_role|>available_tools<|end_of_role|>{% for t in tools %}{{ t.function.name }} "
    "{% endfor %}\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "
)
CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]  # fmt: skip


def test_the_granite_template_has_its_format() -> None:
    assert tool_format(GRANITE_TEMPLATE) is GRANITE
    assert tool_format(GRANITE_TEMPLATE + "<tool_call>") is HERMES  # Granite 4's templates write Hermes' blocks


def test_a_tool_call_list_is_calls() -> None:
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), GRANITE)
    listed = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    # its opener is a special token the text may lose; Granite 3.1-3.3 write a plain <tool_call> (vLLM reads either)
    for text in ("<|tool_call|>" + listed, "<tool_call>" + listed, listed, f" {listed}\n"):
        content, calls = request.split_calls(text)
        assert content == "" and [call["function"]["name"] for call in calls] == ["get_weather", "get_time"], text
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"} and calls[0]["id"].startswith("call_")
    for not_calls in ("Sure: " + listed, '<|tool_call|>[{"name": "nope", "arguments": {}}]', "<|tool_call|>[",
                      "Paris is sunny."):  # fmt: skip
        assert request.split_calls(not_calls) == (not_calls, []), not_calls


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    request = ToolRequest((WEATHER, TIME), "auto", frozenset({"get_weather", "get_time"}), GRANITE)
    answers = ['<|tool_call|>[{"name": "get_time", "arguments": {}}]', '[{"name": "get_time", "arguments": {}}]',
               '<tool_call>[{"name": "get_time", "arguments": {}}]', "It is sunny.", "<|tool", "<tool", "[see above]",
               "<tool_call>[see above]"]  # fmt: skip
    assert_streamed_as_whole(request, answers)


def test_a_required_call_is_a_list_of_calls() -> None:
    request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required"}, GRANITE)
    two = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]'
    assert_grammar_accepts(request, {two: True, "[]": False})  # type: ignore[arg-type]


def test_earlier_calls_and_results_are_rendered_as_granite_reads_them() -> None:
    assistant, tool, _ = chat_messages({"messages": CALLED}, GRANITE)[1:]
    listed = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
    assert assistant == {"role": "assistant", "content": "<|tool_call|>" + listed}
    assert tool == {"role": "tool_response", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}
    spoken = [{**CALLED[1], "content": "Let me look."}, *CALLED[2:]]
    assert chat_messages({"messages": spoken}, GRANITE)[0]["content"] == "Let me look.<|tool_call|>" + listed
    plain = chat_messages({"messages": CALLED}, HERMES)  # formats whose templates render calls get them as objects
    assert plain[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"} and plain[2]["role"] == "tool"


def test_only_json_lists_and_python_calls_are_spelled() -> None:
    for body, tags in ((CallBody.JSON, ("<x>", "</x>")), (CallBody.XML, ("<x>", "</x>")), (CallBody.NAMED, None)):
        with pytest.raises(ValueError, match="only a JSON list of calls or Python calls"):
            ToolFormat(
                "f", "<x>", tags, "", "arguments", listed=False, parallel=True, body=body, spelled_into="content"
            )


@pytest.fixture(scope="module")
def granite_server() -> Iterator[Server]:
    with serving(char_pipeline(GRANITE_TEMPLATE)) as running:
        yield running


def test_granite_calls_through_the_server(granite_server: Server) -> None:
    assert_a_required_call_goes_round(granite_server)
