"""``/tokenize`` and ``/detokenize``: the ids the server reads a prompt or a conversation as, and their text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(native_chat_pipeline()) as running:
        yield running


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=TIMEOUT)


def test_the_ids_are_those_the_server_reads_and_their_text_comes_back(server: Server) -> None:
    messages = [{"role": "user", "content": "w1 w2 w3"}]
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1}).json()
    of_chat = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()
    assert of_chat["count"] == len(of_chat["tokens"]) == chat["usage"]["prompt_tokens"]
    assert of_chat["max_model_len"] == server.engine.target.max_context
    completion = post(server, "/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 1}).json()
    of_prompt = post(server, "/tokenize", {"prompt": "w1 w2 w3", "return_token_strs": True}).json()
    assert of_prompt["count"] == completion["usage"]["prompt_tokens"] and of_prompt["token_strs"] == ["w1", "w2", "w3"]
    assert post(server, "/detokenize", {"tokens": of_prompt["tokens"]}).json() == {"prompt": "w1 w2 w3"}


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/tokenize", {"prompt": "w1", "promt": "w2"}, 400, "unrecognized request argument: promt"),
        ("/tokenize", {"prompt": "w1", "messages": [{"role": "user", "content": "w1"}]}, 400, "a prompt or messages"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "w1"}], "add_generation_prompt": False},
            400,
            "add_generation_prompt true only",
        ),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "w1"}]}, 400, "unknown message role"),
        ("/tokenize", {"model": "other", "prompt": "w1"}, 404, "does not exist"),
        ("/detokenize", {"tokens": [10**6]}, 400, "token ids in [0,"),
        ("/detokenize", {"tokens": ["w1"]}, 400, "token ids in [0,"),
    ],
)
def test_bad_input_is_a_clear_error(server: Server, path: str, body: dict[str, Any], status: int, words: str) -> None:
    answer = post(server, path, body)
    assert answer.status_code == status and words in answer.json()["error"]["message"], answer.text
