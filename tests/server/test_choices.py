"""``n`` choices: each is a request of its own, seeded choice i with the seed + i, whole and streamed alike."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving

ASK = [{"role": "user", "content": "w1 w2 w3"}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(native_chat_pipeline()) as running:
        yield running


def chat(server: Server, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 10, "temperature": 0.9} | fields
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_seeded_choices_are_the_answers_of_their_seeds(server: Server) -> None:
    many = chat(server, n=3, seed=11, drafter="draft-model")
    texts = [choice["message"]["content"] for choice in many["choices"]]
    assert [choice["index"] for choice in many["choices"]] == [0, 1, 2]
    assert texts == [chat(server, seed=11 + i, drafter="none")["choices"][0]["message"]["content"] for i in range(3)]
    assert len(set(texts)) > 1  # they sample apart
    alone = chat(server, seed=11)
    assert many["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]  # the prompt once
    assert many["usage"]["completion_tokens"] == sum(
        chat(server, seed=11 + i)["usage"]["completion_tokens"] for i in range(3)
    )
    greedy = chat(server, n=2, temperature=0)
    assert greedy["choices"][0]["message"] == greedy["choices"][1]["message"]


def test_streamed_choices_are_the_whole_ones(server: Server) -> None:
    body = {"model": MODEL, "messages": ASK, "max_tokens": 10, "temperature": 0.9, "seed": 5, "n": 3, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=TIMEOUT) as answer:
        chunks = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    texts, reasons = ["", "", ""], [None, None, None]
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content") or ""
        reasons[choice["index"]] = choice["finish_reason"] or reasons[choice["index"]]
    whole = chat(server, n=3, seed=5)
    assert texts == [choice["message"]["content"] for choice in whole["choices"]]
    assert reasons == [choice["finish_reason"] for choice in whole["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_completions_choices_count_their_own_offsets(server: Server) -> None:
    body = {"model": MODEL, "prompt": "w1 w2", "max_tokens": 6, "temperature": 0.9, "seed": 3, "n": 2, "logprobs": 1}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=TIMEOUT).json()
    for choice in answer["choices"]:
        offsets, tokens = choice["logprobs"]["text_offset"], choice["logprobs"]["tokens"]
        spelled = [0 if t == "<eos>" else len(t) for t in tokens]  # its text leaves the special token out
        assert offsets[0] == 0 and all(b - a == n for a, b, n in zip(offsets, offsets[1:], spelled, strict=False))
        assert offsets[-1] + spelled[-1] == len(choice["text"])


def test_choices_past_the_queue_are_refused_whole_and_leave_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(native_chat_pipeline(), max_running=1, max_waiting=2) as running:
        url, body = f"{running.url}/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 200}
        never = httpx.post(url, json=body | {"n": 4}, timeout=TIMEOUT)  # one slot and two queued: it never fits
        assert never.status_code == 400 and never.json()["error"]["param"] == "n"
        gate, step = threading.Event(), running.engine.step
        monkeypatch.setattr(running.engine, "step", lambda: gate.wait(TIMEOUT) and step())  # no step until opened
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = [pool.submit(httpx.post, url, json=body | {"max_tokens": 4}, timeout=TIMEOUT) for _ in range(2)]
            while running.engine.scheduler.num_waiting < 2:
                time.sleep(0.01)
            answer = httpx.post(url, json=body | {"n": 3}, timeout=TIMEOUT)  # its first choice fits, its second not
            assert answer.status_code == 429 and answer.json()["error"]["code"] == "queue_full"
            assert answer.headers["retry-after"] == "1"  # the openai client waits that long before it sends again
            gate.set()
            assert [response.result().status_code for response in first] == [200, 200]
        deadline = time.monotonic() + TIMEOUT
        while not running.engine.idle and time.monotonic() < deadline:  # the submitted ones are cancelled
            time.sleep(0.01)
        assert running.engine.idle
