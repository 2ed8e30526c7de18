"""The OpenAI-compatible server on loopback with tiny native models, driven by the official openai client."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import itertools
import json
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from conftest import MODEL, TIMEOUT, Server, answer_text, native_chat_pipeline, serving

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.grammar import GrammarKind, GrammarSpec
from quickdraft.server import protocol


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_chat_pipeline()


@pytest.fixture(scope="module")
def server(native: Pipeline) -> Iterator[Server]:
    with serving(native) as running:
        yield running


def test_a_capped_context_is_what_the_server_holds_and_says() -> None:
    """A target loaded with a cap (``--max-context``, here 100 positions) is served as a model of that context: its
    ``max_model_len``, and a prompt and answer past it refused as ``context_length_exceeded``."""
    from conftest import native_from_hf, noisy_copy, tiny_model, word_tokenizer

    target, draft = (native_from_hf(model, capacity=100) for model in (tiny_model(48, 0), noisy_copy(48)))
    capped = Pipeline(target=target, tokenizer=word_tokenizer(48), eos_token_ids=frozenset(), draft=draft)
    with serving(capped) as running:
        assert httpx.get(f"{running.url}/v1/models/{MODEL}", timeout=TIMEOUT).json()["max_model_len"] == 100
        body = {"model": MODEL, "prompt": "w1 w2 w3 w4", "temperature": 0}
        fits = httpx.post(f"{running.url}/v1/completions", json=body | {"max_tokens": 96}, timeout=TIMEOUT)
        assert fits.status_code == 200 and fits.json()["usage"]["total_tokens"] == 100
        past = httpx.post(f"{running.url}/v1/completions", json=body | {"max_tokens": 97}, timeout=TIMEOUT)
        assert past.status_code == 400 and past.json()["error"]["code"] == "context_length_exceeded"


def greedy(native: Pipeline, prompt_ids: list[int], max_tokens: int) -> list[int]:
    return native.generate(prompt_ids, GenerationConfig(max_new_tokens=max_tokens), drafter="none").token_ids


def text_of(native: Pipeline, token_ids: list[int], prompt_ids: list[int] | None = None) -> str:
    """``token_ids``' text; after ``prompt_ids``, the text they add to it (an answer's)."""
    return answer_text(native.tokenizer, prompt_ids or [], token_ids)


def test_models_health_and_metrics(server: Server) -> None:
    assert [model.id for model in server.client().models.list()] == [MODEL]
    card = httpx.get(f"{server.url}/v1/models/{MODEL}", timeout=TIMEOUT).json()
    assert card["max_model_len"] == server.engine.target.max_context  # vLLM's field: what a prompt and answer hold
    assert httpx.get(f"{server.url}/health", timeout=TIMEOUT).json() == {"status": "ok"}
    head = httpx.head(f"{server.url}/health", timeout=TIMEOUT)
    assert head.status_code == 200 and head.content == b""  # a load balancer's check that reads no body
    for path in ("/v1/models", f"/v1/models/{MODEL}", "/metrics"):  # every GET answers HEAD, as HTTP has it
        got, head = (httpx.request(method, f"{server.url}{path}", timeout=TIMEOUT) for method in ("GET", "HEAD"))
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == got.headers["content-type"], path
    server.client().completions.create(model=MODEL, prompt="w1 w2", max_tokens=3, temperature=0)
    metrics = httpx.get(f"{server.url}/metrics", timeout=TIMEOUT).text
    for name in (
        "quickdraft_requests_running",
        "quickdraft_requests_waiting",
        "quickdraft_time_to_first_token_seconds_bucket",
        "quickdraft_time_per_output_token_seconds_bucket",
        "quickdraft_e2e_request_latency_seconds_bucket",
        "quickdraft_generation_tokens_total",
        "quickdraft_draft_tokens_proposed_total",
        "quickdraft_draft_tokens_accepted_total",
        "quickdraft_gamma_chosen_bucket",
        "quickdraft_batch_size_bucket",
    ):
        assert name in metrics, name
    assert 'quickdraft_requests_total{finish_reason="length"}' in metrics


def test_a_list_of_prompts_is_a_choice_each_as_openai_answers_it(server: Server, native: Pipeline) -> None:
    """Prompts in a list (texts or token ids) each get their n choices, choice j of prompt i at index i·n + j, each
    the answer its prompt gets alone; the usage adds them up, whole or streamed. One prompt refused refuses the
    list."""
    prompts = ["w5 w9 w5 w9", "w1 w2 w3"]
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    for given in (prompts, [native.encode(prompt) for prompt in prompts]):
        answer = httpx.post(f"{server.url}/v1/completions", json=body | {"prompt": given, "n": 2}, timeout=TIMEOUT)
        assert answer.status_code == 200, answer.text
        choices, usage = answer.json()["choices"], answer.json()["usage"]
        assert [choice["index"] for choice in choices] == [0, 1, 2, 3]
        expected = [greedy(native, native.encode(prompt), 4) for prompt in prompts]
        assert [choice["token_ids"] for choice in choices] == [expected[0], expected[0], expected[1], expected[1]]
        prompt_tokens = sum(len(native.encode(prompt)) for prompt in prompts)
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt_tokens, 16)
        assert usage["total_tokens"] == prompt_tokens + 16
    stream = server.client().completions.create(  # streamed: one stream of their chunks, each with its index
        model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2, echo=True, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
    )  # fmt: skip
    chunks = list(stream)
    texts, token_ids = ["", "", "", ""], [[], [], [], []]
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        token_ids[choice.index] += getattr(choice, "token_ids", None) or []
    assert token_ids == [expected[0], expected[0], expected[1], expected[1]]
    whole = httpx.post(
        f"{server.url}/v1/completions", json=body | {"prompt": prompts, "n": 2, "echo": True}, timeout=TIMEOUT
    )
    assert texts == [choice["text"] for choice in whole.json()["choices"]]  # the echoed prompts, then the answers
    assert len({chunk.id for chunk in chunks}) == 1 and not chunks[-1].choices
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (prompt_tokens, 16)
    for extra, param, words in (
        ({"prompt": ["w1", ""]}, "prompt", "prompt[1]: "),
        ({"prompt": ["w1", ""], "stream": True}, "prompt", "prompt[1]: "),
        ({"prompt": ["w1"] * 20, "n": 16}, "prompt", "20 prompts × n 16 = 320"),
    ):
        answer = httpx.post(f"{server.url}/v1/completions", json=body | {"prompt": prompts} | extra, timeout=TIMEOUT)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, (extra, answer.text)
        assert words in answer.json()["error"]["message"], (extra, answer.text)
    deadline = time.monotonic() + TIMEOUT
    while not server.engine.idle and time.monotonic() < deadline:  # the refused list's first prompt is gone too
        time.sleep(0.01)
    assert server.engine.idle


def test_a_streamed_list_of_prompts_is_one_answer_of_one_time(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its chunks share one id and one ``created``, though its prompts are read one after the other (each read took
    its own second: each prompt's chunks carried its own)."""
    clock = itertools.count(1_800_000_000)
    monkeypatch.setattr(protocol, "time", types.SimpleNamespace(time=lambda: next(clock)))
    stream = server.client().completions.create(
        model=MODEL, prompt=["w1", "w2", "w3"], max_tokens=2, temperature=0, stream=True
    )
    chunks = list(stream)
    assert sorted({choice.index for chunk in chunks for choice in chunk.choices}) == [0, 1, 2]
    assert len({chunk.created for chunk in chunks}) == 1 and len({chunk.id for chunk in chunks}) == 1


