"""Tool calls: OpenAI's tools and tool_choice over chat templates of each tool-call format (Hermes, Mistral's, Llama
3's JSON), parsed, streamed and constrained, with and without speculation; and the pure pieces (finding the format,
parsing, the stream's hold-back, validation)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import MODEL, TIMEOUT, Server, native_from_hf, serving, tiny_model

from quickdraft.api import Pipeline
from quickdraft.server.errors import ApiError
from quickdraft.server.messages import chat_messages, template_message
from quickdraft.server.tool_formats import HERMES, LLAMA3_JSON, MISTRAL, ToolFormat, tool_format
from quickdraft.server.tools import ToolRequest, parse_tools

CHARS = [chr(code) for code in range(32, 127)] + ["\n"]
HERMES_TEMPLATE = (
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
# a valid JSON schema no value satisfies: xgrammar cannot make a grammar of it
UNFOLLOWABLE = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}}}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def char_pipeline(template: str = HERMES_TEMPLATE, specials: tuple[str, ...] = ()) -> Pipeline:
    """Tiny native models over a tokenizer of single characters, with this chat template (Hermes' by default): a
    grammar can spell any call. ``specials``: special tokens added after the characters and ``<eos>``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {char: i for i, char in enumerate(CHARS)} | {"<eos>": len(CHARS)}
    tokenizer_model = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tokenizer_model.decoder = decoders.Fuse()
    tokenizer_model.add_special_tokens([AddedToken(text, special=True) for text in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_model, eos_token="<eos>")
    tokenizer.chat_template = template
    size = len(vocab) + len(specials)
    return Pipeline(
        target=native_from_hf(tiny_model(size, seed=3, logit_scale=4.0)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({len(CHARS)}),
        draft=native_from_hf(tiny_model(size, seed=4, logit_scale=4.0, num_layers=1)),
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


def test_a_required_call_of_parameters_it_cannot_enforce_is_refused(server: Server) -> None:
    unique = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    tool = {"type": "function", "function": {"name": "pick", "parameters": unique}}
    body = {"model": MODEL, "messages": ASK, "tools": [tool], "max_tokens": 4}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=body | {"tool_choice": "required"}, timeout=60)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "tools"
    assert "pick ask for what a constrained call cannot enforce (#/properties/ids: uniqueItems)" in error["message"]
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).status_code == 200  # auto: free


def test_a_required_answer_may_hold_several_calls_unless_parallel_calls_are_off() -> None:
    import xgrammar

    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    two = f"{one}\n{one}"
    for parallel, accepted in ((True, (one, two)), (False, (one,))):
        request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": parallel},
                              tool_format(HERMES_TEMPLATE))  # fmt: skip
        assert request is not None and request.parallel == parallel
        spec = request.grammar()
        assert spec is not None
        grammar = xgrammar.Grammar.from_ebnf(spec.text)
        for text in (one, two, f"{one}x"):
            assert xgrammar.testing._is_grammar_accept_string(grammar, text) == (text in accepted), (parallel, text)
    with pytest.raises(ApiError, match="parallel_tool_calls"):
        parse_tools({"tools": [WEATHER], "parallel_tool_calls": "yes"}, tool_format(HERMES_TEMPLATE))


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


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_required_call_cut_before_it_ends_is_no_content_whole_or_streamed(server: Server, choice: Any) -> None:
    options: dict[str, Any] = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=choice, temperature=0)
    for max_tokens in (1, 5, 12):  # inside the tag, the name, the arguments: never a whole call
        whole = server.client().chat.completions.create(**options, max_tokens=max_tokens).choices[0]
        assert (whole.message.content, whole.message.tool_calls, whole.finish_reason) == (None, None, "length")
        chunks = list(server.client().chat.completions.create(**options, max_tokens=max_tokens, stream=True))
        deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
        assert not any(delta.content or delta.tool_calls for delta in deltas), max_tokens
        assert chunks[-1].choices[0].finish_reason == "length"


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
        {"tools": [BAD_SCHEMA]},  # no JSON schema: 400 whatever tool_choice says
        {"tools": [UNFOLLOWABLE], "tool_choice": "required"},  # xgrammar cannot follow it: 400, not a 500
        {"tools": [UNFOLLOWABLE], "tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"parallel_tool_calls": "yes"},  # checked without tools too
    ]
    for extra in bad:
        with pytest.raises(openai.BadRequestError, match="tool"):
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, extra_body=extra)


