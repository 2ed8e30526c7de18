"""Shutting down (SIGTERM, Ctrl-C: ``ServingLoop.drain``): no request in flight is left without an answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from conftest import MODEL, TIMEOUT, Server, native_chat_pipeline, serving

from quickdraft.api import Pipeline


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_chat_pipeline()


async def in_flight(server: Server, graces_s: list[float], max_tokens: int) -> list[httpx.Response | list[str]]:
    """Four requests (two streamed) and, once they all are in, a drain of each grace in turn; then a fifth request."""

    async def whole(client: httpx.AsyncClient) -> httpx.Response:
        body = {"model": MODEL, "prompt": "w1 w2", "max_tokens": max_tokens}
        return await client.post(f"{server.url}/v1/completions", json=body)

    async def streamed(client: httpx.AsyncClient) -> list[str]:
        body = {"model": MODEL, "prompt": "w3 w1", "max_tokens": max_tokens, "stream": True}
        async with client.stream("POST", f"{server.url}/v1/completions", json=body) as response:
            return [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]

    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        calls = [asyncio.ensure_future(call(client)) for call in (whole, streamed, whole, streamed)]
        while len(server.engine.scheduler.running) + server.engine.scheduler.num_waiting < 4:
            await asyncio.sleep(0.01)
        for grace_s in graces_s:
            server.loop.drain(grace_s)
        late = await whole(client)
        health = await client.get(f"{server.url}/health")
        return [*(await asyncio.gather(*calls)), late, health]


def test_a_drain_finishes_the_requests_in_flight_and_refuses_new_ones(
    native: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    with serving(native, max_running=2) as server:  # two run, two wait: all four finish within the grace
        forward_batch = native.target.forward_batch
        monkeypatch.setattr(native.target, "forward_batch", lambda rows: time.sleep(0.01) or forward_batch(rows))
        first, second, third, fourth, late, health = asyncio.run(in_flight(server, [TIMEOUT], 20))
        for response in (first, third):
            assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 20
        for events in (second, fourth):
            assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down"
        assert health.status_code == 503
        deadline = time.monotonic() + TIMEOUT
        while server.loop.alive:  # the loop ends once nothing is left
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_requests_left_at_the_end_of_the_grace_get_a_503(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(native, max_running=2) as server:
        forward_batch = native.target.forward_batch
        monkeypatch.setattr(native.target, "forward_batch", lambda rows: time.sleep(0.02) or forward_batch(rows))
        first, second, third, fourth, late, _ = asyncio.run(in_flight(server, [0.2], 240))
        for response in (first, third, late):
            assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
        for events in (second, fourth):
            assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
        assert server.engine.idle and not server.engine.scheduler.running


def test_a_second_drain_may_cut_the_grace_short(native: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C (``drain(0)``) ends what is left at once, each request with its 503 or error event."""
    with serving(native, max_running=2) as server:
        forward_batch = native.target.forward_batch
        monkeypatch.setattr(native.target, "forward_batch", lambda rows: time.sleep(0.02) or forward_batch(rows))
        drains = [TIMEOUT, 0, 2 * TIMEOUT]  # the last one does not lengthen the grace again
        first, second, third, fourth, late, _ = asyncio.run(in_flight(server, drains, 240))
        for response in (first, third, late):
            assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"
        for events in (second, fourth):
            assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
        deadline = time.monotonic() + TIMEOUT
        while server.loop.alive:  # the drain ended the loop: what comes now is still a shutdown's 503
            assert time.monotonic() < deadline
            time.sleep(0.01)
        after = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "w1"}, timeout=TIMEOUT)
        health = httpx.get(f"{server.url}/health", timeout=TIMEOUT)
        for response in (after, health):
            assert response.status_code == 503 and response.json()["error"]["code"] == "shutting_down"


@contextlib.contextmanager
def quickdraft_serve(model_dirs: dict[str, Path], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list]]:
    """``quickdraft serve`` in a process of its own, once it answers, with the lines it prints as they come; on the
    way out, they are checked."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "quickdraft", "serve", "--target", str(model_dirs["target"])]
    command += ["--drafter", "none", "--port", str(port)]
    env = os.environ | {"QUICKDRAFT_CACHE": str(tmp_path / "cache")}
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(server.stdout or ()), daemon=True)
    reader.start()
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while not healthy(url):
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield server, url, printed
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        reader.join(TIMEOUT)
    output = "".join(printed)
    assert "shutting down: finishing the requests in flight" in output and "Traceback" not in output


def stream_while(url: str, max_tokens: int, interrupt: Callable[[], object]) -> list[str]:
    """The data events of a streamed greedy completion during which, once it runs, ``interrupt()`` is called."""
    body = {"model": "target", "prompt": "w3 w1", "max_tokens": max_tokens, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it is running
        interrupt()
        return [line[6:] for line in lines if line.startswith("data: ")]


def test_sigterm_lets_quickdraft_serve_answer_what_it_was_doing(
    native_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The signal wiring of ``quickdraft serve``: a stream that is running when SIGTERM comes ends properly, and
    the process exits 0."""
    with quickdraft_serve(native_model_dirs, tmp_path) as (server, url, _):
        events = stream_while(url, 400, lambda: server.send_signal(signal.SIGTERM))
        assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert server.wait(TIMEOUT) == 0


def test_a_second_ctrl_c_ends_the_streams_at_once(native_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A second SIGINT ends a stream the first left running with an error event then ``[DONE]``, and the process
    exits 0 at once, not when its HTTP thread's wait runs out."""
    with quickdraft_serve(native_model_dirs, tmp_path) as (server, url, printed):

        def ctrl_c_twice() -> None:
            server.send_signal(signal.SIGINT)
            deadline = time.monotonic() + TIMEOUT
            while not any("shutting down" in line for line in printed):  # two signals at once are one
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.001)
            server.send_signal(signal.SIGINT)

        events = stream_while(url, 480, ctrl_c_twice)
        ended = time.monotonic()
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "shutting_down"
        assert server.wait(TIMEOUT) == 0 and time.monotonic() - ended < 5
    assert any("stopping now" in line for line in printed)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_port_in_use_is_an_error(native_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "quickdraft", "serve", "--target", str(native_model_dirs["target"])]
        command += ["--drafter", "none", "--port", str(port)]
        env = os.environ | {"QUICKDRAFT_CACHE": str(tmp_path / "cache")}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and f"cannot serve on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "serving" not in done.stderr  # refused before the models load, and never said to serve
