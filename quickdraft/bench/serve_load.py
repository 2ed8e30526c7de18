"""The load test of ``quickdraft serve``: the official openai client (AsyncOpenAI), Poisson arrivals, streaming.

A *run* sends the same prompts (Spec-Bench first turns, or recorded agent calls: see ``bench/workloads.py``), with
the same arrival times, under one served configuration (a drafter and a policy, sent per request as
``extra_body``) at one request rate: ``seq`` is one user who sends the next request when the last one ended,
``inf`` sends them all at once, a number is the mean requests per second of Poisson arrivals. Requests are greedy
or sample at the run's temperature (with its seed); quickdraft's ask for their token ids, which greedy and seeded
runs compare with single-request plain decoding (the lossless check). A configuration may also be llama.cpp's
server on the same GGUF files.
Requests run on loopback only and each is bounded by a timeout.

Tokens are counted from the standard ``usage`` (``stream_options.include_usage``) and the time to first token
runs to the first chunk with text, so any OpenAI-compatible server can be load-tested (``--url``); quickdraft's
token ids serve the lossless check only.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from quickdraft.bench.base import GREEDY
from quickdraft.bench.metrics import percentile
from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError, QuickdraftError
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.policies import parse_policy

PEER_SERVER = "llama-server"


@dataclass(frozen=True)
class ServedConfig:
    """``NAME=DRAFTER[+POLICY][:cache]``: what every request of a run asks quickdraft's server for; or
    ``NAME=llama-server[:draft][:cache]``: llama.cpp's server, started for this configuration, plain or with its
    draft-model speculation (``drafter`` is then ``draft-model``). ``:cache``: the requests may reuse cached
    prompts (``cache_prompt``, both servers' name), which earlier runs of the same prompts left."""

    name: str
    drafter: str
    policy: str | None = None
    server: str = "quickdraft"  # or PEER_SERVER
    prompt_cache: bool = False

    @classmethod
    def parse(cls, text: str) -> ServedConfig:
        name, equals, spec = text.partition("=")
        spec, cached = (spec.removesuffix(":cache"), True) if spec.endswith(":cache") else (spec, False)
        if equals and name and spec.split(":")[0] == PEER_SERVER:
            options = spec.split(":")[1:]
            if options not in ([], ["draft"]):
                raise ConfigError(f"a llama-server configuration is NAME=llama-server[:draft][:cache], got {text!r}")
            drafter = "draft-model" if options else "none"
            return cls(name, drafter, server=PEER_SERVER, prompt_cache=cached)
        drafter, _, policy = spec.partition("+")
        if not equals or not name or not drafter:
            raise ConfigError(
                f"a configuration is NAME=DRAFTER[+POLICY][:cache] (plain=none, fixed=draft-model+fixed:3) or "
                f"NAME=llama-server[:draft][:cache], got {text!r}"
            )
        try:  # checked here, before any server starts or model loads
            DRAFTERS.get(drafter)
            if policy:
                parse_policy(policy)
        except QuickdraftError as error:
            raise ConfigError(f"configuration {text!r}: {error}") from None
        return cls(name, drafter, policy or None, prompt_cache=cached)

    @property
    def is_peer(self) -> bool:
        return self.server == PEER_SERVER

    def extra_body(self) -> dict[str, Any]:
        if self.is_peer:
            return {"cache_prompt": self.prompt_cache}
        body: dict[str, Any] = {"drafter": self.drafter, "return_token_ids": True, "cache_prompt": self.prompt_cache}
        if self.policy is not None:
            body["policy"] = self.policy
        return body


@dataclass(frozen=True)
class Prompt:
    """One request of a run: a Spec-Bench first turn (``text``, sent as the one user message), or a recorded chat
    (the agent workload: ``messages`` with its ``tools`` and ``tool_choice``) sent as it was recorded.
    ``max_tokens``: its own limit; None: the run's."""

    question_id: str
    category: str
    text: str = ""
    messages: tuple[Mapping[str, Any], ...] = ()
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: Any = None  # sent only with tools
    max_tokens: int | None = None

    def chat(self) -> dict[str, Any]:
        """The request's ``messages`` (and ``tools``, ``tool_choice``) as the openai client takes them: copies."""
        messages = self.messages or ({"role": "user", "content": self.text},)
        fields: dict[str, Any] = {"messages": copy.deepcopy(list(messages))}
        if self.tools:
            fields["tools"] = copy.deepcopy(list(self.tools))
            if self.tool_choice is not None:
                fields["tool_choice"] = copy.deepcopy(self.tool_choice)
        return fields


@dataclass
class RequestRecord:
    """One request of a run, as its client saw it (seconds from when it was sent)."""

    index: int
    question_id: str
    sent_s: float  # when it was sent, from the run's start
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_ids: list[int] = field(default_factory=list)  # quickdraft's return_token_ids (other servers: none)
    completion_tokens: int | None = None  # the standard usage's count (stream_options.include_usage)
    finish_reason: str | None = None
    error: str | None = None
    disconnected: bool = False  # this client closed its stream on purpose


def output_tokens(record: RequestRecord) -> int:
    """The request's tokens as the server's usage counts them; quickdraft's token ids where it sent no usage."""
    return record.completion_tokens if record.completion_tokens is not None else len(record.token_ids)


def parse_rate(text: str) -> float:
    """``seq`` (one user at a time: 0), ``inf`` (all at once) or requests per second."""
    if text == "seq":
        return 0.0
    try:
        rate = float(text)
    except ValueError:
        raise ConfigError(f"a rate is seq, inf or requests per second, got {text!r}") from None
    if not rate > 0:
        raise ConfigError(f"a request rate must be > 0, got {text!r}")
    return rate


def request_failure(error: Exception) -> ConfigError:
    """The one line for a failed request outside a run's records (the warm-up, /metrics): the run cannot go on."""
    import httpx
    import openai

    request = getattr(error, "request", None)  # openai's errors and httpx's carry the request
    server = f"{request.url.scheme}://{request.url.netloc.decode()}" if request is not None else "the server"
    if isinstance(error, openai.APIStatusError):
        return ConfigError(f"the server at {server} refused a request with status {error.status_code}: {error.message}")
    if isinstance(error, (openai.APITimeoutError, httpx.TimeoutException)):
        return ConfigError(f"the server at {server} did not answer in time (--timeout)")
    if isinstance(error, (openai.APIConnectionError, httpx.TransportError)):
        return ConfigError(f"cannot reach the server at {server} ({error.__cause__ or error}): is it running?")
    return ConfigError(f"a request to the server at {server} failed: {type(error).__name__}: {error}")


def check_reachable(url: str) -> None:
    """Fail now, before any model loads, if nothing answers at ``url`` (any HTTP answer will do)."""
    import httpx

    try:
        httpx.get(url, timeout=10)
    except httpx.HTTPError as error:
        raise request_failure(error) from None


def arrival_times(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the start at which the requests are sent: Poisson arrivals at ``rate`` (inf: all at 0)."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    return list(itertools.accumulate((rng.expovariate(rate) for _ in range(count)), initial=0.0))[:count]


async def one_request(
    client: Any,
    model: str,
    prompt: Prompt,
    config: ServedConfig,
    max_tokens: int,
    record: RequestRecord,
    start: float,
    timeout_s: float,
    disconnect_after: int | None = None,
    sampling: SamplingParams = GREEDY,
) -> None:
    """Stream one chat completion into ``record``; ``disconnect_after`` chunks with text, close the stream."""
    sent = time.perf_counter()
    record.sent_s = sent - start
    try:
        async with asyncio.timeout(timeout_s):
            stream = await client.chat.completions.create(
                model=model,
                **prompt.chat(),
                max_tokens=prompt.max_tokens or max_tokens,
                temperature=sampling.temperature,
                seed=sampling.seed,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=config.extra_body(),
            )
            chunks = 0
            async for chunk in stream:
                if chunk.usage is not None:
                    record.completion_tokens = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                token_ids = getattr(choice, "token_ids", None) or []
                delta = choice.delta
                content = bool(delta.content or delta.tool_calls) if delta is not None else False  # calls: text too
                if (content or token_ids) and record.ttft_s is None:  # the first token's text (any server)
                    record.ttft_s = time.perf_counter() - sent
                record.token_ids += token_ids
                record.finish_reason = choice.finish_reason or record.finish_reason
                chunks += content or bool(token_ids)
                if disconnect_after is not None and chunks >= disconnect_after:
                    record.disconnected = True
                    await stream.close()
                    break
    except Exception as error:  # a failed request is recorded, never lost
        record.error = f"{type(error).__name__}: {error}"
    record.e2e_s = time.perf_counter() - sent


async def run_load(
    client: Any,
    model: str,
    prompts: Sequence[Prompt],
    config: ServedConfig,
    rate: float,
    max_tokens: int,
    seed: int,
    timeout_s: float,
    disconnect_fraction: float = 0.0,
    sampling: SamplingParams = GREEDY,
) -> tuple[list[RequestRecord], float]:
    """Send every prompt once under ``config`` at ``rate`` (0: one user at a time); the records and wall time."""
    rng = random.Random(seed + 1)
    disconnects = {i for i in range(len(prompts)) if rng.random() < disconnect_fraction}
    records = [RequestRecord(i, prompt.question_id, 0.0) for i, prompt in enumerate(prompts)]
    start = time.perf_counter()

    async def send(i: int, at: float) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        after = rng.randint(1, 8) if i in disconnects else None
        await one_request(client, model, prompts[i], config, max_tokens, records[i], start, timeout_s, after, sampling)

    if rate == 0:
        for i in range(len(prompts)):
            await send(i, 0.0)
    else:
        await asyncio.gather(*(send(i, at) for i, at in enumerate(arrival_times(len(prompts), rate, seed))))
    return records, time.perf_counter() - start


def summarize_run(
    records: list[RequestRecord], wall_s: float, references: dict[str, list[int]] | None
) -> dict[str, Any]:
    """Throughput, TTFT, time per output token and end-to-end latency (mean, p50, p90, p99) of the completed
    requests, how many failed, and how many match single-request plain decoding token for token."""
    done = [r for r in records if r.error is None and not r.disconnected and r.finish_reason is not None]
    tokens = sum(output_tokens(r) for r in done)
    tpot = [(r.e2e_s - r.ttft_s) / (output_tokens(r) - 1) for r in done if r.ttft_s and output_tokens(r) > 1]  # type: ignore[operator]
    summary: dict[str, Any] = {
        "requests": len(records),
        "completed": len(done),
        "disconnected": sum(r.disconnected for r in records),
        "errors": [r.error for r in records if r.error is not None],
        "wall_s": wall_s,
        "output_tokens": tokens,
        "throughput_tok_s": tokens / wall_s if wall_s > 0 else None,
        "ttft_s": distribution([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_s": distribution(tpot),
        "e2e_s": distribution([r.e2e_s for r in done if r.e2e_s is not None]),
    }
    if references is not None:
        compared = [r for r in done if r.question_id in references]
        summary["lossless"] = sum(r.token_ids == references[r.question_id] for r in compared)
        summary["compared"] = len(compared)
    return summary


def distribution(values: list[float]) -> dict[str, float | None]:
    mean = sum(values) / len(values) if values else None
    return {"mean": mean, **{f"p{q}": percentile(values, q / 100) for q in (50, 90, 99)}}


def record_json(record: RequestRecord) -> dict[str, Any]:
    data = asdict(record)
    data.pop("token_ids")
    data["num_tokens"] = output_tokens(record)
    return data
