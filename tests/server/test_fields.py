"""Which request fields the server reads, accepts, refuses or does not know (server/fields.py), and the answers a
client gets for each: nothing a client asks for is silently dropped."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, LogitAdjustments, SamplingParams
from quickdraft.server.errors import ApiError
from quickdraft.server.fields import CHAT_FIELDS, HARMLESS, UNSUPPORTED, check_fields, count, flag, text_parts
from quickdraft.server.messages import chat_messages

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "w1", "max_tokens": 2}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Server, Pipeline]]:
    """A server on loopback and the pipeline it serves (whose methods a test may break for a while)."""
    pipeline = native_chat_pipeline()
    with serving(pipeline) as running:
        yield running, pipeline


def test_known_harmless_unsupported_and_unknown_fields() -> None:
    check_fields({name: None for name in CHAT_FIELDS | HARMLESS}, chat=True)
    check_fields({"tools": [], "tool_choice": "none", "parallel_tool_calls": False}, chat=False)  # change nothing
    check_fields({"user": "u1", "metadata": {"a": "b"}, "repetition_penalty": 1.0, "min_p": 0, "x": None}, chat=True)
    check_fields({"service_tier": "flex", "metadata": {f"k{i:062}": "v" * 512 for i in range(16)}}, chat=True)
    for name, harmless in UNSUPPORTED.items():
        check_fields({name: harmless[-1]}, chat=False)
    refused = [
        ({"best_of": 3}, True, "best_of is not supported"),
        ({"echo": 0}, True, "it goes to /v1/completions"),  # 0 is not false
        ({"max_tokenz": 2}, True, "unrecognized request argument: max_tokenz"),
        ({"max_completion_tokens": 2}, False, "takes max_tokens"),
        ({"top_logprobs": 2}, False, "takes logprobs"),
        ({"tools": [{"type": "function"}]}, False, "need /v1/chat/completions"),
        ({"prompt": "w1"}, True, "takes messages"),
        ({"user": 5}, True, "user must be a string, got 5"),  # harmless fields hold OpenAI's types
        ({"metadata": {"a": 1}}, False, "metadata must be an object of strings"),
        ({"store": "yes"}, True, "store must be true or false"),
        ({"safety_identifier": ["x"]}, True, "safety_identifier must be a string"),
        ({"service_tier": "fastest"}, True, "service_tier must be one of auto, default, flex, scale, priority"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, True, "metadata holds at most 16 keys, got 17"),
        ({"metadata": {"k" * 65: "v"}}, False, "at most 64 characters a key, 512 a value"),
        ({"metadata": {"k": "v" * 513}}, True, "at most 64 characters a key, 512 a value: the entry 'k' is longer"),
    ]
    for body, chat, words in refused:
        with pytest.raises(ApiError, match=words) as error:
            check_fields(body, chat)
        assert error.value.status == 400 and error.value.param == next(iter(body)), body


def test_flags_counts_and_text_parts_take_only_their_own_types() -> None:
    assert flag({}, "stream", False) is False and flag({"stream": True}, "stream", False) is True
    for value in ("false", "no", 0, 1, [], {}):
        with pytest.raises(ApiError, match="must be true or false"):
            flag({"stream": value}, "stream", False)
    with pytest.raises(ApiError, match=r"stream_options\.include_usage") as nested:
        flag({"include_usage": "false"}, "include_usage", False, "stream_options.")
    assert nested.value.param == "stream_options"
    assert count({"n": 3}, "n", 1) == 3 and count({}, "n", 1) is None and count({"n": 20}, "n", 0, 20) == 20
    for value in (0, 21, True, 2.0, "2"):
        with pytest.raises(ApiError, match="whole number"):
            count({"n": value}, "n", 1, 20)
    assert text_parts([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "m", "messages") == "ab"
    assert chat_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 2}]}) == [
        {"role": "user", "content": "a\na"}
    ]  # a message's parts are lines, as vLLM joins them: "Hello." and "How" are not "Hello.How"
    named = [{"role": "user", "content": "a", "name": "ann"}, {"role": "assistant", "content": None, "refusal": "no"}]
    assert chat_messages({"messages": named}) == [
        {"role": "user", "content": "a", "name": "ann"},  # the template may render the participant's name
        {"role": "assistant", "content": "no"},  # what the model said was its refusal
    ]
    parts = [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"}]
    assert chat_messages({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": parts}]})[
        1
    ] == {"role": "assistant", "content": "a\nno"}
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    for parts, words in (([image], "type 'image_url'"), (["a"], "must be objects"), ([{"text": "a"}], "objects")):
        with pytest.raises(ApiError, match=words):
            text_parts(parts, "a user message", "messages")


REFUSED: list[tuple[str, dict, str, str]] = [  # (path, body, words in the message, param)
    ("chat/completions", CHAT | {"stream": "false"}, "stream must be true or false", "stream"),
    ("chat/completions", CHAT | {"return_token_ids": "no"}, "return_token_ids must be", "return_token_ids"),
    (
        "chat/completions",
        CHAT | {"stream": True, "stream_options": {"include_usage": "false"}},
        "include_usage must be",
        "stream_options",
    ),
    ("chat/completions", CHAT | {"stream_options": {"include_usage": True}}, "needs stream", "stream_options"),
    ("chat/completions", CHAT | {"max_completion_tokens": 3}, "differ", "max_completion_tokens"),
    ("chat/completions", CHAT | {"max_tokens": True}, "max_tokens must be a whole number", "max_tokens"),
    ("chat/completions", CHAT | {"logprobs": True, "top_logprobs": 21}, "in [0, 20]", "top_logprobs"),
    ("chat/completions", CHAT | {"model": 5}, "model must be", "model"),
    (
        "chat/completions",
        CHAT | {"min_tokens": 3},
        "min_tokens must be an integer in [0, 2]: at most the answer's token limit",
        "min_tokens",
    ),
    ("chat/completions", CHAT | {"ignore_eos": 1}, "ignore_eos must be true or false", "ignore_eos"),
    ("chat/completions", CHAT | {"stop_token_ids": 5}, "stop_token_ids must be a list", "stop_token_ids"),
    (
        "chat/completions",
        CHAT | {"stop_token_ids": [-5]},
        "stop_token_ids must be a list of token ids",
        "stop_token_ids",
    ),
    ("completions", COMPLETION | {"stop_token_ids": [100000]}, "below the vocabulary's size", "stop_token_ids"),
    (
        "chat/completions",
        CHAT | {"ignore_eos": True, "response_format": {"type": "json_object"}},
        "ignore_eos cannot go with one",
        "ignore_eos",
    ),
    ("chat/completions", CHAT | {"repetition_penalty": 0}, "repetition_penalty must be", "repetition_penalty"),
    ("chat/completions", CHAT | {"presence_penalty": 2.5}, "presence_penalty must be a number in", "presence_penalty"),
    ("chat/completions", CHAT | {"frequency_penalty": "1"}, "frequency_penalty must be a finite", "frequency_penalty"),
    ("chat/completions", CHAT | {"min_p": 1.5}, "min_p must be in [0, 1]", "min_p"),
    ("chat/completions", CHAT | {"logit_bias": {"w1": 5}}, "keys must be token ids", "logit_bias"),
    ("chat/completions", CHAT | {"logit_bias": {"-3": 5}}, "keys must be token ids", "logit_bias"),
    ("chat/completions", CHAT | {"logit_bias": {"3": 101}}, "values must be numbers in [-100, 100]", "logit_bias"),
    ("chat/completions", CHAT | {"logit_bias": [3, 5]}, "logit_bias must be an object", "logit_bias"),
    ("chat/completions", CHAT | {"logit_bias": {"3": 1, "03": -1}}, "names a token twice", "logit_bias"),
    ("completions", COMPLETION | {"logit_bias": {"100000": 1}}, "below the vocabulary's size", "logit_bias"),
    ("completions", COMPLETION | {"logit_bias": {"9" * 4301: 1}}, "names no token", "logit_bias"),
    ("chat/completions", CHAT | {"prompt_cache_retention": 5}, "must be in_memory or 24h", "prompt_cache_retention"),
    ("chat/completions", CHAT | {"prompt_cache_options": {"ttl": "1h"}}, "30m or 12h", "prompt_cache_options.ttl"),
    (
        "chat/completions",
        CHAT | {"prompt_cache_options": {"prewarm": True}},
        "without answering",
        "prompt_cache_options.prewarm",
    ),
    (
        "chat/completions",
        CHAT | {"prompt_cache_options": {"prewarm": "yes"}},
        "true or false",
        "prompt_cache_options.prewarm",
    ),
    (
        "chat/completions",
        CHAT | {"prompt_cache_options": {"tll": "12h"}},
        "unknown parameter",
        "prompt_cache_options.tll",
    ),
    (
        "chat/completions",
        CHAT | {"stream": True, "stream_options": {"include_obfuscation": "yes"}},
        "include_obfuscation must be true or false",
        "stream_options",
    ),
    (
        "chat/completions",
        CHAT
        | {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2", "prefix": True}]},
        "unknown parameter: 'messages[1].prefix'",
        "messages[1].prefix",
    ),
    (
        "chat/completions",
        CHAT | {"messages": [{"role": "user", "content": "w1", "name": 5}]},
        "name",
        "messages[0].name",
    ),
    (
        "chat/completions",
        CHAT | {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "audio": {"id": "a1"}}]},
        "audio is not supported",
        "messages[1].audio",
    ),
    (
        "chat/completions",
        CHAT
        | {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2", "refusal": "no"}]},
        "in place of content",
        "messages[1].refusal",
    ),
    (
        "chat/completions",
        CHAT | {"messages": [{"role": "user", "content": "w1", "tool_call_id": "c1"}]},
        "unknown parameter",
        "messages[0].tool_call_id",
    ),
    ("chat/completions", CHAT | {"max_tokenz": 2}, "unrecognized request argument", "max_tokenz"),
    (
        "chat/completions",
        CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "w1"}, {"type": "input_audio"}]}]},
        "type 'input_audio'",
        "messages",
    ),
    ("chat/completions", CHAT | {"messages": [{"role": "user", "content": ["w1"]}]}, "must be objects", "messages"),
    (
        "completions",
        COMPLETION | {"prediction": {"type": "content", "content": [{"type": "image_url"}]}},
        "type 'image_url'",
        "prediction",
    ),
    ("completions", COMPLETION | {"max_completion_tokens": 2}, "takes max_tokens", "max_completion_tokens"),
    ("completions", COMPLETION | {"top_logprobs": 3}, "takes logprobs", "top_logprobs"),
    ("completions", COMPLETION | {"prompt": "w1 " * 300}, "context holds 256", "prompt"),
    ("completions", COMPLETION | {"policy": "goodput", "num_draft_tokens": 3}, "not used by", "num_draft_tokens"),
    ("completions", COMPLETION | {"policy": "fixed:2", "num_draft_tokens": 3}, "once", "num_draft_tokens"),
]


@pytest.mark.parametrize(("path", "body", "words", "param"), REFUSED)
def test_what_would_be_dropped_or_misread_is_a_400(
    served: tuple[Server, Pipeline], path: str, body: dict, words: str, param: str
) -> None:
    server, _ = served
    response = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["param"] == param, error


def test_harmless_fields_pass_and_the_default_length_fits_the_context(served: tuple[Server, Pipeline]) -> None:
    server, native = served
    body = CHAT | {"user": "u1", "metadata": {"k": "v"}, "repetition_penalty": 1, "max_completion_tokens": 2}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT).status_code == 200
    nulls = CHAT | {"n": None, "seed": None, "stop": None, "temperature": None}  # null: the default, as OpenAI's
    assert httpx.post(f"{server.url}/v1/chat/completions", json=nulls, timeout=TIMEOUT).status_code == 200
    kept = CHAT | {"prompt_cache_retention": "24h", "stream": True, "stream_options": {"include_obfuscation": False}}
    kept |= {"prompt_cache_options": {"mode": "explicit", "ttl": "12h", "prewarm": False}}  # openai-agents' settings
    assert httpx.post(f"{server.url}/v1/chat/completions", json=kept, timeout=TIMEOUT).status_code == 200
    echoed = {
        "role": "assistant",
        "content": "w3",
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "tool_calls": None,
        "parsed": {"w": 3},  # as the openai client echoes parse()'s answer
    }  # an answer's message as the openai client dumps it
    asked = {"role": "user", "content": "w2", "tool_calls": None}  # another role's key, null: it asks for nothing
    nulls = CHAT | {"messages": [{"role": "user", "content": "w1"}, echoed, asked]}
    assert httpx.post(f"{server.url}/v1/chat/completions", json=nulls, timeout=TIMEOUT).status_code == 200
    prompt = "w1 " * 249  # the server's default is 12 new tokens; the context of 256 leaves fewer
    room = 256 - len(native.encode(prompt))
    assert 0 < room < 12
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "return_token_ids": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= room


def test_a_model_is_retrieved_by_name(served: tuple[Server, Pipeline]) -> None:
    server, _ = served
    assert server.client().models.retrieve(MODEL).id == MODEL
    response = httpx.get(f"{server.url}/v1/models/gpt-4", timeout=TIMEOUT)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_every_served_name_is_listed_and_answered_under() -> None:
    with serving(native_chat_pipeline(), names=("mine", MODEL)) as server:
        client = server.client()
        assert [model.id for model in client.models.list().data] == ["mine", MODEL]
        assert client.models.retrieve(MODEL).id == MODEL and client.models.retrieve(MODEL).created > 0
        for name in ("mine", MODEL):
            assert client.completions.create(model=name, prompt="w1", max_tokens=2).model == name
        assert client.completions.create(prompt="w1", max_tokens=2, model=None).model == "mine"  # type: ignore[arg-type]


def test_answers_and_chunks_have_openais_shape(served: tuple[Server, Pipeline]) -> None:
    server, _ = served
    body = COMPLETION | {"max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=TIMEOUT) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert len({chunk["created"] for chunk in chunks}) == 1 and all("system_fingerprint" in c for c in chunks)
    assert [chunk["usage"] is None for chunk in chunks] == [True] * (len(chunks) - 1) + [False]
    unknown = body | {"stream_options": {"include_usage": True, "include_everything": True}}
    response = httpx.post(f"{server.url}/v1/completions", json=unknown, timeout=TIMEOUT)
    assert response.status_code == 400 and response.json()["error"]["param"] == "stream_options.include_everything"
    wrong_method = httpx.get(f"{server.url}/v1/completions", timeout=TIMEOUT)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"


def test_a_failure_of_the_server_is_a_json_500_and_the_connection_goes_on(
    served: tuple[Server, Pipeline], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, native = served

    def broken(*_: object, **__: object) -> list[int]:
        raise RuntimeError("a bug")

    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as client:  # one kept-alive connection
        monkeypatch.setattr(native, "encode", broken)
        failed = client.post("/v1/completions", json=COMPLETION)
        assert failed.status_code == 500
        assert failed.json()["error"] == {
            "message": "the server failed on this request: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        monkeypatch.undo()
        assert client.post("/v1/completions", json=COMPLETION).status_code == 200


def test_the_servers_largest_gamma_is_a_requests_default_and_limit() -> None:
    from quickdraft.drafters.none import NoDrafter
    from quickdraft.server.protocol import ServerDefaults, parse_request

    defaults = ServerDefaults(("m",), max_draft_tokens=4)

    def parse(body: dict[str, object]):  # -> ApiRequest
        return parse_request(body, False, defaults, lambda *_, **__: [1, 2], lambda _: NoDrafter())

    assert parse({"prompt": "w1"}).serve.config.max_draft_tokens == 4
    with pytest.raises(ApiError, match="max_draft_tokens is at most 4"):
        parse({"prompt": "w1", "max_draft_tokens": 5})


ENDINGS = {"min_tokens": 3, "ignore_eos": True, "stop_token_ids": [9, 12]}  # vLLM's, through extra_body


def test_logit_bias_and_penalties_answer_as_the_library_does(served: tuple[Server, Pipeline]) -> None:
    """OpenAI's fields through the openai client (its keys are token ids as text), vLLM's through extra_body: the
    answer is the library's for the same adjustments."""
    server, pipeline = served
    prompt_ids = pipeline.encode("w1 w2 w3", chat=False)
    client = server.client()
    forced = client.completions.create(
        model=MODEL, prompt="w1 w2 w3", max_tokens=4, logit_bias={"7": 100}, extra_body={"return_token_ids": True}
    )
    assert forced.choices[0].model_extra["token_ids"] == [7] * 4
    answer = client.completions.create(
        model=MODEL,
        prompt="w1 w2 w3",
        max_tokens=8,
        temperature=0.8,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=1.0,
        logit_bias={"4": -2.5},
        extra_body={"min_p": 0.05, "repetition_penalty": 1.3, "return_token_ids": True} | ENDINGS,
    )
    adjustments = LogitAdjustments({4: -2.5}, 0.5, 1.0, repetition_penalty=1.3)
    sampling = SamplingParams(temperature=0.8, seed=3, min_p=0.05)
    config = GenerationConfig(max_new_tokens=8, sampling=sampling, adjustments=adjustments, **ENDINGS)
    expected = pipeline.generate(prompt_ids, config, drafter="none")
    assert answer.choices[0].model_extra["token_ids"] == expected.token_ids
    assert answer.choices[0].model_extra["stop_reason"] == expected.stop_reason  # vLLM's: a stop token id, or None


