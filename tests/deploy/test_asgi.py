"""A request through a replica's app in process: the same responses as over HTTP, streamed as sent, and a caller
that stops reading cancels the request in the engine."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from conftest import CHEAP_BATCH, MODEL, native_pipeline

from quickdraft.deploy.asgi import ResponseStart, call_app
from quickdraft.engine import SchedulerSettings
from quickdraft.server.access import Access
from quickdraft.server.app import create_app
from quickdraft.server.loop import ServingLoop
from quickdraft.server.protocol import ServerDefaults
from quickdraft.server.setup import serving_engine


def collected(app, method: str, path: str, body: dict | None = None) -> tuple[ResponseStart, bytes]:
    async def run() -> tuple[ResponseStart, bytes]:
        parts = [part async for part in call_app(app, method, path, json.dumps(body).encode() if body else b"")]
        start, chunks = parts[0], parts[1:]
        assert isinstance(start, ResponseStart) and all(isinstance(chunk, bytes) for chunk in chunks)
        return start, b"".join(chunks)  # type: ignore[arg-type]

    return asyncio.run(run())


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the engine's thread lives on
def test_a_replicas_app_answers_in_process_as_over_http() -> None:
    pipeline = native_pipeline()
    engine, _ = serving_engine(pipeline, SchedulerSettings(), batch_costs=CHEAP_BATCH)
    loop = ServingLoop(engine)
    app = create_app(pipeline, loop, ServerDefaults((MODEL,), max_tokens=8))
    loop.start()
    try:
        start, body = collected(app, "GET", "/v1/models")
        assert start.status == 200 and json.loads(body)["data"][0]["id"] == MODEL
        request = {"model": MODEL, "prompt": "w1 w2 w3", "max_tokens": 6, "temperature": 0}
        start, body = collected(app, "POST", "/v1/completions", request)
        expected = pipeline.generate(pipeline.encode("w1 w2 w3"), _greedy(6), drafter="none").text
        assert start.status == 200 and json.loads(body)["choices"][0]["text"] == expected
        start, body = collected(app, "POST", "/v1/completions", {**request, "stream": True})
        assert start.header(
            "content-type",
        ).startswith("text/event-stream")  # type: ignore[union-attr]
        events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == expected
        start, body = collected(app, "POST", "/v1/completions", {"model": MODEL, "prompt": "w1", "max_tokens": 0})
        assert start.status == 400 and "max_tokens must be" in json.loads(body)["error"]["message"]

        async def leave_early() -> None:  # read the first event of a long stream, then go
            stream = {"model": MODEL, "prompt": "w1", "max_tokens": 200, "stream": True, "temperature": 0}
            parts = call_app(app, "POST", "/v1/completions", json.dumps(stream).encode())
            assert isinstance(await parts.__anext__(), ResponseStart)
            await parts.__anext__()
            await parts.aclose()

        asyncio.run(leave_early())
        deadline = time.monotonic() + 10
        while engine.scheduler.running or engine.scheduler.waiting:
            assert time.monotonic() < deadline, "the request a caller left was not cancelled"
            time.sleep(0.05)
    finally:
        loop.stop()


def _greedy(max_tokens: int):
    from quickdraft.config import GenerationConfig

    return GenerationConfig(max_new_tokens=max_tokens)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_replicas_time_limit_counts_the_wait_before_it() -> None:
    """A request that waited in Ray's queue past ``--request-timeout`` times out as soon as it reaches a replica, as
    a single server's would have while it waited in its own queue."""
    pipeline = native_pipeline()
    engine, _ = serving_engine(pipeline, SchedulerSettings(), batch_costs=CHEAP_BATCH)
    loop = ServingLoop(engine)
    app = create_app(pipeline, loop, ServerDefaults((MODEL,), max_tokens=8), Access(request_timeout_s=30))
    loop.start()
    try:
        body = json.dumps({"model": MODEL, "prompt": "w1 w2", "max_tokens": 4}).encode()

        async def answer(waited_s: float) -> tuple[int, bytes]:
            parts = [part async for part in call_app(app, "POST", "/v1/completions", body, waited_s)]
            return parts[0].status, b"".join(parts[1:])  # type: ignore[union-attr,arg-type]

        assert asyncio.run(answer(0.0))[0] == 200
        status, answered = asyncio.run(answer(31.0))
        assert status == 504 and json.loads(answered)["error"]["code"] == "timeout"
    finally:
        loop.stop()
