"""Tool calls: OpenAI's tools and tool_choice over a Hermes-format chat template, parsed, streamed and constrained,
with and without speculation; and the pure pieces (parsing, the stream's hold-back, validation)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from conftest import MODEL, Server, native_from_hf, serving, tiny_model

from quickdraft.api import Pipeline
from quickdraft.server.errors import ApiError
from quickdraft.server.tools import CallFilter, ToolRequest, parse_tools, split_calls, template_message

CHARS = [chr(code) for code in range(32, 127)] + ["\n"]
HERMES = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools> answer in <tool_call> tags\n"
    "{% endif %}{% for m in messages %}{{ m.role }}: {% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "</tool_call>{% endfor %}\n{% endfor %}assistant: "
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}
BAD_SCHEMA = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def char_pipeline() -> Pipeline:
    """Tiny native models over a tokenizer of single characters, with a Hermes-format chat template: a grammar
    can spell any call."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(CHARS)} | {"<eos>": len(CHARS)}
    tokenizer_model = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer_model.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_model, eos_token="<eos>")
    tokenizer.chat_template = HERMES
    return Pipeline(
        target=native_from_hf(tiny_model(len(vocab), seed=3, logit_scale=4.0)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({len(CHARS)}),
        draft=native_from_hf(tiny_model(len(vocab), seed=4, logit_scale=4.0, num_layers=1)),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(char_pipeline()) as running:
        yield running


@pytest.mark.parametrize("drafter", ["none", "draft-model", "hybrid"])
def test_a_required_call_is_a_valid_call_of_an_offered_function(server: Server, drafter: str) -> None:
    response = server.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, temperature=0,
        extra_body={"drafter": drafter},
    )  # fmt: skip
    choice, cut = response.choices[0], response.usage.completion_tokens == 120
    assert choice.finish_reason == ("length" if cut else "tool_calls") and choice.message.content is None  # calls
    # may repeat until the budget cuts the last one: then "length", so a client knows one may be missing
    assert choice.message.tool_calls  # one or more: parallel_tool_calls is OpenAI's default
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        if call.function.name == "get_weather":
            assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
        else:
            assert call.function.name == "get_time" and json.loads(call.function.arguments) == {}


def test_without_parallel_calls_a_required_answer_is_one_call(server: Server) -> None:
    response = server.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, temperature=0,
        parallel_tool_calls=False,
    )  # fmt: skip
    assert len(response.choices[0].message.tool_calls) == 1


def test_a_required_answer_may_hold_several_calls_unless_parallel_calls_are_off() -> None:
    import xgrammar

    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    two = f"{one}\n{one}"
    for parallel, accepted in ((True, (one, two)), (False, (one,))):
        request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": parallel},
                              HERMES)  # fmt: skip
        assert request is not None and request.parallel == parallel
        spec = request.grammar()
        assert spec is not None
        grammar = xgrammar.Grammar.from_ebnf(spec.text)
        for text in (one, two, f"{one}x"):
            assert xgrammar.testing._is_grammar_accept_string(grammar, text) == (text in accepted), (parallel, text)
    with pytest.raises(ApiError, match="parallel_tool_calls"):
        parse_tools({"tools": [WEATHER], "parallel_tool_calls": "yes"}, HERMES)


def test_the_call_is_the_same_with_and_without_speculation(server: Server) -> None:
    def call(drafter: str) -> tuple[str, str]:
        response = server.client().chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, temperature=0,
            extra_body={"drafter": drafter},
        )  # fmt: skip
        function = response.choices[0].message.tool_calls[0].function
        return function.name, function.arguments

    assert call("none") == call("draft-model") == call("hybrid")


def test_a_named_function_is_the_one_called(server: Server) -> None:
    response = server.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False,
    )  # fmt: skip
    assert response.choices[0].message.tool_calls[0].function.name == "get_time"
    assert response.choices[0].finish_reason == "stop"  # OpenAI's for a named function