LONE = "\ud800"  # valid JSON as an escape, no UTF-8 text: the tokenizer failed on it (a 500 before)
LONE_TOOL = {"name": "f", "description": LONE}
LONE_CALL = {"name": "get_weather", "arguments": json.dumps({"city": LONE})}
CALLED_WITH = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": LONE_CALL}]}, {"role": "tool", "tool_call_id": "call_1",
    "content": "sunny"}]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER | {"function": {"name": "f" + LONE}}]}, "tools"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": LONE_TOOL}]}, "tools"),
        ("/v1/chat/completions", {"messages": CALLED_WITH, "tools": [WEATHER]}, "messages"),
        ("/v1/chat/completions", {"messages": ASK, "stop": ["x" + LONE]}, "stop"),
        ("/v1/chat/completions", {"messages": ASK, "prediction": {"type": "content", "content": LONE}}, "prediction"),
        ("/tokenize", {"messages": ASK, "tools": [WEATHER | {"function": {"name": LONE}}]}, "tools"),
        ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "f" + LONE}]}, "tools"),
    ],
)
def test_text_that_is_not_utf8_anywhere_is_a_400(server: Server, path: str, body: dict[str, Any], param: str) -> None:
    raw = json.dumps({"model": MODEL} | body)  # ensure_ascii: the surrogate goes out as its escape
    response = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and "UTF-8" in error["message"], error


def splitter(names: frozenset[str], found: ToolFormat = HERMES) -> Callable[[str], tuple[str, list[Any]]]:
    return ToolRequest((), "auto", names, found).split_calls


