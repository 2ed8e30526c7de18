"""``/v1/responses``: OpenAI's Responses API, driven by the official client and by an openai-agents agent, answers
what the chat endpoint answers for the same conversation; what it cannot do is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from test_tools import WEATHER, char_pipeline

from quickdraft.server.responses_api import chat_request

ASK = "What is the weather in Paris?"
TOOL = {"type": "function", "name": "get_weather", "description": "the weather in a city"} | {
    "parameters": WEATHER["function"]["parameters"]
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(native_chat_pipeline()) as running:
        yield running


@pytest.fixture(scope="module")
def tool_server() -> Iterator[Server]:
    with serving(char_pipeline()) as running:
        yield running


UNANSWERED = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}  # no output follows


def chat_text(server: Server, messages: list[dict[str, Any]], **options: Any) -> tuple[str, Any]:
    answer = server.client().chat.completions.create(model=MODEL, messages=messages, temperature=0, **options)
    return answer.choices[0].message.content, answer


@pytest.mark.parametrize("drafter", ["none", "draft-model"])
def test_an_answer_whole_and_streamed_is_the_chat_answer(server: Server, drafter: str) -> None:
    client, extra = server.client(), {"drafter": drafter}
    expected, chat = chat_text(server, [{"role": "user", "content": "w1 w2 w3"}], max_tokens=8)
    whole = client.responses.create(model=MODEL, input="w1 w2 w3", max_output_tokens=8, temperature=0, extra_body=extra)
    assert whole.output_text == expected and whole.id.startswith("resp_") and whole.model == MODEL
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"  # cut at 8
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat.usage.prompt_tokens, 8)
    assert whole.store is False and whole.output[0].role == "assistant"
    events = list(client.responses.create(model=MODEL, input="w1 w2 w3", max_output_tokens=8, temperature=0,
                                          stream=True, extra_body=extra))  # fmt: skip
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]  # fmt: skip
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == expected
    assert events[-1].response.output_text == expected and events[-1].response.usage.output_tokens == 8


def test_an_answer_that_ends_is_completed_and_instructions_are_a_system_message(server: Server) -> None:
    messages = [{"role": "system", "content": "w4"}, {"role": "user", "content": "w1 w2"}]
    expected, chat = chat_text(server, messages, max_tokens=12, stop=["w2"])
    parts = [{"role": "user", "content": [{"type": "input_text", "text": "w1 w2"}]}]
    whole = server.client().responses.create(model=MODEL, instructions="w4", input=parts, max_output_tokens=12,
                                             temperature=0, extra_body={"stop": ["w2"]}, user="u7",
                                             safety_identifier="s1", service_tier="flex")  # fmt: skip
    assert whole.output_text == expected and whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert whole.instructions == "w4"
    assert (whole.user, whole.safety_identifier) == ("u7", "s1")  # repeated as sent
    assert whole.service_tier == "default"  # the tier it ran at, as OpenAI answers: this server has one


def test_log_probabilities_and_seeded_samples_are_the_chat_ones(server: Server) -> None:
    messages = [{"role": "user", "content": "w1 w2 w3"}]
    _, chat = chat_text(server, messages, max_tokens=6, logprobs=True, top_logprobs=2)
    whole = server.client().responses.create(model=MODEL, input="w1 w2 w3", max_output_tokens=6, temperature=0,
                                             include=["message.output_text.logprobs"], top_logprobs=2)  # fmt: skip
    got = [(entry.token, entry.logprob, [top.token for top in entry.top_logprobs])
           for entry in whole.output[0].content[0].logprobs]  # fmt: skip
    expected = [(entry.token, entry.logprob, [top.token for top in entry.top_logprobs])
                for entry in chat.choices[0].logprobs.content]  # fmt: skip
    assert got == expected
    events = list(server.client().responses.create(model=MODEL, input="w1 w2 w3", max_output_tokens=6, temperature=0,
                                                   include=["message.output_text.logprobs"], stream=True))  # fmt: skip
    streamed = [
        entry.token for event in events if event.type == "response.output_text.delta" for entry in event.logprobs
    ]
    assert streamed == [token for token, _, _ in expected]
    seeded = {"seed": 7, "drafter": "draft-model", "min_p": 0.05, "repetition_penalty": 1.2}  # chat's extras too
    text, _ = chat_text(server, messages, max_tokens=10, extra_body=seeded | {"temperature": 0.9})
    sampled = server.client().responses.create(model=MODEL, input="w1 w2 w3", max_output_tokens=10, temperature=0.9,
                                               extra_body=seeded)  # fmt: skip
    assert sampled.output_text == text


def test_a_required_call_is_a_function_call_item_whole_and_streamed(tool_server: Server) -> None:
    client = tool_server.client()
    options: dict[str, Any] = dict(model=MODEL, input=ASK, tools=[TOOL], tool_choice="required", temperature=0,
                                   max_output_tokens=120, parallel_tool_calls=False)  # fmt: skip
    whole = client.responses.create(**options)
    call = whole.output[-1]
    assert whole.status == "completed" and [item.type for item in whole.output] == ["function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    events = list(client.responses.create(**options, stream=True))
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [(item.name, item.arguments) for item in done] == [(call.name, call.arguments)]
    assert [event.arguments for event in events if event.type == "response.function_call_arguments.done"] == [
        call.arguments
    ]
    assert events[-1].type == "response.completed" and events[-1].response.output[0].arguments == call.arguments
    turn = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]  # fmt: skip
    chat_turn = [{"role": "user", "content": ASK},
                 {"role": "assistant", "content": "", "tool_calls": [
                     {"id": call.call_id, "type": "function",
                      "function": {"name": call.name, "arguments": call.arguments}}]},
                 {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]  # fmt: skip
    after = client.responses.create(model=MODEL, input=turn, tools=[TOOL], max_output_tokens=10, temperature=0)
    text, chat = chat_text(tool_server, chat_turn, tools=[WEATHER], max_tokens=10)
    assert after.usage.input_tokens == chat.usage.prompt_tokens and after.output_text == (text or "")


def test_a_required_call_cut_before_it_ends_is_no_message(tool_server: Server) -> None:
    options: dict[str, Any] = dict(model=MODEL, input=ASK, tools=[TOOL], tool_choice="required", temperature=0,
                                   max_output_tokens=6)  # fmt: skip
    whole = tool_server.client().responses.create(**options)
    assert (whole.status, whole.output, whole.output_text) == ("incomplete", [], "")
    events = list(tool_server.client().responses.create(**options, stream=True))
    assert not [event for event in events if event.type.startswith(("response.output", "response.content"))]
    assert events[-1].type == "response.incomplete" and events[-1].response.output == []


def test_an_agent_runs_its_tool_over_the_responses_api(tool_server: Server) -> None:
    """openai-agents' default model speaks the Responses API, whole and streamed."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny"

    settings = agents.ModelSettings(tool_choice="required", max_tokens=120, temperature=0, parallel_tool_calls=False)

    async def run() -> tuple[Any, Any]:
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=tool_server.async_client())
        agent = agents.Agent(name="weather", instructions="Answer.", model=model, tools=[get_weather],
                             model_settings=settings, tool_use_behavior="stop_on_first_tool")  # fmt: skip
        whole = await agents.Runner.run(agent, ASK, max_turns=2)
        streamed = agents.Runner.run_streamed(agent, ASK, max_turns=2)
        async for _ in streamed.stream_events():
            pass
        return whole, streamed

    whole, streamed = asyncio.run(run())
    assert whole.final_output == streamed.final_output == "sunny" and len(cities) == 2 and cities[0] == cities[1]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"store": True}, "store", "keeps no responses"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "send the whole conversation"),
        ({"background": True}, "background", "answers while the client waits"),
        ({"reasoning": {"effort": "low"}}, "reasoning", "not supported"),
        ({"truncation": "auto"}, "truncation", "does not cut a conversation"),
        ({"truncation": "bogus"}, "truncation", "truncation must be auto or disabled, got 'bogus'"),
        ({"store": "false"}, "store", "store must be true or false"),
        ({"background": "no"}, "background", "background must be true or false"),
        ({"prompt_cache_retention": 5}, "prompt_cache_retention", "must be in_memory or 24h"),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": 5},
                ]
            },
            "input",
            "a function_call_output's output must be text",
        ),
        ({"max_tool_calls": 2}, "max_tool_calls", "does not count"),
        ({"instructions": 5}, "instructions", "instructions must be text"),
        ({"input": [{"content": "w1"}]}, "input", "role is user, system, developer, assistant, got None"),
        ({"input": [{"role": "tool", "content": "w1"}]}, "input", "a tool's result is a function_call_output item"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input", "call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, "input", "no function_call"),
        (
            {"input": [{"role": "user", "content": "w1"}, UNANSWERED, {"role": "user", "content": "w2"}]},
            "input",
            "no function_call_output item for the function_call with call_id 'c1'",
        ),
        ({"tools": [{"type": "function", "parameters": {}}]}, "tools", "needs a name"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "text.format.schema must be"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format", "text.format.name must be"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "bogus": 1}}},
            "text.format",
            "text.format takes name, schema, strict and description, not bogus",
        ),
        ({"metadata": "x"}, "metadata", "an object"),
        ({"max_output_tokenz": 3}, "max_output_tokenz", "unrecognized request argument"),
        ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be a whole number"),
        ({"input": []}, "input", "non-empty list"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input", "'input_image'"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input", "'input_file'"),
        ({"tools": [{"type": "web_search"}]}, "tools", "function tools only"),
        ({"tools": [{"type": "function", "name": "f", "paramters": {}}]}, "tools[0].paramters", "unknown parameter"),
        ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools[0].defer_loading", "search"),
        (
            {"tools": [{"type": "function", "name": "f", "allowed_callers": ["programmatic"]}]},
            "tools[0].allowed_callers",
            "directly",
        ),
        ({"tools": [{"type": "function", "name": "f", "output_schema": "x"}]}, "tools[0].output_schema", "schema"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "x"}]}, "tools", '{"type": "function", "name", "'),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]},
            "input",
            "input holds no message",
        ),
        ({"input": [{"role": "user", "content": "w1", "bogus": 1}]}, "input[0].bogus", "unknown parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "w1", "txet": "w2"}]}]},
            "input[0].content[0].txet",
            "unknown parameter",
        ),
        ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options.include_usage", "completed"),
        ({"include": ["reasoning.encrypted_content"]}, "include", "message.output_text.logprobs"),
        ({"text": {"format": {"type": "xml"}}}, "text.format", "json_schema"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "integer", "not": {}}}}},
            "text.format",
            "cannot enforce (#: not)",
        ),
        ({"tool_choice": {"type": "mcp"}}, "tool_choice", "tool_choice must be"),
        (  # refused by the engine, after the request was read (this model has no end-of-sequence tokens)
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
            "text.format",
            "structured output needs end-of-sequence tokens",
        ),
    ],
)
def test_what_it_cannot_do_is_refused(server: Server, fields: dict[str, Any], param: str, words: str) -> None:
    answer = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": "w1"} | fields, timeout=TIMEOUT)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == param and words in error["message"], error