def test_completions_whole_and_streamed_are_single_request_greedy(server: Server, native: Pipeline) -> None:
    client, prompt = server.client(), "w5 w9 w5 w9 w5 w9"
    expected = greedy(native, native.encode(prompt), 10)
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    choice = whole.choices[0]
    assert choice.token_ids == expected and choice.finish_reason == "length"  # type: ignore[attr-defined]
    assert choice.text == text_of(native, expected, native.encode(prompt))
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (6, 10)  # type: ignore[union-attr]
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"drafter": "prompt-lookup", "policy": "fixed:3"},
        )
    )
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == choice.text
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10  # type: ignore[union-attr]
    token_prompt = client.completions.create(model=MODEL, prompt=native.encode(prompt), max_tokens=10, temperature=0)
    assert token_prompt.choices[0].text == choice.text


def test_chat_completions_whole_and_streamed(server: Server, native: Pipeline) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "w3 w1 w4 w1 w5"}]
    prompt_ids = native.encode_chat(messages)
    expected = text_of(native, greedy(native, prompt_ids, 8), prompt_ids)
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_completion_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == expected
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert set(chunks[-1].model_extra["speculation"]) == {"drafts_proposed", "drafts_accepted"}  # as a whole one's


def test_a_predicted_output_is_drafted_from_and_counted_in_the_usage(server: Server, native: Pipeline) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "w3 w1 w4 w1 w5"}]
    expected = greedy(native, native.encode_chat(messages), 12)
    edited = text_of(native, [*expected[:4], 3, 3, *expected[6:]])  # the answer the user expects, two tokens off
    whole = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        prediction={"type": "content", "content": edited},
        extra_body={"policy": "fixed:4"},  # a fixed γ always takes the copies (goodput may not, on a busy machine)
    )
    assert whole.choices[0].message.content == text_of(native, expected, native.encode_chat(messages))
    details = whole.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and details.accepted_prediction_tokens > 0
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(native.encode(edited))
    assert details.rejected_prediction_tokens <= 2  # OpenAI's: the prediction's tokens not in the answer
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="w3 w1 w4 w1 w5",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"prediction": {"type": "content", "content": [{"type": "text", "text": edited}]}},
        )
    )
    assert chunks[-1].usage.completion_tokens_details is not None  # type: ignore[union-attr]
    plain = client.completions.create(model=MODEL, prompt="w3 w1 w4 w1 w5", max_tokens=12, temperature=0)
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == plain.choices[0].text
    assert plain.usage.completion_tokens_details is None  # type: ignore[union-attr]