def test_the_stop_reason_names_the_stop_string_or_token_that_ended_the_answer(served: tuple[Server, Pipeline]) -> None:
    """vLLM's ``stop_reason``, whole and in the streamed choice's last chunk: the stop string or stop token id that
    ended the answer, null for any other end."""
    server, pipeline = served
    prompt_ids = pipeline.encode("w1 w2 w3", chat=False)
    free = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=6), drafter="none")
    word, token = free.text.split()[2], free.token_ids[3]
    client = server.client()
    for fields, expected in (
        ({"stop": [word]}, word),
        ({"extra_body": {"stop_token_ids": [token]}}, token),
        ({}, None),
    ):
        ask = {"model": MODEL, "prompt": "w1 w2 w3", "max_tokens": 6, "temperature": 0} | fields
        assert client.completions.create(**ask).choices[0].model_extra["stop_reason"] == expected, fields
        chunks = [chunk.choices[0] for chunk in client.completions.create(**ask, stream=True) if chunk.choices]
        assert chunks[-1].model_extra["stop_reason"] == expected and chunks[-1].finish_reason in ("stop", "length")


def test_min_tokens_raises_the_default_token_limit(served: tuple[Server, Pipeline]) -> None:
    """Without max_tokens a request gets the server's default (12 here), raised to its min_tokens where that fits."""
    server, _ = served
    body = {"model": MODEL, "prompt": "w1 w2", "min_tokens": 20, "ignore_eos": True}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 20
    too_many = httpx.post(f"{server.url}/v1/completions", json=body | {"min_tokens": 300}, timeout=TIMEOUT)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "min_tokens"