def test_calls_are_split_from_the_answer() -> None:
    names = frozenset({"f", "g"})
    split_calls = splitter(names)
    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
    text += '<tool_call>{"name": "g"}</tool_call>'
    content, calls = split_calls(text)
    assert content == "Let me look." and [call["function"]["name"] for call in calls] == ["f", "g"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": 1} and calls[1]["function"]["arguments"] == "{}"
    texted = split_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')[1]  # OpenAI's JSON text
    assert json.loads(texted[0]["function"]["arguments"]) == {"x": 1}
    empty = split_calls('<tool_call>{"name": "f", "arguments": ""}</tool_call>')[1]  # none, as an earlier turn's ""
    assert empty[0]["function"]["arguments"] == "{}"
    for not_a_call in ('<tool_call>{"name": "h"}</tool_call>', "<tool_call>{oops</tool_call>", "<tool_call>",
                       '<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>'):  # fmt: skip
        assert split_calls(not_a_call) == (not_a_call, [])
    fenced = '```json\n{\n  "name": "f",\n  "arguments": {"city": "Paris"}\n}\n```'  # Qwen2.5-Coder's answer
    content, calls = split_calls(fenced)
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    for not_a_call in ('{"name": "f"}', 'See: ```json\n{"name": "f", "arguments": {}}\n```', '{"name": "h"}'):
        assert split_calls(not_a_call) == (not_a_call, [])


def test_a_block_runs_to_its_objects_end_and_a_tag_no_call_follows_is_text() -> None:
    split_calls = splitter(frozenset({"f"}))
    call = '<tool_call>\n{"name": "f", "arguments": {"q": "see </tool_call> or <tool_call> docs"}}\n</tool_call>'
    content, calls = split_calls("Sure.\n" + call)
    assert content == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {
        "q": "see </tool_call> or <tool_call> docs"
    }
    mention = "I will wrap it in <tool_call> tags.\n"  # prose naming the tag before the call
    content, calls = split_calls(mention + call + "\n" + call)
    assert content == mention.rstrip() and len(calls) == 2
    thought = "<think>I should write <tool_call> now</think>\n"  # a reasoning block left in the content
    assert split_calls(thought + call)[0] == thought.rstrip() and len(split_calls(thought + call)[1]) == 1
    for not_a_call in ('<tool_call>{"name": "f", "arguments": {}} x</tool_call>', '<tool_call>{"name": "f"}'):
        assert split_calls(not_a_call) == (not_a_call, []), not_a_call


def test_the_stream_holds_back_only_what_may_open_a_call() -> None:
    hermes = ToolRequest((), "auto", frozenset({"f"}), HERMES)
    held = hermes.call_filter()
    assert held.feed("Hello <to") == "Hello" and held.feed("day") == " <today"  # whitespace before a call is held
    assert held.feed(" now <tool_") == " now" and held.feed('call>{"name"') == "" and held.feed(" more") == ""
    assert held.text.endswith('<tool_call>{"name" more')
    whole = hermes.call_filter()
    assert whole.feed("```js") == "" and whole.feed('on\n{"name"') == "" and whole.sent == 0  # held to the end
    code = hermes.call_filter()
    assert code.feed("```py") == "```py"  # a code answer streams as it comes


def test_streamed_and_whole_content_agree_before_a_call() -> None:
    text = 'I will check.\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    request = ToolRequest((TIME,), "auto", frozenset({"get_time"}), HERMES)
    held = request.call_filter()
    streamed = "".join(held.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    content, calls = request.split_calls(held.text)
    assert streamed + content[held.sent :] == content == "I will check." and len(calls) == 1


def test_an_answer_with_calls_ends_as_openai_says() -> None:
    for choice, reason, called, expected in [
        ("auto", "eos", True, "tool_calls"),
        ("required", "stop", True, "tool_calls"),
        ("required", "length", True, "length"),  # the last call may be cut off
        ("get_time", "eos", True, "stop"),  # a named function
        ("auto", "eos", False, "eos"),
    ]:
        request = ToolRequest((TIME,), choice, frozenset({"get_time"}), HERMES)
        assert request.finish_reason(reason, called) == expected, (choice, reason, called)


def test_tool_requests_are_checked() -> None:
    with pytest.raises(ApiError, match="no tool-call format"):
        parse_tools({"tools": [WEATHER]}, tool_format("{{ messages }}"))
    with pytest.raises(ApiError, match="no tool-call format"):
        parse_tools({"messages": [{"role": "tool", "content": "x"}]}, tool_format("{{ messages }}"))
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}, tool_format(HERMES_TEMPLATE)) is None
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}, tool_format("{{ messages }}")) is None  # unused
    with pytest.raises(ApiError, match="tools must be a list of"):  # the type first, whatever the template
        parse_tools({"tools": "x"}, tool_format("{{ messages }}"))
    with pytest.raises(ApiError, match="tool_choice must be none, auto, required or one of the tools' functions"):
        parse_tools({"tool_choice": "bogus"}, tool_format(HERMES_TEMPLATE))
    with pytest.raises(ApiError, match="tool_choice needs tools"):
        parse_tools({"tool_choice": "required"}, tool_format(HERMES_TEMPLATE))
    request = parse_tools({"tools": [WEATHER]}, tool_format(HERMES_TEMPLATE))
    assert request is not None and request.choice == "auto" and request.grammar() is None
    called = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    rendered = template_message(called, "")
    assert rendered["tool_calls"][0]["function"]["arguments"] == {}
    thought = {"role": "assistant", "content": "", "reasoning_content": "hmm"}  # Qwen3's template renders it
    assert template_message(thought, "")["reasoning_content"] == "hmm"
    result = {"role": "tool", "tool_call_id": "c1", "content": "7"}  # Hermes' templates need its function's name
    assert template_message(result, "7", {"c1": "f"}) == result | {"name": "f"}
    assert template_message(result | {"name": "g"}, "7", {"c1": "f"})["name"] == "g"  # the client's, if it sent one
    assert "name" not in template_message(result, "7", {"c2": "f"})
    conversation = chat_messages({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}, result]})  # fmt: skip
    assert conversation[-1] == result | {"name": "get_time"}
    with pytest.raises(ApiError, match="JSON text"):
        template_message({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}, "")
    with pytest.raises(ApiError, match="same function name"):
        parse_tools({"tools": [WEATHER, WEATHER]}, tool_format(HERMES_TEMPLATE))
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    assert parse_tools({"tools": [strict]}, tool_format(HERMES_TEMPLATE)) is not None
    with pytest.raises(ApiError, match="a function's strict must be true or false"):
        parse_tools({"tools": [{**strict, "function": {**strict["function"], "strict": "yes"}}]}, None)
    for choice in ("auto", "required", "none"):
        with pytest.raises(ApiError, match=r"a tool's parameters are not a JSON schema \('f'\): 'nonsense'") as bad:
            parse_tools({"tools": [BAD_SCHEMA], "tool_choice": choice}, tool_format(HERMES_TEMPLATE))
        assert bad.value.status == 400 and bad.value.param == "tools"
    odd_schema = {"type": "function", "function": {"name": "f", "parameters": {"$schema": 5}}}
    with pytest.raises(ApiError, match=r"\$schema must be a URI"):  # jsonschema itself fails on it: a 500 before
        parse_tools({"tools": [odd_schema]}, tool_format(HERMES_TEMPLATE))
    assert parse_tools({"tools": [UNFOLLOWABLE]}, tool_format(HERMES_TEMPLATE)) is not None  # auto makes no grammar
    required = parse_tools({"tools": [UNFOLLOWABLE], "tool_choice": "required"}, tool_format(HERMES_TEMPLATE))
    with pytest.raises(ApiError, match="not a JSON schema a call can follow") as bad:
        required.grammar()  # type: ignore[union-attr]
    assert bad.value.status == 400 and bad.value.param == "tools"
    with pytest.raises(ApiError, match="parallel_tool_calls must be true or false"):
        parse_tools({"parallel_tool_calls": "yes"}, tool_format(HERMES_TEMPLATE))