def test_a_function_tools_keys_that_ask_for_nothing_here_pass() -> None:
    """What openai-agents sends for a function tool: an output_schema (for which templates have no place), and
    defer_loading false or allowed_callers with direct, which ask for nothing more than a plain tool."""
    from quickdraft.server.responses_api import chat_request

    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "defer_loading": False,
            "allowed_callers": ["direct"], "output_schema": {"type": "object"}}  # fmt: skip
    chat, _ = chat_request({"model": MODEL, "input": "w1", "tools": [tool]})
    assert chat["tools"] == [
        {"type": "function", "function": {"strict": True, "name": "f", "parameters": {"type": "object"}}}
    ]


def test_every_key_the_sdks_input_items_have_is_read() -> None:
    """An unknown key in an input item is a 400, so each key the openai SDK's item and part types have is known."""
    from openai.types.responses import (
        easy_input_message_param,
        response_function_tool_call_param,
        response_input_item_param,
        response_input_text_param,
        response_output_message_param,
        response_output_text_param,
        response_reasoning_item_param,
    )

    from quickdraft.server.responses_api import ITEM_KEYS, PART_KEYS

    def keys(kind: type) -> set[str]:
        return {key for cls in kind.__mro__ for key in getattr(cls, "__annotations__", {})}

    for known, kinds in (
        (ITEM_KEYS["message"], (easy_input_message_param.EasyInputMessageParam, response_input_item_param.Message,
                                response_output_message_param.ResponseOutputMessageParam)),
        (ITEM_KEYS["function_call"], (response_function_tool_call_param.ResponseFunctionToolCallParam,)),
        (ITEM_KEYS["function_call_output"], (response_input_item_param.FunctionCallOutput,)),
        (ITEM_KEYS["reasoning"], (response_reasoning_item_param.ResponseReasoningItemParam,)),
        (PART_KEYS["input_text"], (response_input_text_param.ResponseInputTextParam,)),
        (PART_KEYS["output_text"], (response_output_text_param.ResponseOutputTextParam,)),
    ):  # fmt: skip
        for kind in kinds:
            assert keys(kind) <= set(known), (kind.__name__, keys(kind) - set(known))


