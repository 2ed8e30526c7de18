"""A server safe to expose: the API key, the body limit, JSON nested too deeply, the request timeout, and fields
OpenAI defines that this server does not implement (refused, never ignored)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import openai
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving

from quickdraft.api import Pipeline
from quickdraft.errors import ConfigError
from quickdraft.server.access import API_KEY_VARIABLE, Access, read_json
from quickdraft.server.protocol import ApiError

KEY = "s3cret-key"
PROMPT = {"model": MODEL, "prompt": "w1 w2", "max_tokens": 3}


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_chat_pipeline()


@pytest.fixture(scope="module")
def locked(native: Pipeline) -> Iterator[Server]:
    with serving(native, access=Access(api_key=KEY, max_body_bytes=4096)) as running:
        yield running


@pytest.fixture(scope="module")
def keyed(native: Pipeline) -> Iterator[Server]:
    """A key and the default body limit."""
    with serving(native, access=Access(api_key=KEY)) as running:
        yield running


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_missing_or_wrong_key_gets_401_and_the_right_key_200(locked: Server) -> None:
    for headers in ({}, bearer("wrong"), {"Authorization": KEY}, bearer(KEY + "x")):
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics")):
            response = httpx.request(method, f"{locked.url}{path}", json=PROMPT, headers=headers, timeout=TIMEOUT)
            error = response.json()["error"]
            assert response.status_code == 401 and error["code"] == "invalid_api_key", (headers, path)
            assert KEY not in response.text
    assert httpx.get(f"{locked.url}/health", timeout=TIMEOUT).status_code == 200  # open, for load balancers
    good = httpx.post(f"{locked.url}/v1/completions", json=PROMPT, headers=bearer(KEY), timeout=TIMEOUT)
    assert good.status_code == 200 and good.json()["choices"][0]["text"]
    assert httpx.get(f"{locked.url}/metrics", headers=bearer(KEY), timeout=TIMEOUT).status_code == 200


def test_the_openai_client_sends_its_key(locked: Server) -> None:
    base = f"{locked.url}/v1"
    client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0, timeout=TIMEOUT)
    assert client.completions.create(model=MODEL, prompt="w1", max_tokens=2).choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="nope", max_retries=0).models.list()


def test_public_metrics_need_no_key(native: Pipeline) -> None:
    with serving(native, access=Access(api_key=KEY, metrics_public=True)) as running:
        assert httpx.get(f"{running.url}/metrics", timeout=TIMEOUT).status_code == 200
        assert httpx.get(f"{running.url}/v1/models", timeout=TIMEOUT).status_code == 401


def test_the_key_is_never_shown() -> None:
    access = Access(api_key=KEY)
    assert KEY not in repr(access) and KEY not in str(access)


def test_a_body_over_the_limit_gets_413_and_the_server_goes_on(locked: Server) -> None:
    big = {**PROMPT, "prompt": "w1 " * 3000}
    response = httpx.post(f"{locked.url}/v1/completions", json=big, headers=bearer(KEY), timeout=TIMEOUT)
    assert response.status_code == 413 and "at most 4096" in response.json()["error"]["message"]
    assert httpx.post(f"{locked.url}/v1/completions", json=PROMPT, headers=bearer(KEY), timeout=TIMEOUT).is_success


class Streamed:
    """A request whose body arrives in chunks with no declared length (chunked transfer encoding)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.headers: dict[str, str] = {}
        self.chunks = chunks

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def test_a_body_without_a_declared_length_is_cut_off_at_the_limit() -> None:
    with pytest.raises(ApiError) as error:
        asyncio.run(read_json(Streamed([b"[" * 600, b"1" * 600]), 1000))
    assert error.value.status == 413
    assert asyncio.run(read_json(Streamed([b'{"a":', b" 1}"]), 1000)) == {"a": 1}


def test_a_client_that_leaves_mid_body_gets_a_400_not_a_server_failure() -> None:
    from starlette.requests import ClientDisconnect

    class Leaving(Streamed):
        async def stream(self) -> AsyncIterator[bytes]:
            yield b'{"model":'
            raise ClientDisconnect

    with pytest.raises(ApiError, match="closed the connection") as error:
        asyncio.run(read_json(Leaving([]), 1000))
    assert error.value.status == 400


def test_a_body_that_stalls_gets_a_408_after_the_body_timeout(native: Pipeline) -> None:
    class Stalling(Streamed):
        async def stream(self) -> AsyncIterator[bytes]:
            yield b'{"model":'
            await asyncio.sleep(60)
            yield b' "m"}'

    with pytest.raises(ApiError, match=r"had not all arrived after 0\.2 s") as error:
        asyncio.run(read_json(Stalling([]), 1000, timeout_s=0.2))
    assert error.value.status == 408 and error.value.code == "timeout"
    with pytest.raises(ConfigError, match="body timeout"):
        Access(body_timeout_s=0)
    with serving(native, access=Access(body_timeout_s=0.5)) as running:  # a client that sends half its body
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=TIMEOUT) as client:
            head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            client.sendall(f"{head}Content-Length: 100\r\n\r\n".encode() + b'{"model":')
            answer = client.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 408") and '"code":"timeout"' in answer.replace(" ", "")


