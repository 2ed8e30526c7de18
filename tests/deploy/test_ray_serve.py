"""``quickdraft serve --replicas 2`` on loopback: two replicas behind one endpoint, each response the single
request's greedy decoding, and a replica killed mid-run costs no hung request and comes back."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig

pytest.importorskip("ray.serve", reason="the ray extra is not installed")
pytestmark = pytest.mark.ray
REPLICA_PROCESS = "ServeReplica:quickdraft:QuickdraftReplica"
TIMEOUT = 120.0
LONG = 200  # new tokens per request (prompts whose greedy answers run that long: streams long enough to be cut)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def replica_pids() -> list[int]:
    """The replicas' processes (Ray names them after the deployment)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and REPLICA_PROCESS in (entry / "cmdline").read_text(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def wait_for(url: str, replicas: int, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{url}/health", timeout=5)
            if answer.status_code == 200 and answer.json()["replicas"] == replicas:
                return answer.json()
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(1)
    raise AssertionError(f"the deployment did not get to {replicas} running replicas")


def test_two_replicas_serve_greedy_outputs_and_survive_a_killed_one(
    native_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    port = free_port()
    command = [sys.executable, "-m", "quickdraft", "serve", "--replicas", "2", "--threads-per-replica", "1"]
    command += ["--port", str(port), "--target", str(native_model_dirs["target"]), "--drafter", "prompt-lookup"]
    command += ["--max-running", "8", "--max-waiting", "8", "--served-model-name", "tiny", "--max-body-mb", "1"]
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url, 2, 240)
        serving = f"quickdraft: serving tiny on http://127.0.0.1:{port}/v1 (2 replicas)"
        for _ in range(100):  # the line follows the replicas' start
            lines = (tmp_path / "serve.log").read_text().splitlines()
            if serving in lines:
                break
            time.sleep(0.1)
        started = next(i for i, line in enumerate(lines) if line.startswith("quickdraft: starting 2 replicas"))
        notes = [line for line in lines[started + 1 : lines.index(serving)] if line.startswith("quickdraft: ")]
        assert any("batch costs" in note for note in notes), lines  # a replica's startup notes, as one server's
        for path in ("/health", "/v1/models", "/metrics"):  # a load balancer's check that reads no body
            head = httpx.head(f"{url}{path}", timeout=30)
            assert head.status_code == 200 and head.content == b"", path
        pipeline = Pipeline.load(str(native_model_dirs["target"]), None, "native")
        config = GenerationConfig(max_new_tokens=LONG)
        expected = {}
        for prompt in (f"w{i} w{j} w{i}" for i in range(1, 30) for j in range(1, 30, 7)):
            result = pipeline.generate(prompt, config, drafter="none", chat=True)
            if result.finish_reason == "length":  # streams that run long enough to be cut
                expected[prompt] = result.text
        prompts = list(expected)[:12]
        assert len(prompts) == 12
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        streaming = threading.Event()

        def ask(prompt: str) -> str | Exception:
            try:
                stream = client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=LONG, temperature=0,
                    stream=True,
                )  # fmt: skip
                text = ""
                for chunk in stream:
                    text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
                    streaming.set()
                return text
            except openai.APIError as error:
                return error

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(ask, prompts))
        assert answers == [expected[p] for p in prompts]  # every response is the lone request's greedy decoding
        body = b'{"model": "tiny", "prompt": "w1 \\ud800"}'  # a lone surrogate, escaped as JSON allows it
        surrogate = httpx.post(f"{url}/v1/completions", content=body, timeout=30)
        assert surrogate.status_code == 400 and "UTF-8" in surrogate.json()["error"]["message"]  # it hung here
        nested = httpx.post(f"{url}/v1/completions", content=b"[" * 100_000, timeout=30)
        assert nested.status_code == 400 and set(nested.json()["error"]) == {"message", "type", "param", "code"}
        big = httpx.post(f"{url}/v1/completions", content=b" " * (2 << 20), timeout=30)  # over --max-body-mb 1
        assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
        nowhere = httpx.get(f"{url}/v1/nowhere", timeout=30)
        assert nowhere.status_code == 404 and "no endpoint /v1/nowhere; it serves" in nowhere.json()["error"]["message"]
        kept = httpx.get(f"{url}/v1/responses/resp_1", timeout=30)  # as a single server answers each
        assert kept.status_code == 404 and "keeps no responses" in kept.json()["error"]["message"]
        form = httpx.post(f"{url}/v1/completions", content=body, headers={"content-type": "text/plain"}, timeout=30)
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        assert client.models.retrieve("tiny").id == "tiny"
        asked = {"model": "tiny", "input": prompts[0], "max_output_tokens": LONG, "temperature": 0}
        events = list(client.responses.create(**asked, stream=True))  # /v1/responses through the ingress too
        assert client.responses.create(**asked).output_text == events[-1].response.output_text == expected[prompts[0]]
        with concurrent.futures.ThreadPoolExecutor(72) as pool:  # Ray holds 2 × (8 + 8): any more get 429
            burst = list(pool.map(ask, prompts * 6))
        for p, answer in zip(prompts * 6, burst, strict=True):  # how many arrive together depends on the machine
            assert answer == expected[p] or getattr(answer, "status_code", None) == 429, answer

        streaming.clear()
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            running = [pool.submit(ask, p) for p in prompts * 2]
            assert streaming.wait(TIMEOUT)
            victims = replica_pids()
            assert len(victims) == 2, victims
            os.kill(victims[0], signal.SIGKILL)  # mid-stream: both replicas hold some of the 24
            finished = [future.result(timeout=TIMEOUT) for future in running]  # none hangs
        served = [(p, answer) for p, answer in zip(prompts * 2, finished, strict=True) if isinstance(answer, str)]
        assert served and all(answer == expected[p] for p, answer in served)  # a cut stream ends in an error
        health = wait_for(url, 2, 240)  # Ray started a new replica
        assert (health["min_replicas"], health["max_replicas"]) == (2, 2)
        after = [ask(p) for p in prompts[:4]]  # and serves again
        assert after == [expected[p] for p in prompts[:4]]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        lost = re.search(r"^quickdraft_ingress_replica_failures_total ([0-9.]+)$", metrics, re.MULTILINE)
        refused = [answer for answer in finished if getattr(answer, "status_code", None) == 429]  # past the queue
        cut = [answer for answer in finished if not isinstance(answer, str) and answer not in refused]
        assert lost is not None and (float(lost.group(1)) >= 1 or not cut)  # a cut stream was a counted failure

        streaming.clear()  # SIGTERM with streams in flight: they finish, new requests get 503, the process exits 0
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            running = [pool.submit(ask, p) for p in prompts * 2]
            assert streaming.wait(TIMEOUT)
            server.send_signal(signal.SIGTERM)
            finished = [future.result(timeout=TIMEOUT) for future in running]
        for p, answer in zip(prompts * 2, finished, strict=True):  # sent after the signal: 503; past the queue: 429
            assert answer == expected[p] or getattr(answer, "status_code", None) in (429, 503), answer
        assert any(isinstance(answer, str) for answer in finished)  # the streams it held ran to their end, uncut
        assert server.wait(TIMEOUT) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
