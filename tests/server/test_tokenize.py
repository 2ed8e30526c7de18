"""``/tokenize`` and ``/detokenize``: the ids the server reads a prompt or a conversation as, and their text."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving

from quickdraft.engine import SchedulerSettings
from quickdraft.errors import ConfigError
from quickdraft.server.setup import ServerOptions, build_server

TEMPLATE = "{% for m in messages %}w9 {{ m.content }} w8 {% endfor %}w7"  # the tiny tokenizer's words only


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
    assert of_prompt["count"] == completion["usage"]["prompt_tokens"] and of_prompt["token_strs"] == [
        " w1",
        " w2",
        " w3",
    ]
    assert post(server, "/detokenize", {"tokens": of_prompt["tokens"]}).json() == {"prompt": "w1 w2 w3"}


def test_an_empty_prompt_is_what_the_tokenizer_makes_of_it() -> None:
    """As vLLM answers: a tokenizer that begins every text with its BOS token gives ``[bos]`` for "" (with special
    tokens), and one without gives none."""
    import types

    from conftest import word_tokenizer
    from tokenizers import processors

    from quickdraft.server.tokenize import tokenize

    tokenizer = word_tokenizer(8)
    begins = word_tokenizer(8)
    begins._tokenizer.post_processor = processors.TemplateProcessing(single="w0 $A", special_tokens=[("w0", 0)])
    for made, words in ((tokenizer, []), (begins, [0])):
        pipeline = types.SimpleNamespace(tokenizer=made, target=types.SimpleNamespace(max_context=64))
        answer = tokenize({"prompt": ""}, pipeline, (MODEL,), None, lambda token: ("", b""))
        assert answer == {"count": len(words), "max_model_len": 64, "tokens": words}
        plain = tokenize({"prompt": "", "add_special_tokens": False}, pipeline, (MODEL,), None, lambda t: ("", b""))
        assert plain["tokens"] == []


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
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "w1"}], "continue_final_message": True},
            400,
            "continue_final_message false",
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
    for field in ("add_generation_prompt", "continue_final_message"):  # the field at fault
        assert field not in body or answer.json()["error"]["param"] == field


def test_a_chat_template_given_to_the_server_renders_its_conversations(tiny_model_dirs: dict[str, Path]) -> None:
    """``serve --chat-template FILE`` (ServerOptions.chat_template): the server reads conversations through it, a
    model without a template of its own included."""
    from fastapi.testclient import TestClient

    options = ServerOptions(
        str(tiny_model_dirs["target"]), None, "transformers", SchedulerSettings(), "none", chat_template=TEMPLATE
    )
    server = build_server(options, own_thread=True)
    try:
        client = TestClient(server.app)
        messages = [{"role": "system", "content": "w4"}, {"role": "user", "content": "w1 w2"}]
        tokens = client.post("/tokenize", json={"messages": messages, "return_token_strs": True}).json()["token_strs"]
        assert tokens == [" w9", " w4", " w8", " w9", " w1", " w2", " w8", " w7"]  # words after text
    finally:
        server.loop.stop()
    with pytest.raises(ConfigError, match="the chat template cannot be read"):
        build_server(dataclasses.replace(options, chat_template="{% for m in messages %"), own_thread=True)
    # serve --chat-template-kwargs: every conversation's variables, a request's own winning name by name
    thinking = TEMPLATE.replace("w7", "{% if enable_thinking is false %}w6 {% endif %}w7")
    quiet = dataclasses.replace(options, chat_template=thinking, chat_template_kwargs={"enable_thinking": False})
    with TestClient(build_server(quiet, own_thread=True).app) as client:  # the app's lifespan runs its loop
        messages = [{"role": "user", "content": "w1"}]
        default = client.post("/tokenize", json={"messages": messages, "return_token_strs": True}).json()
        mine = {"messages": messages, "return_token_strs": True, "chat_template_kwargs": {"enable_thinking": True}}
        assert default["token_strs"][-2:] == [" w6", " w7"] and client.post("/tokenize", json=mine).json()[
            "token_strs"][-2:] == [" w8", " w7"]  # fmt: skip
        answer = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).json()
        assert answer["usage"]["prompt_tokens"] == default["count"]
    with pytest.raises(ConfigError, match="chat_template_kwargs cannot set tokenize"):
        build_server(dataclasses.replace(quiet, chat_template_kwargs={"tokenize": True}), own_thread=True)


def test_chat_template_kwargs_reach_the_template_on_every_chat_path() -> None:
    """vLLM's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``): the template reads them on /tokenize and on
    chat completions alike; a value that is no object, or one naming ``apply_chat_template``'s own arguments, is a
    400 on that field, and /v1/completions has no template to give them to."""
    pipeline = native_chat_pipeline()
    pipeline.tokenizer.chat_template = TEMPLATE.replace("w7", "{% if enable_thinking is false %}w6 {% endif %}w7")
    messages = [{"role": "user", "content": "w1 w2"}]
    with serving(pipeline) as running:
        plain = post(running, "/tokenize", {"messages": messages, "return_token_strs": True}).json()
        body = {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
        quiet = post(running, "/tokenize", body | {"return_token_strs": True}).json()
        assert plain["token_strs"][-2:] == [" w8", " w7"] and quiet["token_strs"][-3:] == [" w8", " w6", " w7"]
        answer = post(running, "/v1/chat/completions", body | {"max_tokens": 1}).json()
        assert answer["usage"]["prompt_tokens"] == quiet["count"]
        for path, bad, words in [
            ("/v1/chat/completions", {"chat_template_kwargs": "yes"}, "must be an object"),
            ("/v1/chat/completions", {"chat_template_kwargs": {"tokenize": True}}, "cannot set tokenize"),
            ("/tokenize", {"chat_template_kwargs": {"messages": []}}, "cannot set messages"),
        ]:
            limit = {} if path == "/tokenize" else {"max_tokens": 1}
            error = post(running, path, {"messages": messages} | limit | bad)
            assert error.status_code == 400 and error.json()["error"]["param"] == "chat_template_kwargs", error.text
            assert words in error.json()["error"]["message"]
        completion = post(running, "/v1/completions", {"prompt": "w1", "chat_template_kwargs": {"x": 1}})
        assert completion.status_code == 400 and "needs /v1/chat/completions" in completion.text