def test_a_json_schema_format_is_the_chat_response_format(tool_server: Server) -> None:
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    whole = tool_server.client().responses.create(model=MODEL, input=ASK, text=text, max_output_tokens=120,
                                                  temperature=0)  # fmt: skip
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    expected, _ = chat_text(tool_server, [{"role": "user", "content": ASK}], max_tokens=120,
                            response_format=response_format)  # fmt: skip
    assert whole.output_text == expected and whole.text.format.type == "json_schema"
    if whole.status == "completed":
        assert json.loads(whole.output_text)["city"] in ("Paris", "Oslo")


def strictly(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` checked against the openai client's model of a Response: every required field, of its type."""
    Response.model_validate(body)
    return body


def raw_events(server: Server, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed answer's events as sent, each checked against the client's model of its type."""
    with httpx.stream("POST", f"{server.url}/v1/responses", json=body | {"stream": True}, timeout=TIMEOUT) as answer:
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: ")]
    adapter = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    return events


def test_log_probabilities_are_those_of_the_message_text_whole_and_streamed(tool_server: Server) -> None:
    """With calls after it, a message's log-probabilities cover its text, not the calls; streamed, the same
    output as whole, every event and object of OpenAI's shape."""
    body = {"model": MODEL, "input": ASK, "tools": [TOOL], "tool_choice": "required", "max_output_tokens": 120,
            "temperature": 0, "parallel_tool_calls": False, "include": ["message.output_text.logprobs"]}  # fmt: skip
    for fields in ({}, {"tool_choice": "auto", "max_output_tokens": 40}, {"tools": None, "tool_choice": None}):
        asked = {key: value for key, value in (body | fields).items() if value is not None}
        whole = strictly(httpx.post(f"{tool_server.url}/v1/responses", json=asked, timeout=TIMEOUT).json())
        events = raw_events(tool_server, asked)
        final = strictly(events[-1]["response"])
        assert [item["type"] for item in final["output"]] == [item["type"] for item in whole["output"]], fields
        for item in (item for item in whole["output"] if item["type"] == "message"):
            part = item["content"][0]
            assert "".join(entry["token"] for entry in part["logprobs"]) == part["text"]
        streamed = [entry for event in events if event["type"] == "response.output_text.delta"
                    for entry in event["logprobs"]]  # fmt: skip
        message = [item for item in final["output"] if item["type"] == "message"]
        assert streamed == (message[0]["content"][0]["logprobs"] if message else [])


def test_what_the_openai_client_sends_is_read(server: Server) -> None:
    """A message item the client dumps has type null; top_logprobs alone asks for log-probabilities; null fields
    ask for nothing; prompt_cache_retention changes nothing here."""
    from openai.types.responses import EasyInputMessage

    item = EasyInputMessage(role="user", content="w1 w2 w3").model_dump()
    assert item["type"] is None
    body = {"model": MODEL, "input": [item], "max_output_tokens": 4, "temperature": 0, "top_logprobs": 2,
            "context_management": None, "prompt_cache_retention": "24h", "reasoning": {"effort": None}}  # fmt: skip
    answer = strictly(httpx.post(f"{server.url}/v1/responses", json=body, timeout=TIMEOUT).json())
    entries = answer["output"][0]["content"][0]["logprobs"]
    assert len(entries) == 4 and all(len(entry["top_logprobs"]) == 2 for entry in entries)


def test_a_request_past_its_time_ends_with_response_failed() -> None:
    from quickdraft.server.access import Access

    with serving(native_chat_pipeline(), access=Access(request_timeout_s=0.001)) as running:
        body = {"model": MODEL, "input": "w1 w2", "max_output_tokens": 200}
        whole = httpx.post(f"{running.url}/v1/responses", json=body, timeout=TIMEOUT)
        assert whole.status_code == 504 and whole.json()["error"]["code"] == "timeout"
        events = raw_events(running, body)
        failed = strictly(events[-1]["response"])
        assert events[-1]["type"] == "response.failed" and failed["error"]["code"] == "server_error"
        assert all(item["status"] == "incomplete" for item in failed["output"])


def test_a_function_tool_is_strict_unless_it_says_not_as_openai_has_it() -> None:
    """The Responses API's function tools default to strict (chat's to not strict); the Response shows it."""
    for given, strict in (({}, True), ({"strict": None}, True), ({"strict": False}, False), ({"strict": True}, True)):
        chat, echo = chat_request({"model": MODEL, "input": "w1", "tools": [TOOL | given]})
        assert chat["tools"][0]["function"]["strict"] is strict and echo.tools == [TOOL | {"strict": strict}]


def test_a_calls_output_may_come_after_text_reasoning_or_a_later_turn() -> None:
    """Orders the openai-agents SDK writes (a streamed turn's calls before its text) are read, not refused."""
    from quickdraft.server.messages import chat_messages
    from quickdraft.server.responses_api import chat_request

    user = {"role": "user", "content": "w1"}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "w2"}
    text = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "w3"}]}
    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "w4"}]}
    for items in ([user, call, text, output], [user, thought, call, thought, output], [call, user, output]):
        body, _ = chat_request({"model": MODEL, "input": items})
        assert chat_messages(body)[-1]["role"] == "tool", items


def test_a_kept_response_is_asked_for_in_vain_and_told_why(server: Server) -> None:
    """Retrieving, deleting or cancelling a response, or listing its input items: this server keeps none."""
    for method, path in (
        ("GET", "resp_1"),
        ("DELETE", "resp_1"),
        ("POST", "resp_1/cancel"),
        ("GET", "resp_1/input_items"),
    ):
        answer = httpx.request(method, f"{server.url}/v1/responses/{path}", timeout=TIMEOUT)
        error = answer.json()["error"]
        assert answer.status_code == 404 and error["message"].startswith("no response 'resp_1': this server keeps no")
    for endpoint in ("input_tokens", "compact"):  # the SDK's counting and compacting: endpoints, not responses
        answer = httpx.post(f"{server.url}/v1/responses/{endpoint}", json={"model": MODEL, "input": "hi"})
        error = answer.json()["error"]
        assert answer.status_code == 404 and error["message"].startswith(
            f"this server has no endpoint /v1/responses/{endpoint}"
        )


def test_two_function_calls_of_one_call_id_are_refused() -> None:
    from quickdraft.server.errors import ApiError
    from quickdraft.server.responses_api import chat_request

    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    with pytest.raises(ApiError, match="two function_call items have the call_id 'c1'"):
        chat_request({"model": MODEL, "input": [{"role": "user", "content": "w1"}, call, call]})