def test_logprobs_whole_and_streamed_with_and_without_speculation(server: Server, native: Pipeline) -> None:
    client = server.client()
    messages = [{"role": "user", "content": "w3 w1 w4 w1 w5"}]
    expected = greedy(native, native.encode_chat(messages), 8)
    answers = {}
    for drafter in ("none", "draft-model"):
        whole = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
            extra_body={"drafter": drafter, "policy": "fixed:3"} if drafter != "none" else {"drafter": "none"},
        )
        content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
        assert [entry.token for entry in content] == [f" {text_of(native, [token])}" for token in expected]  # words
        assert all(len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token for entry in content)
        answers[drafter] = [(entry.token, entry.logprob) for entry in content]
    assert answers["none"] == answers["draft-model"]  # speculation changes no log-probability
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
            logprobs=True,
            stream=True,
        )
    )
    streamed = [
        (e.token, e.logprob)
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]  # type: ignore[union-attr]
    assert streamed == answers["none"]
    completion = client.completions.create(
        model=MODEL, prompt="w3 w1 w4 w1 w5", max_tokens=6, temperature=0, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens) == len(logprobs.token_logprobs) == 6  # type: ignore[arg-type]
    assert all(len(top) == 2 for top in logprobs.top_logprobs) and logprobs.text_offset[0] == 0  # type: ignore[union-attr]
    assert client.completions.create(model=MODEL, prompt="w1", max_tokens=2).choices[0].logprobs is None
    sampled = (
        client.completions.create(
            model=MODEL, prompt="w3 w1 w4 w1 w5", max_tokens=16, temperature=1.5, seed=3, logprobs=1
        )
        .choices[0]
        .logprobs
    )
    assert sampled is not None and sampled.top_logprobs is not None and sampled.token_logprobs is not None
    for token, value, top in zip(sampled.tokens, sampled.token_logprobs, sampled.top_logprobs, strict=True):
        assert top[token] == value and len(top) in (1, 2)  # OpenAI's: the likeliest, and the sampled token
    assert any(len(top) == 2 for top in sampled.top_logprobs)  # a sampled token that was not the likeliest