def test_json_nested_too_deeply_is_a_400_not_a_500(native: Pipeline) -> None:
    with serving(native) as running:
        deep = b"[" * 100_000 + b"]" * 100_000
        response = httpx.post(f"{running.url}/v1/completions", content=deep, timeout=TIMEOUT)
        assert response.status_code == 400 and "too deeply" in response.json()["error"]["message"]


def test_a_request_past_its_timeout_is_cancelled(native: Pipeline) -> None:
    with serving(native, access=Access(request_timeout_s=0.001)) as running:
        body = {**PROMPT, "max_tokens": 200}
        response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=TIMEOUT)
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        with httpx.stream("POST", f"{running.url}/v1/completions", json={**body, "stream": True}) as streamed:
            events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
        assert json.loads(events[-2])["error"]["code"] == "timeout" and events[-1] == "[DONE]"
        deadline = time.monotonic() + TIMEOUT
        while running.engine.scheduler.running and time.monotonic() < deadline:  # cancelled at the next step
            time.sleep(0.01)
        assert not running.engine.scheduler.running


@pytest.mark.parametrize(
    "field",
    [{"tools": []}, {"tool_choice": "none"}, {"presence_penalty": 0.0}, {"user": "u1"}, {"metadata": {"a": "b"}}],
)
def test_fields_that_change_nothing_are_accepted(locked: Server, field: dict[str, object]) -> None:
    response = httpx.post(f"{locked.url}/v1/completions", json=PROMPT | field, headers=bearer(KEY), timeout=TIMEOUT)
    assert response.status_code == 200


def test_a_developer_message_is_a_system_message(locked: Server) -> None:
    messages = [{"role": "developer", "content": "w3"}, {"role": "user", "content": "w1"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    response = httpx.post(f"{locked.url}/v1/chat/completions", json=body, headers=bearer(KEY), timeout=TIMEOUT)
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((None, False, 0, 600), "--max-body-mb must be a number of megabytes > 0"),
        ((None, False, float("nan"), 600), "--max-body-mb must be a number of megabytes > 0"),
        ((None, False, float("inf"), 600), "--max-body-mb must be a number of megabytes > 0"),
        ((None, False, 8, -1), "--request-timeout must be a number of seconds >= 0"),
        ((None, False, 8, float("nan")), "--request-timeout must be a number of seconds >= 0"),
        (("  ", False, 8, 600), "the API key: an API key must be printable text"),
    ],
)
def test_bad_access_settings_are_clear_errors(arguments: tuple, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Access.from_args(*arguments)


def test_the_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_VARIABLE, KEY)
    assert Access.from_args(None, False, 8, 0) == Access(api_key=KEY, request_timeout_s=None)
    assert Access.from_args("other", False, 8, 0).api_key == "other"
    monkeypatch.delenv(API_KEY_VARIABLE)
    assert Access.from_args(None, False, 8, 0).api_key is None
    for blank in ("", " ", "\n"):  # set but blank, as `QUICKDRAFT_API_KEY=$SECRET` with no secret: not an open server
        monkeypatch.setenv(API_KEY_VARIABLE, blank)
        with pytest.raises(ConfigError, match=r"\$QUICKDRAFT_API_KEY \(unset it to serve without a key\)"):
            Access.from_args(None, False, 8, 0)
        assert Access.from_args(KEY, False, 8, 0).api_key == KEY  # the flag goes first


LONG_SCHEMA = {"type": "string", "pattern": "(?=w)" + "w" * 70_000}


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"stop": [f"w{i}" for i in range(17)]}, "stop takes at most 16 strings"),
        ({"stop": "w" * 1025}, "of at most 1024 characters"),
        ({"regex": "(w1|w2)" * 10_000}, "a regex constraint is at most 65536 characters"),
        ({"grammar": "root ::= " + '"w1" ' * 14_000}, "a grammar constraint is at most 65536 characters"),
        (  # measured before the schema is checked (a lookaround refused), which compiles its patterns
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": LONG_SCHEMA}}},
            "a json_schema constraint is at most 65536 characters",
        ),
        ({"prompt": [[[[1]]]] * 1, "nested": json.loads("[" * 65 + "]" * 65)}, "nests JSON too deeply (at most 64"),
    ],
    ids=["stops", "a long stop", "a regex", "a grammar", "a schema", "deep JSON"],
)
def test_what_one_request_may_ask_of_the_servers_time_is_bounded(
    keyed: Server, field: dict[str, object], message: str
) -> None:
    """Compiling a grammar, looking for stop strings after every token and walking nested JSON all grow with what a
    request sends: past the bounds it is a 400, before any work (an attacker may hold the key)."""
    response = httpx.post(f"{keyed.url}/v1/completions", json=PROMPT | field, headers=bearer(KEY), timeout=TIMEOUT)
    assert response.status_code == 400 and message in response.json()["error"]["message"]


def test_a_prediction_is_bounded(keyed: Server) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "w1"}], "max_tokens": 3}
    prediction = {"type": "content", "content": "w1 " * 90_000}
    response = httpx.post(
        f"{keyed.url}/v1/chat/completions", json=chat | {"prediction": prediction}, headers=bearer(KEY), timeout=60
    )
    assert response.status_code == 400 and "prediction.content is at most" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_no_api_pages_are_served_without_the_key(locked: Server, path: str) -> None:
    assert httpx.get(f"{locked.url}{path}", timeout=TIMEOUT).status_code == 404