# Templates of the other formats, as their families render calls and results (the format's marker included; tools by
# name only: a tokenizer of single characters reads a schema slowly)
MISTRAL_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'user' %}{% if tools %}[AVAILABLE_TOOLS]{% for t in tools %}"
    "{{ t.function.name }} {% endfor %}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}{% set f = c.function %}"
    "{{ {'name': f.name, 'arguments': f.arguments, 'id': c.id} | tojson }}"
    "{% endfor %}]{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.tool_call_id }} {{ m.content }}[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}{% endif %}{% endfor %}"
)
LLAMA3_TEMPLATE = (
    '{% if tools %}"parameters": dictionary of argument name\n{% for t in tools %}{{ t.function.name }} {% endfor %}'
    "\n{% endif %}{% for m in messages %}"
    "{% if m.tool_calls %}"
    "{% if m.tool_calls | length > 1 %}{{ raise_exception('one call a turn') }}{% endif %}"
    "{% set c = m.tool_calls[0].function %}assistant: {{ {'name': c.name, 'parameters': c.arguments} | tojson }}"
    "{% elif m.role == 'tool' %}ipython: {{ {'output': m.content} | tojson }}{% else %}{{ m.role }}: {{ m.content }}"
    "{% endif %}\n{% endfor %}assistant: "
)


def test_each_template_has_its_format() -> None:
    assert tool_format(HERMES_TEMPLATE) is HERMES and tool_format(MISTRAL_TEMPLATE) is MISTRAL
    assert tool_format(LLAMA3_TEMPLATE) is LLAMA3_JSON and tool_format("{{ messages }}") is None
    assert tool_format("<|tool_call|>{{ messages }}") is None  # Phi-4-mini's is none of them: tools are a 400
    assert tool_format("<tool_call>{{ name }}<arg_key>k</arg_key><arg_value>v</arg_value>") is None  # nor GLM-4.5's
    with pytest.raises(ApiError, match=r"Hermes <tool_call> tags, .*Mistral's \[TOOL_CALLS\], .*Llama 3's JSON"):
        parse_tools({"tools": [WEATHER]}, None)


def test_whole_answer_formats_split_their_calls() -> None:
    names = frozenset({"f", "g"})
    mistral, llama = splitter(names, MISTRAL), splitter(names, LLAMA3_JSON)
    listed = ' [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]'  # its opener was special
    for text in (listed, "[TOOL_CALLS]" + listed, f"```json\n{listed}\n```"):
        content, calls = mistral(text)
        assert content == "" and [call["function"]["name"] for call in calls] == ["f", "g"], text
        assert all(len(call["id"]) == 9 and call["id"].isalnum() for call in calls)  # as its templates check
    for text in ('{"name": "f", "parameters": {"x": 1}}', '<|python_tag|>{"name": "f", "arguments": {"x": 1}}'):
        content, calls = llama(text)
        assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"x": 1}, text
        assert calls[0]["id"].startswith("call_")
    for not_calls in ("[1, 2]", "[]", '[{"name": "f", "arguments": {}}, {"name": "h", "arguments": {}}]',
                      'It is {"name": "f", "parameters": {}}', '{"name": "f"}', "Paris is sunny.",
                      '{"name": ["f"], "arguments": {}}', '[{"name": {}, "arguments": {}}]'):  # fmt: skip
        assert mistral(not_calls) == (not_calls, []) and llama(not_calls) == (not_calls, []), not_calls