def test_a_chats_later_turns_reuse_the_cached_conversation(native: Pipeline) -> None:
    messages = [{"role": "user", "content": "w3 w1 w4 w1 w5 w9 w2 w6 w5 w3 w5 w8 w9 w7 w9 w3 w2 w3 w8 w4"}]
    with serving(native, prefix_cache_mb=64) as cached:
        client = cached.client()
        for turn in range(3):
            answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)  # type: ignore[arg-type]
            details = answer.usage.prompt_tokens_details  # type: ignore[union-attr]
            assert (details.cached_tokens > 16) == (turn > 0), turn  # type: ignore[union-attr]
            expected = greedy(native, native.encode_chat(messages), 6)
            assert answer.choices[0].message.content == text_of(native, expected, native.encode_chat(messages))
            messages += [{"role": "assistant", "content": answer.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": f"w{turn + 1} w2"}]
        again = client.chat.completions.create(
            model=MODEL, messages=messages[:1], max_tokens=6, temperature=0, extra_body={"cache_prompt": False}
        )  # type: ignore[arg-type]
        assert again.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]  # llama.cpp's opt-out
        metrics = httpx.get(f"{cached.url}/metrics", timeout=TIMEOUT).text
    assert "quickdraft_prefix_cache_hits 2.0" in metrics and "quickdraft_prefix_cache_cached_tokens" in metrics


def test_structured_output_is_constrained_plain_decoding(native: Pipeline) -> None:
    with_end = dataclasses.replace(native, eos_token_ids=frozenset({47}))
    grammar = GrammarSpec(GrammarKind.REGEX, "w5w9(w1|w2){2,6}")
    expected = with_end.generate(with_end.encode("w3 w1 w4"), GenerationConfig(12, grammar=grammar), "none")
    with serving(with_end) as constrained:
        for drafter in ("none", "draft-model", "prompt-lookup"):
            answer = constrained.client().completions.create(
                model=MODEL,
                prompt="w3 w1 w4",
                max_tokens=12,
                temperature=0,
                extra_body={"regex": "w5w9(w1|w2){2,6}", "drafter": drafter, "return_token_ids": True},
            )
            assert answer.choices[0].token_ids == expected.token_ids, drafter  # type: ignore[attr-defined]
        bad = {"model": MODEL, "prompt": "w1", "regex": "(w1", "max_tokens": 3}
        response = httpx.post(f"{constrained.url}/v1/completions", json=bad, timeout=TIMEOUT)
        assert response.status_code == 400 and "does not compile" in response.json()["error"]["message"]
        assert response.json()["error"]["param"] == "regex"  # the field to mend
        dead_end = {"prompt": "w1", "regex": "w1zzz", "max_tokens": 6}  # w1 begins it; no word spells zzz
        response = httpx.post(f"{constrained.url}/v1/completions", json=dead_end, timeout=TIMEOUT)
        error = response.json()["error"]  # the request's own fault: a 400, not the server's 500
        assert response.status_code == 400 and error["type"] == "invalid_request_error"
        assert "allows no token" in error["message"]
        url, body = f"{constrained.url}/v1/completions", {**dead_end, "stream": True}
        with httpx.stream("POST", url, json=body, timeout=TIMEOUT) as streamed:
            events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "allows no token" in json.loads(events[-2])["error"]["message"]
        metrics = httpx.get(f"{constrained.url}/metrics", timeout=TIMEOUT).text
        assert 'quickdraft_requests_total{finish_reason="error"} 2.0' in metrics  # failures are counted too


def test_concurrent_streams_each_get_their_own_greedy_output(server: Server, native: Pipeline) -> None:
    prompts = [f"w{i} w{i + 1} w{i} w{i + 1} w{2 * i}" for i in range(1, 9)]
    drafters = [
        {"drafter": "draft-model", "policy": "fixed:3"},
        {"drafter": "prompt-lookup"},
        {"drafter": "suffix"},
        {"drafter": "none"},
    ]

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=6 + i, temperature=0, stream=True, extra_body=drafters[i % 3]
        )
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def all_at_once() -> list[str]:
        async with server.async_client() as client:
            return await asyncio.gather(*(one(client, i) for i in range(len(prompts))))

    texts = asyncio.run(all_at_once())
    for i, text in enumerate(texts):
        assert text == text_of(native, greedy(native, native.encode(prompts[i]), 6 + i), native.encode(prompts[i])), i


