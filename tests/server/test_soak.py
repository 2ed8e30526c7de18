"""A soak run: an hour of traffic at one request every 6 s, compressed into a bounded loopback run of tiny models.

600 requests arrive at random (Poisson, 16 at most in flight): completions greedy and with drafts, seeded streams,
chats, streams their client leaves after the first event, malformed bodies, and tools this model's template cannot
take. Every request gets its answer: a greedy one the same tokens as alone, an error the OpenAI shape. Afterwards no
request is left in the engine and the process's memory is back near where it started (the same traffic once
before, to fill the allocators' pools)."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from pathlib import Path

import httpx
from conftest import MODEL, TIMEOUT, native_chat_pipeline, serving

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.server.access import Access

REQUESTS = 600
IN_FLIGHT = 16
PROMPTS = ["w1 w2 w3", "w5 w9", "w7 w7 w7 w1", "w30 w2", "w11 w12 w13 w14"]


def resident_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


def test_an_hour_of_mixed_traffic_loses_no_request_and_no_memory() -> None:
    pipeline = native_chat_pipeline()
    alone = {p: pipeline.generate(p, GenerationConfig(max_new_tokens=8), "none").token_ids for p in PROMPTS}
    seeded = GenerationConfig(max_new_tokens=8, sampling=SamplingParams(temperature=0.8, seed=7))
    alone_seeded = {p: pipeline.generate(p, seeded, "none").token_ids for p in PROMPTS}
    rng = random.Random(0)
    with serving(pipeline, access=Access(request_timeout_s=30.0), max_running=8, max_waiting=64) as server:
        url = server.url
        outcomes: dict[str, int] = {}

        async def one(client: httpx.AsyncClient, kind: str, prompt: str) -> None:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
            if kind == "greedy":
                drafter = rng.choice(["none", "hybrid", "hybrid-suffix", "draft-model"])
                response = await client.post(f"{url}/v1/completions", json=body | {"drafter": drafter})
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0]["token_ids"] == alone[prompt]
            elif kind == "seeded-stream":
                sampled = body | {"temperature": 0.8, "seed": 7, "stream": True}
                async with client.stream("POST", f"{url}/v1/completions", json=sampled) as response:
                    events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
                assert response.status_code == 200 and events[-1] == "data: [DONE]"
                chunks = [json.loads(event[6:])["choices"] for event in events[:-1]]
                assert [t for choices in chunks if choices for t in choices[0]["token_ids"]] == alone_seeded[prompt]
            elif kind == "cancel":
                long = body | {"max_tokens": 200, "stream": True}
                async with client.stream("POST", f"{url}/v1/completions", json=long) as response:
                    async for _ in response.aiter_lines():
                        break  # the client goes away after the first event
            elif kind == "chat":
                chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 6}
                response = await client.post(f"{url}/v1/chat/completions", json=chat)
                assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] is not None
            else:  # malformed or unsupported: an OpenAI error, never a 5xx
                tools = [{"type": "function", "function": {"name": "f"}}]
                bad = rng.choice([b"{nope", json.dumps({"prompt": 3}).encode(), json.dumps({"messages": [
                    {"role": "user", "content": "w1"}], "tools": tools}).encode()])  # fmt: skip
                path = "chat/completions" if b"messages" in bad else "completions"
                response = await client.post(f"{url}/v1/{path}", content=bad)
                assert response.status_code == 400, response.text
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            outcomes[kind] = outcomes.get(kind, 0) + 1

        async def traffic() -> None:
            limit = asyncio.Semaphore(IN_FLIGHT)
            mix = ["greedy", "seeded-stream", "cancel", "chat", "bad"]
            kinds = rng.choices(mix, weights=[5, 2, 1, 1, 1], k=REQUESTS)

            async def paced(client: httpx.AsyncClient, kind: str, delay: float) -> None:
                await asyncio.sleep(delay)
                async with limit:
                    await one(client, kind, rng.choice(PROMPTS))

            delays, at = [], 0.0
            for _ in kinds:  # one request every 6 s on average, compressed 1000 times
                at += rng.expovariate(1 / 6.0) / 1000
                delays.append(at)
            async with httpx.AsyncClient(timeout=TIMEOUT) as client:
                await asyncio.gather(*(paced(client, kind, delay) for kind, delay in zip(kinds, delays, strict=True)))

        asyncio.run(traffic())  # warm-up of the allocator's pools, then the measured run
        gc.collect()
        before = resident_mb()
        outcomes.clear()
        asyncio.run(traffic())
        assert sum(outcomes.values()) == REQUESTS, outcomes
        scheduler, deadline = server.engine.scheduler, time.monotonic() + TIMEOUT
        while (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:
            time.sleep(0.05)  # cancelled requests leave at the next step
        assert not scheduler.running and not scheduler.waiting
        gc.collect()
        assert resident_mb() - before < 64, (before, resident_mb())