def test_a_streamed_answer_is_split_as_the_whole_answer_is() -> None:
    """In every format, over random chunkings: the content streamed before the end plus what the end sends is the
    whole answer's content, and the calls are the whole answer's."""

    call, listed = (
        '{"name": "f", "arguments": {"x": 1}}',
        '[{"name": "f", "arguments": {}}, {"name": "f", "arguments": {}}]',
    )
    answers = [call, f" {call}", f"```json\n{call}\n```", listed, f"\n{listed}", f"```json\n{listed}\n```",
               f"[TOOL_CALLS]{listed}", f"<|python_tag|>{call}", '{"name": "f", "parameters": {}}', "[1, 2]",
               f"Sure.\n<tool_call>\n{call}\n</tool_call>", "Paris is sunny.", "{oops", "[see above]",
               f"{call} and more", "<tool_", '{"name": "f", "arguments": {"x": 1e999}}']  # fmt: skip
    for found in (HERMES, MISTRAL, LLAMA3_JSON):
        assert_streamed_as_whole(ToolRequest((), "auto", frozenset({"f"}), found), answers)


def assert_streamed_as_whole(request: ToolRequest, answers: list[str], rounds: int = 20) -> None:
    """Over random chunkings of each answer: the content streamed before the end plus what the end sends is the
    whole answer's content, and the calls are the whole answer's."""
    generator = random.Random(0)
    for answer in answers:
        whole_content, whole_calls = request.split_calls(answer)
        for _ in range(rounds):
            held, streamed, start = request.call_filter(), "", 0
            while start < len(answer):
                end = start + generator.randint(1, 6)
                streamed += held.feed(answer[start:end])
                start = end
            content, calls = request.split_calls(held.text)
            assert streamed + content[held.sent :] == whole_content, (request.format.name, answer)
            assert [c["function"] for c in calls] == [c["function"] for c in whole_calls], (request.format.name, answer)


def assert_grammar_accepts(request: ToolRequest, accepted: dict[str, bool], label: Any = None) -> None:
    """The request's constraint accepts each text as ``accepted`` says, and what it accepts is read as calls."""
    import xgrammar

    grammar = xgrammar.Grammar.from_ebnf(request.grammar().text)  # type: ignore[union-attr]
    for text, expected in accepted.items():
        assert xgrammar.testing._is_grammar_accept_string(grammar, text) == expected, (label, text)
        assert not expected or request.split_calls(text)[1], f"what the grammar allows is read as calls: {text}"


def test_a_function_without_parameters_is_called_with_none() -> None:
    """OpenAI: omitting parameters defines a function with an empty parameter list (the model made some up)."""
    for parameters in ({}, {"parameters": None}):
        bare = {"type": "function", "function": {"name": "now"} | parameters}
        request = parse_tools({"tools": [bare], "tool_choice": "required"}, HERMES)
        assert request is not None
        call = '<tool_call>\n{{"name": "now", "arguments": {}}}\n</tool_call>'
        assert_grammar_accepts(request, {call.format("{}"): True, call.format('{"location": "Tokyo"}'): False})


def test_malformed_answers_and_choices_are_content_or_400s() -> None:
    request = ToolRequest((), "auto", frozenset({"f"}), MISTRAL)
    for answer in ("[" * 100_000 + "]" * 100_000, '[{"name": "f", "arguments": {"x": NaN}}]',
                   '[{"name": "f", "arguments": {"x": "\\ud800"}}]'):  # fmt: skip  # a lone surrogate: no UTF-8
        assert request.split_calls(answer) == (answer, [])
    for choice in ({"type": "function", "function": "f"}, {"function": {"name": ["f"]}}, {"function": None}):
        with pytest.raises(ApiError, match="tool_choice must be"):
            parse_tools({"tools": [TIME], "tool_choice": choice}, HERMES)
    assert splitter(frozenset({"f"}), LLAMA3_JSON)('[{"name": "f", "parameters": {}}]')[1] == []  # one call a turn


def test_whole_answer_formats_hold_back_what_may_open_their_calls() -> None:
    mistral = ToolRequest((), "auto", frozenset({"f"}), MISTRAL).call_filter()
    assert mistral.feed(" [") == "" and mistral.feed('{"name"') == "" and mistral.sent == 0
    prose = ToolRequest((), "auto", frozenset({"f"}), MISTRAL).call_filter()
    assert prose.feed("Sure") == "Sure" and prose.feed(" <tool_call>") == " <tool_call>"  # no tags in this format
    llama = ToolRequest((), "auto", frozenset({"f"}), LLAMA3_JSON).call_filter()
    assert llama.feed("<|python") == "" and llama.feed("_tag|>{") == "" and llama.sent == 0


