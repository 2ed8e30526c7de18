"""Mistral's named calls (``[TOOL_CALLS]name[ARGS]{arguments}``, and ``[CALL_ID]id`` before ``[ARGS]`` where the
template renders one): found, split, streamed and constrained, their special tokens kept in a tool request's text
only, and through the server with and without speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import xgrammar
from conftest import MODEL, Server, serving
from test_tools import (
    ASK,
    CHARS,
    MISTRAL_TEMPLATE,
    TIME,
    WEATHER,
    assert_a_required_call_goes_round,
    assert_streamed_as_whole,
    char_pipeline,
)

from quickdraft.server.tool_formats import MISTRAL, MISTRAL_CALL_ID, MISTRAL_NAMED, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools
from quickdraft.text import IncrementalDecoder, dropped_ids

MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
# As Mistral Small 3.2's and Devstral's templates render calls and results (tools by name only)
NAMED_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' %}{% if tools %}[AVAILABLE_TOOLS]{% for t in tools %}"
    "{{ t.function.name }} {% endfor %}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[ARGS]"
    "{{ c.function.arguments | tojson }}{% endfor %}<eos>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}<eos>{% endif %}{% endfor %}"
)
CALL_ID_TEMPLATE = NAMED_TEMPLATE.replace("[ARGS]", "[CALL_ID]{{ c.id }}[ARGS]").replace(
    "[TOOL_RESULTS]", "[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]"
)


def test_each_named_template_has_its_format() -> None:
    assert tool_format(NAMED_TEMPLATE) is MISTRAL_NAMED and tool_format(CALL_ID_TEMPLATE) is MISTRAL_CALL_ID
    assert tool_format(MISTRAL_TEMPLATE) is MISTRAL  # the older list of JSON calls


def named(found: Any = MISTRAL_NAMED) -> ToolRequest:
    return ToolRequest((), "auto", frozenset({"f", "g"}), found)


def test_named_calls_are_split_from_the_answer() -> None:
    content, calls = named().split_calls('Let me look.[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}')
    assert content == "Let me look." and [call["function"]["name"] for call in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1} and calls[1]["function"]["arguments"] == "{}"
    assert all(len(call["id"]) == 9 and call["id"].isalnum() for call in calls)
    assert named().split_calls('[TOOL_CALLS]f{"x": 1}')[1][0]["function"]["name"] == "f"  # [ARGS] lost: still a call
    content, calls = named(MISTRAL_CALL_ID).split_calls("[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{}")
    assert content == "" and calls[0]["id"] == "abcDEF123"  # the model's id: its next turn refers to it
    assert named(MISTRAL_CALL_ID).split_calls("[TOOL_CALLS]f[CALL_ID]short[ARGS]{}")[1][0]["id"] != "short"
    for not_calls in ("[TOOL_CALLS]h[ARGS]{}", "[TOOL_CALLS]f[ARGS]{oops", "[TOOL_CALLS]f[ARGS][1]", "[TOOL_CALLS]",
                      "[TOOL_CALLS]f[ARGS]{\"x\": NaN}", "Paris is sunny.", "[TOOL_CALLS]f g[ARGS]{}"):  # fmt: skip
        assert named().split_calls(not_calls) == (not_calls, []), not_calls
    assert named().split_calls('{"name": "f", "arguments": {}}')[1]  # a whole answer of one JSON call, as every format
    # as Hermes' blocks: each tag's call that is one (not a cut last one, not an unknown function)
    for text in ('[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{"y', '[TOOL_CALLS]f[ARGS]{"x": 1}\nDone.',
                 '[TOOL_CALLS]h[ARGS]{}[TOOL_CALLS]f[ARGS]{"x": 1}'):  # fmt: skip
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in named().split_calls(text)[1]] == [
            ("f", '{"x": 1}')], text  # fmt: skip
    content, calls = named().split_calls('[TOOL_CALLS]f[ARGS]{"code": "[TOOL_CALLS]g[ARGS]{}"}')  # a tag as text
    assert [call["function"]["name"] for call in calls] == ["f"] and "[TOOL_CALLS]g" in calls[0]["function"][
        "arguments"
    ]
    odd = ToolRequest((), "auto", frozenset({"ns:tool", "get weather"}), MISTRAL_NAMED)  # names a grammar may force
    found = odd.split_calls("[TOOL_CALLS]ns:tool[ARGS]{}[TOOL_CALLS]get weather{}")[1]
    assert [call["function"]["name"] for call in found] == ["ns:tool", "get weather"]
    same = named(MISTRAL_CALL_ID).split_calls(
        "[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{}[TOOL_CALLS]g[CALL_ID]abcDEF123[ARGS]{}"
    )
    assert same[1][0]["id"] == "abcDEF123" and same[1][1]["id"] != "abcDEF123"  # ids tell the results apart
    assert named(MISTRAL_CALL_ID).split_calls("[TOOL_CALLS]f[CALL_ID]abcdéfgh1[ARGS]{}")[1][0]["id"] != "abcdéfgh1"


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    answers = ['[TOOL_CALLS]f[ARGS]{"x": 1}', 'Sure.\n[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{"y": [1]}',
               "[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{}", "Paris is sunny.", "[TOOL_", "A [ list", "[TOOL_CALLS]h{}",
               '{"name": "f", "arguments": {}}', "[TOOL_CALLS]f[ARGS]{"]  # fmt: skip
    for found in (MISTRAL_NAMED, MISTRAL_CALL_ID):
        assert_streamed_as_whole(named(found), answers)


def test_named_grammars_follow_the_format() -> None:
    for found, given_id in ((MISTRAL_NAMED, ""), (MISTRAL_CALL_ID, "[CALL_ID]abcDEF123")):
        one = f"[TOOL_CALLS]get_time{given_id}[ARGS]{{}}"
        two = f'{one}[TOOL_CALLS]get_weather{given_id}[ARGS]{{"city": "Paris"}}'
        for parallel in (True, False):
            body = {"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": parallel}
            request = parse_tools(body, found)
            grammar = xgrammar.Grammar.from_ebnf(request.grammar().text)  # type: ignore[union-attr]
            bad_id = one.replace("abcDEF123", "abc") if given_id else f"{one}[CALL_ID]"
            wrong = (f"{one}x", two.replace("Paris", "Rome"), one.replace("get_time", "get_date"),
                     one.replace("[ARGS]", ""), bad_id)  # fmt: skip
            for text, accepted in ((one, True), (two, parallel), *((text, False) for text in wrong)):
                assert xgrammar.testing._is_grammar_accept_string(grammar, text) == accepted, (found.name, text)
            assert request.split_calls(two)[1], found.name  # what the grammar allows is read as calls


def test_only_the_kept_special_tokens_have_text() -> None:
    tokenizer = char_pipeline(NAMED_TEMPLATE, MARKERS).tokenizer
    calls, args, eos = (tokenizer.convert_tokens_to_ids(text) for text in ("[TOOL_CALLS]", "[ARGS]", "<eos>"))
    ids = [calls, *tokenizer("f", add_special_tokens=False).input_ids, args, eos]
    both = ("[TOOL_CALLS]", "[ARGS]")
    for kept, text in (((), "f"), (("[TOOL_CALLS]",), "[TOOL_CALLS]f"), (both, "[TOOL_CALLS]f[ARGS]")):
        decoder = IncrementalDecoder(tokenizer, kept_special=kept)
        for token_id in ids:
            decoder.add(token_id)
        assert decoder.release(final=True) == text, kept
    assert dropped_ids(tokenizer, ("<eos>",)) >= {calls, args} and calls not in dropped_ids(
        tokenizer, ("[TOOL_CALLS]",)
    )


@pytest.fixture(scope="module", params=[NAMED_TEMPLATE, CALL_ID_TEMPLATE], ids=["named", "call-id"])
def named_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with serving(char_pipeline(request.param, MARKERS)) as running:
        yield running


def test_named_calls_through_the_server(named_server: Server) -> None:
    call = assert_a_required_call_goes_round(named_server)
    assert len(call.id) == 9 and call.id.isalnum()


def test_a_tool_request_keeps_the_markers_text_and_others_do_not(named_server: Server) -> None:
    client = named_server.client()
    forced = {"logit_bias": {str(len(CHARS) + 1): 100}}  # [TOOL_CALLS]: the first special token after <eos>

    def answer(**tools: Any) -> str | None:
        response = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, extra_body=forced, **tools)
        return response.choices[0].message.content

    assert answer(tools=[WEATHER]) == "[TOOL_CALLS]"  # a cut call is content: the model's own text
    assert answer() == "" and answer(tools=[WEATHER], tool_choice="none") == ""  # no calls read: no marker