def test_openai_ranges_a_negative_seed_and_top_p_zero(server: Server) -> None:
    """OpenAI's seed is a signed 64-bit integer: -1 is taken as 2**64 - 1. Its top_p may be 0: the likeliest token
    alone, so the answer is the greedy one. vLLM's top_k -1 is off, as 0 is."""

    def text(**fields: Any) -> str:
        return server.client().completions.create(model=MODEL, prompt="w3 w1", max_tokens=8, **fields).choices[0].text

    assert text(temperature=1.0, seed=-1) == text(temperature=1.0, seed=2**64 - 1)
    assert text(temperature=1.0, top_p=0, seed=5) == text(temperature=0)
    assert text(temperature=1.0, seed=5, extra_body={"top_k": -1}) == text(temperature=1.0, seed=5)  # vLLM's off


BAD_REQUESTS = [  # (path, body, status, words in the message)
    ("completions", {"model": "gpt-4", "prompt": "w1"}, 404, "does not exist"),
    ("completions", {"model": MODEL, "prompt": "   "}, 400, "empty"),
    ("completions", {"model": MODEL, "prompt": "w1 " * 250, "max_tokens": 10}, 400, "context holds 256"),
    ("completions", {"model": MODEL, "prompt": "w1", "temperature": -1}, 400, "temperature"),
    ("completions", {"model": MODEL, "prompt": "w1", "temperature": "hot"}, 400, "temperature"),
    ("completions", {"model": MODEL, "prompt": "w1", "top_p": 1.5}, 400, "top_p"),
    ("completions", {"model": MODEL, "prompt": "w1", "max_tokens": 0}, 400, "max_tokens must be"),
    ("completions", {"model": MODEL, "prompt": "w1", "max_tokens": "many"}, 400, "max_tokens must be"),
    ("completions", {"model": MODEL, "prompt": "w1", "seed": -(2**63) - 1}, 400, "seed"),
    ("completions", {"model": MODEL, "prompt": "w1", "stop": [""]}, 400, "stop"),
    ("completions", {"model": MODEL, "prompt": "w1", "cache_prompt": "no"}, 400, "cache_prompt must be true or false"),
    ("completions", {"model": MODEL, "prompt": "w1", "n": 17}, 400, "n must be a whole number in [1, 16]"),
    ("completions", {"model": MODEL, "prompt": "w1", "n": True}, 400, "n must be a whole number"),
    ("completions", {"model": MODEL, "prompt": "w1", "max_draft_tokens": 17}, 400, "max_draft_tokens is at most 16"),
    ("completions", {"model": MODEL, "prompt": "w1", "n": 1.0}, 400, "n must be a whole number"),
    ("completions", {"model": MODEL, "prompt": [1, "w1"]}, 400, "a non-empty string or a list of token ids, or a"),
    ("completions", {"model": MODEL, "prompt": ["w1", [1, 2]]}, 400, "a non-empty string or a list of token ids, or"),
    ("completions", {"model": MODEL, "prompt": [[1], [2, 999]]}, 400, "prompt[1]: token ids"),  # each checked
    ("completions", {"model": MODEL, "prompt": [999]}, 400, "token ids"),
    ("completions", {"model": MODEL}, 400, "prompt"),
    ("completions", {"model": MODEL, "prompt": "w1", "drafter": "magic"}, 400, "unknown drafter"),
    ("completions", {"model": MODEL, "prompt": "w1", "policy": "specdec++"}, 400, "acceptance head"),
    ("completions", {"model": MODEL, "prompt": "w1", "policy": "fixed:x"}, 400, "fixed:K"),
    ("completions", {"model": MODEL, "prompt": "w1", "top_k": -2}, 400, "top_k"),
    ("completions", {"model": MODEL, "prompt": "w1", "seed": 1.5}, 400, "[-2**63, 2**64 - 1]"),
    *(
        (path, body, 400, "the request body must be a JSON object")
        for path in ("completions", "chat/completions", "responses", "tokenize")
        for body in ([1, 2], None, "w1", 3)
    ),
    ("chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": " "}]}, 400, "empty"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 3}]}, 400, "text"),
    ("completions", {"model": MODEL, "prompt": "w1", "prediction": "w2"}, 400, "prediction must be"),
    ("completions", {"model": MODEL, "prompt": "w1", "prediction": {"type": "content", "content": 3}}, 400, "text"),
    (
        "completions",
        {"model": MODEL, "prompt": "w1", "prediction": {"type": "content", "content": "w2"}, "drafter": "none"},
        400,
        "drafter that copies",
    ),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "logprobs": 3}, 400, "true"),
    (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "top_logprobs": 2},
        400,
        "needs",
    ),
    ("completions", {"model": MODEL, "prompt": "w1", "logprobs": 21}, 400, "logprobs"),
    ("completions", {"model": MODEL, "prompt": "w1", "response_format": {"type": "xml"}}, 400, "response_format"),
    ("completions", {"model": MODEL, "prompt": "w1", "response_format": {"type": "json_schema"}}, 400, "schema"),
    *(
        ("completions", {"model": MODEL, "prompt": "w1", "response_format": response_format}, 400, words)
        for response_format, words in (
            ({"type": "json_schema", "json_schema": {"schema": {}}}, "json_schema.name must be 1 to 64 letters"),
            ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}, "got 'a b'"),
            ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}}, "strict must be"),
            ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "bogus": 1}}, "not bogus"),
            ({"type": "json_object", "json_schema": {"name": "x", "schema": {}}}, "json_object takes no json_schema"),
        )
    ),
    ("completions", {"model": MODEL, "prompt": "w1", "regex": "w1", "grammar": "root ::= 'w1'"}, 400, "one of"),
    ("completions", {"model": MODEL, "prompt": "w1", "regex": "w1+"}, 400, "end-of-sequence"),
    ("nowhere", {}, 404, "no endpoint /v1/nowhere"),
    ("completions/", {"model": MODEL, "prompt": "w1"}, 404, "no endpoint /v1/completions/"),  # no redirect to the path
    ("chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "w1"}]}, 400, "role 'wizard'"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w1"}, {"role": "tool", "content": "w2", "tool_call_id": "1"}]},
        400,
        "no tool-call format",
    ),
    (
        "chat/completions",
        {
            "messages": [{"role": "user", "content": "w1"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required",
        },
        400,
        "no tool-call format",
    ),
    ("completions", {"prompt": "w1", "suffix": "w2"}, 400, "no fill-in-the-middle tokens"),
    ("completions", {"prompt": "w1", "logit_bias": {"5": 500}}, 400, "logit_bias's values must be numbers"),
    ("completions", {"prompt": "w1", "echo": "yes"}, 400, "echo must be true or false"),
    ("completions", {"prompt": "w1", "best_of": 3}, 400, "best_of is not supported"),
]


@pytest.mark.parametrize(("path", "body", "status", "words"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors_and_the_server_goes_on(
    server: Server, path: str, body: object, status: int, words: str
) -> None:
    sent = {"content": json.dumps(body), "headers": {"content-type": "application/json"}}  # null too
    response = httpx.post(f"{server.url}/v1/{path}" if path != "tokenize" else f"{server.url}/tokenize", **sent,
                          timeout=TIMEOUT)  # fmt: skip
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error["message"] and set(error) == {"message", "type", "param", "code"}
    again = server.client().completions.create(model=MODEL, prompt="w1", max_tokens=2, temperature=0)
    assert again.choices[0].text  # greedy: sampled at OpenAI's default temperature, two tokens can both be <eos>


FIELDS_AT_FAULT = [  # (path, body, the error's param)
    ("completions", {"prompt": "   "}, "prompt"),
    ("chat/completions", {"messages": [{"role": "user", "content": " "}]}, "messages"),
    ("completions", {"prompt": "w1", "temperature": -1}, "temperature"),
    ("completions", {"prompt": "w1", "top_p": -0.5}, "top_p"),
    ("completions", {"prompt": "w1", "top_k": -2}, "top_k"),
    ("completions", {"prompt": "w1", "seed": 2**64}, "seed"),
    ("completions", {"prompt": "w1", "stop": [""]}, "stop"),
    ("completions", {"prompt": "w1", "policy": "fixed:x"}, "policy"),
    ("completions", {"prompt": "w1", "drafter": "magic"}, "drafter"),
    ("completions", {"prompt": "w1", "num_draft_tokens": 5000}, "num_draft_tokens"),
    ("completions", {"prompt": "w1", "max_draft_tokens": 0}, "max_draft_tokens"),
    ("completions", {"prompt": "w1", "regex": ""}, "regex"),
    ("completions", {"prompt": "w1", "grammar": ""}, "grammar"),
    ("completions", {"prompt": "w1", "regex": "w1+"}, "regex"),  # a model without end tokens: no constraint ends
    (
        "chat/completions",
        {
            "messages": [{"role": "user", "content": "w1"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                },
            },
        },
        "response_format",
    ),
    (
        "completions",
        {"prompt": "w1", "prediction": {"type": "content", "content": "w2"}, "drafter": "none"},
        "prediction",
    ),
]


def test_errors_of_library_settings_name_the_field_at_fault(server: Server) -> None:
    for path, body, param in FIELDS_AT_FAULT:
        response = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=TIMEOUT)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.json())


def test_malformed_json_and_the_openai_clients_exceptions(server: Server) -> None:
    response = httpx.post(f"{server.url}/v1/completions", content=b"{not json", timeout=TIMEOUT)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert "(line 1, column 2)" in response.json()["error"]["message"]
    huge = b'{"prompt": "w1", "seed": ' + b"9" * 5000 + b"}"  # valid JSON past Python's bound on an integer's digits
    response = httpx.post(f"{server.url}/v1/completions", content=huge, timeout=TIMEOUT)
    assert response.status_code == 400 and "integer of more than 4300 digits" in response.json()["error"]["message"]
    response = httpx.post(f"{server.url}/v1/completions", content=b'{"prompt": "w1 \xff"}', timeout=TIMEOUT)
    assert response.json()["error"]["message"] == "the request body is not UTF-8 text: byte 0xff at offset 15"
    body = json.dumps({"model": MODEL, "prompt": "w1", "max_tokens": 1})  # a web page may post a form cross-site
    for media_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        response = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": media_type})
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    for media_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        response = httpx.post(f"{server.url}/v1/completions", content=body, headers={"content-type": media_type})
        assert response.status_code == 200
    for encoded, status in ((body.encode("utf-16"), 400), (body.encode("utf-8-sig"), 200)):  # json reads UTF-16 too
        assert httpx.post(f"{server.url}/v1/completions", content=encoded, timeout=TIMEOUT).status_code == status
    response = httpx.post(f"{server.url}/v1/completions", content=gzip.compress(body.encode()),
                          headers={"content-encoding": "gzip"}, timeout=TIMEOUT)  # fmt: skip
    assert response.status_code == 415 and "Content-Encoding gzip" in response.json()["error"]["message"]
    response = httpx.post(f"{server.url}/v1/embeddings", json={"model": MODEL, "input": "w1"}, timeout=TIMEOUT)
    assert response.status_code == 404 and "no endpoint /v1/embeddings; it serves" in response.text
    client = server.client()
    with pytest.raises(openai.NotFoundError) as not_found:
        client.completions.create(model="gpt-4", prompt="w1")
    assert not_found.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ""}])