def test_whole_answer_grammars_follow_the_format() -> None:
    import xgrammar

    one = '{"name": "get_time", "parameters": {}}'  # xgrammar's separators
    for parallel in (True, False):
        request = parse_tools({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": parallel},
                              LLAMA3_JSON)  # fmt: skip
        grammar = xgrammar.Grammar.from_ebnf(request.grammar().text)  # type: ignore[union-attr]
        for text, accepted in ((one, True), (f"[{one}]", False), (one.replace("parameters", "arguments"), False)):
            assert xgrammar.testing._is_grammar_accept_string(grammar, text) == accepted, (text, parallel)
    call = '{"name": "get_time", "arguments": {}}'
    for parallel in (True, False):
        request = parse_tools({"tools": [TIME], "tool_choice": "required", "parallel_tool_calls": parallel}, MISTRAL)
        grammar = xgrammar.Grammar.from_ebnf(request.grammar().text)  # type: ignore[union-attr]
        for text, accepted in ((f"[{call}]", True), (f"[{call}, {call}]", parallel), ("[]", False), (call, False)):
            assert xgrammar.testing._is_grammar_accept_string(grammar, text) == accepted, (text, parallel)


@pytest.fixture(scope="module", params=[MISTRAL_TEMPLATE, LLAMA3_TEMPLATE], ids=["mistral", "llama3"])
def format_server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with serving(char_pipeline(request.param)) as running:
        yield running


def test_each_format_calls_and_goes_on_after_the_result(format_server: Server) -> None:
    """A required call through the server, the same with and without speculation, streamed as deltas, and the
    conversation it starts rendered again by the template (calls with their ids, the tool's result). One call: a
    random model lists calls until the budget cuts the list, and a cut list is no JSON."""
    assert_a_required_call_goes_round(format_server)


def assert_a_required_call_goes_round(server: Server, max_tokens: int = 80) -> Any:
    """One required call (a random model lists calls until the budget cuts the list) through ``server``: the same
    with and without speculation, streamed as deltas, and the conversation it starts rendered again by the
    template (its call and id, the tool's result). The call, as the client reads it."""
    client = server.client()

    def call(drafter: str, stream: bool = False) -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=max_tokens,
            temperature=0, extra_body={"drafter": drafter}, stream=stream, parallel_tool_calls=False,
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
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == ""
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [first[0].model_dump()]},
                {"role": "tool", "tool_call_id": first[0].id, "content": "sunny"}]  # fmt: skip
    again = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=8)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    return first[0]


def test_a_conversation_ending_in_a_call_is_counted_but_not_answered(server: Server) -> None:
    """/tokenize counts a conversation whose last call has no result yet (a client counts before it runs the tool);
    a chat request with it is a 400, as OpenAI's."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    counted = httpx.post(f"{server.url}/tokenize", json={"messages": messages, "tools": [WEATHER]}, timeout=TIMEOUT)
    assert counted.status_code == 200 and counted.json()["count"] > 0
    body = {"model": MODEL, "messages": messages, "tools": [WEATHER], "max_tokens": 2}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert refused.status_code == 400
    assert "'c1' has no tool message with its result" in refused.json()["error"]["message"]


def test_a_tool_message_must_answer_a_call_an_earlier_assistant_message_made() -> None:
    """A tool message after no call, naming a call no assistant message made, or naming none where the calls have
    ids, is refused, and so is a call no tool message answers (as OpenAI refuses them)."""
    calls = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}  # fmt: skip
    both = [{"role": "tool", "tool_call_id": f"c{i}", "content": str(i)} for i in (2, 1)]
    assert len(chat_messages({"messages": [*ASK, calls, *both]})) == 4  # in any order, one after another
    text = {"role": "assistant", "content": "w1"}  # a Responses conversation may put text between call and output
    assert len(chat_messages({"messages": [*ASK, calls, text, *both, {"role": "user", "content": "w2"}, both[0]]}))
    for bad, words in (
        ([*ASK, {"role": "tool", "tool_call_id": "zz", "content": "x"}], "must answer a call"),
        ([*ASK, {"role": "tool", "content": "x"}], "must answer a call"),
        ([*ASK, calls, {"role": "tool", "tool_call_id": "zz", "content": "x"}], "'zz' answers no call"),
        ([*ASK, calls, {"role": "tool", "content": "x"}], "needs the tool_call_id of the call it answers"),
        ([*ASK, calls, {"role": "tool", "tool_call_id": 1, "content": "x"}], "needs the tool_call_id"),
        ([*ASK, calls, both[1], {"role": "user", "content": "w2"}], "the tool call 'c2' has no tool message"),
    ):
        with pytest.raises(ApiError, match=words) as error:
            chat_messages({"messages": bad})
        assert error.value.param == "messages"
