"""The HTTP API under random bodies: OpenAI's fields and quickdraft's, each any JSON value, over a valid request or
none; and requests that are not HTTP at all. Whatever comes, the answer is a 2xx or an OpenAI-style 4xx: never a 500,
never a traceback, never plain text, and the server goes on."""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIELDS = (
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
    "stop", "stream", "stream_options", "n", "logprobs", "top_logprobs", "prediction", "response_format", "regex",
    "grammar", "drafter", "policy", "num_draft_tokens", "max_draft_tokens", "return_token_ids", "cache_prompt",
    "tools", "tool_choice", "presence_penalty", "logit_bias", "echo", "user", "parallel_tool_calls",
    "repetition_penalty", "max_tokenz",
)  # fmt: skip
KEYS = st.sampled_from(["role", "content", "type", "name", "function", "schema", "x"])
LEAVES = (
    st.none() | st.booleans() | st.integers(-5, 40) | st.floats(-2, 2) | st.sampled_from(["w1", "", "auto", "\ud800"])
)  # "\ud800": no UTF-8 text
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3), max_leaves=6
)
BASES = {
    "completions": {"model": MODEL, "prompt": "w1 w2", "max_tokens": 3},
    "chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 3},
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving(native_chat_pipeline()) as running:
        yield running


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(list(BASES)),
    start_valid=st.booleans(),
    changes=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4),
)
def test_random_bodies_get_answers_or_openai_errors(
    server: Server, path: str, start_valid: bool, changes: dict[str, object]
) -> None:
    body = (BASES[path] if start_valid else {}) | changes
    raw = json.dumps(body)  # ensure_ascii: a lone surrogate goes out as its escape, valid JSON
    headers = {"content-type": "application/json"}
    response = httpx.post(f"{server.url}/v1/{path}", content=raw, headers=headers, timeout=TIMEOUT)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and "Traceback" not in error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and all("error" not in json.loads(event) for event in events[:-1])


MALFORMED = {
    "request line": b"GARBAGE\r\n\r\n",
    "header without a colon": b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "header name with a space": b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
    "two lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "length not a number": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_http_gets_a_json_400_and_the_server_goes_on(server: Server, request_bytes: bytes) -> None:
    """A request uvicorn cannot parse never reaches the app: its 400 is still OpenAI's error body, and it closes."""
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=TIMEOUT) as connection:
        connection.sendall(request_bytes)
        answer = b""
        while chunk := connection.recv(65536):  # read until the server closes the connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert lines[0] == "HTTP/1.1 400 Bad Request" and headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body) and headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith("malformed HTTP request")
    assert httpx.get(f"{server.url}/health", timeout=TIMEOUT).json() == {"status": "ok"}


@pytest.mark.parametrize("split", [False, True], ids=["one write", "many writes"])
def test_a_head_over_its_limit_gets_a_json_431_before_it_ends(server: Server, split: bool) -> None:
    """An endless header is refused once it passes MAX_HEAD_BYTES, before any key is checked, whether it comes in
    one piece or many; the client reads the answer and then the server's close, though it sends on after the
    refusal (a server that closes with bytes unread resets the connection); a body as long as that is no head."""
    from quickdraft.server.http_server import MAX_HEAD_BYTES

    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=TIMEOUT) as connection:
        connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        filler = b"a" * (MAX_HEAD_BYTES + 1)  # just past the limit
        for start in range(0, len(filler), 4096 if split else len(filler)):
            connection.sendall(filler[start : start + (4096 if split else len(filler))])
        time.sleep(0.2)  # the server has refused the head by now
        connection.sendall(b"a" * 65536)  # what a client still sends is read and dropped
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:200]
    limit = f"a request's line and headers are at most {MAX_HEAD_BYTES // 1024} kB"
    assert json.loads(body)["error"]["message"] == limit
    long_body = {"model": MODEL, "prompt": "w1 " * MAX_HEAD_BYTES, "max_tokens": 1}  # read as a body, not a head
    answer = httpx.post(f"{server.url}/v1/completions", json=long_body, timeout=TIMEOUT)
    assert answer.json()["error"]["code"] == "context_length_exceeded"


def test_a_malformed_request_after_one_in_flight_leaves_no_error_in_the_log(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The answer to a request read before the malformed one is dropped, as for a client that left (it raised
    writing after the connection's end was shut)."""
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=TIMEOUT) as connection:
        connection.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\x00\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        time.sleep(0.5)  # the client holds the connection while the first request's answer is written
    assert b"400 Bad Request" in answer
    time.sleep(0.5)
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert httpx.get(f"{server.url}/health", timeout=TIMEOUT).json() == {"status": "ok"}


def test_without_httptools_the_protocol_is_h11s(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn without its [standard] extra parses with h11, which bounds a head itself: the server still starts."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from quickdraft.server.http_server import json_errors_protocol

    monkeypatch.setitem(sys.modules, "httptools", None)  # import httptools raises ImportError
    for module in ("uvicorn.protocols.http.auto", "uvicorn.protocols.http.httptools_impl"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    json_errors_protocol.cache_clear()
    try:
        assert issubclass(json_errors_protocol(), H11Protocol)
    finally:
        json_errors_protocol.cache_clear()