def test_a_full_queue_answers_429(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(native, max_running=1, max_waiting=2) as running:
        gate = threading.Event()
        step = running.engine.step
        monkeypatch.setattr(running.engine, "step", lambda: gate.wait(TIMEOUT) and step())  # no step until opened

        async def burst() -> list[object]:
            async with running.async_client() as client:
                calls = [client.completions.create(model=MODEL, prompt="w1 w2", max_tokens=4) for _ in range(4)]
                first_three = [asyncio.ensure_future(call) for call in calls[:3]]  # the free slot's and two queued
                while running.engine.scheduler.num_waiting < 3:
                    await asyncio.sleep(0.01)
                with pytest.raises(openai.RateLimitError, match="queue is full"):
                    await calls[3]
                with pytest.raises(openai.BadRequestError, match="n is at most 3"):  # could never fit
                    await client.completions.create(model=MODEL, prompt="w1 w2", max_tokens=4, n=4)
                gate.set()
                return await asyncio.gather(*first_three)

        assert len(asyncio.run(burst())) == 3
        choices = running.client().completions.create(model=MODEL, prompt="w1 w2", max_tokens=4, n=3).choices
        assert len(choices) == 3  # an idle server's free slot and queue take all three at once


def test_a_client_that_disconnects_frees_its_slot(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(native, max_running=1) as running:
        forward_batch = native.target.forward_batch
        monkeypatch.setattr(native.target, "forward_batch", lambda rows: time.sleep(0.02) or forward_batch(rows))
        body = {"model": MODEL, "prompt": "w1 w2", "max_tokens": 200, "stream": True}
        with httpx.stream("POST", f"{running.url}/v1/completions", json=body, timeout=TIMEOUT) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # decoding has begun
        deadline = time.monotonic() + TIMEOUT
        while running.engine.scheduler.running:  # cancelled at the next step after the disconnect
            assert time.monotonic() < deadline, "the request kept its slot"
            time.sleep(0.02)
        whole = {**body, "stream": False, "max_tokens": 250}  # 250 steps of 20 ms or more if it ran to its end
        with pytest.raises(httpx.ReadTimeout):  # a client that gives up while its whole answer is decoding
            httpx.post(f"{running.url}/v1/completions", json=whole, timeout=0.5)
        left, deadline = time.monotonic(), time.monotonic() + TIMEOUT
        while running.engine.scheduler.running:
            assert time.monotonic() < deadline, "the request kept its slot"
            time.sleep(0.02)
        assert time.monotonic() - left < 2.0  # noticed within the server's 0.5 s checks, though tokens kept coming
        metrics = httpx.get(f"{running.url}/metrics", timeout=TIMEOUT).text
        assert 'quickdraft_requests_total{finish_reason="cancelled"} 2.0' in metrics
        after = running.client().completions.create(model=MODEL, prompt="w1 w2", max_tokens=3)
        assert after.usage is not None and after.usage.completion_tokens == 3


def test_the_served_model_is_named_after_its_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF file (given as a path or downloaded with hf:) is served under its file name, not its cache key."""
    from types import SimpleNamespace

    from conftest import write_tiny_gguf

    from quickdraft.models.loading import resolve_model
    from quickdraft.server.setup import model_names

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    directory = resolve_model(write_tiny_gguf(tmp_path / "Tiny-Model-Q8_0.gguf"), progress=False)
    assert model_names(SimpleNamespace(target_path=directory), None) == ("Tiny-Model-Q8_0",)  # type: ignore[arg-type]
    assert model_names(SimpleNamespace(target_path=directory), "mine") == ("mine", "Tiny-Model-Q8_0")  # type: ignore[arg-type]