def test_a_streamed_call_arrives_as_tool_call_deltas(server: Server) -> None:
    stream = server.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, temperature=0,
        stream=True, parallel_tool_calls=False,
    )  # fmt: skip
    chunks = list(stream)
    calls = [call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []]
    content = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert [call.function.name for call in calls] == ["get_weather"] and calls[0].index == 0
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Oslo")
    assert "<tool_call>" not in content and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_conversation_goes_on_after_a_tool_result(server: Server) -> None:
    arguments = json.dumps({"city": "Paris"})
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    response = server.client().chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8, temperature=0
    )
    assert response.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_bad_tools_are_clear_400s(server: Server) -> None:
    client = server.client()
    bad = [
        {"tools": [{"type": "function"}]},
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tool_choice": "required"},
        {"tools": [WEATHER] * 129},
        {"tools": [WEATHER, WEATHER]},
        {"tools": [BAD_SCHEMA], "tool_choice": "required"},  # xgrammar cannot follow it: 400, not a 500
        {"tools": [BAD_SCHEMA], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    ]
    for extra in bad:
        with pytest.raises(openai.BadRequestError, match="tool"):
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, extra_body=extra)


def test_calls_are_split_from_the_answer() -> None:
    names = frozenset({"f", "g"})
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
    text += '<tool_call>{"name": "g"}</tool_call>'
    content, calls = split_calls(text, names)
    assert content == "Let me look." and [call["function"]["name"] for call in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1} and calls[1]["function"]["arguments"] == "{}"
    for not_a_call in ('<tool_call>{"name": "h"}</tool_call>', "<tool_call>{oops</tool_call>", "<tool_call>"):
        assert split_calls(not_a_call, names) == (not_a_call, [])
    fenced = '```json\n{\n  "name": "f",\n  "arguments": {"city": "Paris"}\n}\n```'  # Qwen2.5-Coder's answer
    content, calls = split_calls(fenced, names)
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    for not_a_call in ('{"name": "f"}', 'See: ```json\n{"name": "f", "arguments": {}}\n```', '{"name": "h"}'):
        assert split_calls(not_a_call, names) == (not_a_call, [])


def test_the_stream_holds_back_only_what_may_open_a_call() -> None:
    held = CallFilter()
    assert held.feed("Hello <to") == "Hello" and held.feed("day") == " <today"  # whitespace before a call is held
    assert held.feed(" now <tool_") == " now" and held.feed('call>{"name"') == "" and held.feed(" more") == ""
    assert held.text.endswith('<tool_call>{"name" more')
    whole = CallFilter()
    assert whole.feed("```js") == "" and whole.feed('on\n{"name"') == "" and whole.sent == 0  # held to the end
    code = CallFilter()
    assert code.feed("```py") == "```py"  # a code answer streams as it comes


def test_streamed_and_whole_content_agree_before_a_call() -> None:
    text = 'I will check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    held = CallFilter()
    streamed = "".join(held.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    content, calls = split_calls(held.text, frozenset({"get_time"}))
    assert streamed + content[held.sent :] == content == "I will check." and len(calls) == 1


def test_an_answer_with_calls_ends_as_openai_says() -> None:
    for choice, reason, called, expected in [
        ("auto", "eos", True, "tool_calls"),
        ("required", "stop", True, "tool_calls"),
        ("required", "length", True, "length"),  # the last call may be cut off
        ("get_time", "eos", True, "stop"),  # a named function
        ("auto", "eos", False, "eos"),
    ]:
        request = ToolRequest((TIME,), choice, frozenset({"get_time"}))
        assert request.finish_reason(reason, called) == expected, (choice, reason, called)


def test_tool_requests_are_checked() -> None:
    with pytest.raises(ApiError, match="no tool-call format"):
        parse_tools({"tools": [WEATHER]}, "{{ messages }}")
    with pytest.raises(ApiError, match="no tool-call format"):
        parse_tools({"messages": [{"role": "tool", "content": "x"}]}, "{{ messages }}")
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}, HERMES) is None
    request = parse_tools({"tools": [WEATHER]}, HERMES)
    assert request is not None and request.choice == "auto" and request.grammar() is None
    called = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    rendered = template_message(called, "")
    assert rendered["tool_calls"][0]["function"]["arguments"] == {}
    with pytest.raises(ApiError, match="JSON text"):
        template_message({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}, "")
    with pytest.raises(ApiError, match="same function name"):
        parse_tools({"tools": [WEATHER, WEATHER]}, HERMES)
    required = parse_tools({"tools": [BAD_SCHEMA], "tool_choice": "required"}, HERMES)
    with pytest.raises(ApiError, match="not a JSON schema") as bad:
        required.grammar()  # type: ignore[union-attr]
    assert bad.value.status == 400 and bad.value.param == "tools"
