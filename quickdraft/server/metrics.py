"""Prometheus metrics of the server: its queue, latencies, tokens and speculation (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from quickdraft.engine import Engine, StepReport

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_TIME_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
GAMMA_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class ServerMetrics:
    """One registry per server (tests run several in a process)."""

    def __init__(self, engine: Engine) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
        scheduler = engine.scheduler
        running = Gauge("quickdraft_requests_running", "Requests decoding or reading their prompt", registry=registry)
        running.set_function(lambda: len(scheduler.running))
        waiting = Gauge("quickdraft_requests_waiting", "Requests queued for a free slot", registry=registry)
        waiting.set_function(lambda: scheduler.num_waiting)
        self.time_to_first_token = Histogram(
            "quickdraft_time_to_first_token_seconds", "From arrival to the first token", buckets=LATENCY_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.time_per_output_token = Histogram(
            "quickdraft_time_per_output_token_seconds", "After the first token, per further token",
            buckets=TOKEN_TIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.e2e_latency = Histogram(
            "quickdraft_e2e_request_latency_seconds", "From arrival to the last token", buckets=LATENCY_BUCKETS,
            registry=registry,
        )  # fmt: skip
        finished = "Finished requests (each of a request's n choices is one) by finish reason"
        self.requests = Counter("quickdraft_requests", finished, ["finish_reason"], registry=registry)
        self.prompt_tokens = Counter("quickdraft_prompt_tokens", "Prompt tokens read", registry=registry)
        self.generated_tokens = Counter("quickdraft_generation_tokens", "Tokens generated", registry=registry)
        self.drafts_proposed = Counter("quickdraft_draft_tokens_proposed", "Drafted tokens verified", registry=registry)
        self.drafts_accepted = Counter("quickdraft_draft_tokens_accepted", "Drafted tokens accepted", registry=registry)
        self.gamma = Histogram(
            "quickdraft_gamma_chosen", "Drafts chosen per request and step", buckets=GAMMA_BUCKETS, registry=registry
        )
        self.batch_size = Histogram(
            "quickdraft_batch_size", "Decoding requests per step", buckets=BATCH_BUCKETS, registry=registry
        )
        if (prefix_cache := engine.prefix_cache) is not None:
            stats = prefix_cache.stats
            for name, text, value in [
                ("lookups", "Requests that looked for a cached prefix", lambda: stats.lookups),
                ("hits", "Requests that took a cached prefix over", lambda: stats.hits),
                ("cached_tokens", "Prompt tokens not read thanks to a cached prefix", lambda: stats.cached_tokens),
                ("kept_tokens", "Tokens whose keys and values the prefix cache keeps", lambda: prefix_cache.tokens),
            ]:
                Gauge(f"quickdraft_prefix_cache_{name}", text, registry=registry).set_function(value)
        self.step_seconds = Histogram(
            "quickdraft_step_seconds", "Time of one batched step", buckets=TOKEN_TIME_BUCKETS, registry=registry
        )

    def observe_step(self, report: StepReport) -> None:
        """Called on the engine's thread after every step."""
        self.prompt_tokens.inc(report.prefill_tokens)
        self.generated_tokens.inc(report.new_tokens)
        self.drafts_proposed.inc(report.proposed)
        self.drafts_accepted.inc(report.accepted)
        for gamma in report.gammas:
            self.gamma.observe(gamma)
        if report.decoding:
            self.batch_size.observe(report.decoding)
        self.step_seconds.observe(report.seconds)

    def observe_failure(self) -> None:
        """A request that could not finish (``finish_reason="error"``; no latencies: it has none to tell)."""
        self.requests.labels(finish_reason="error").inc()

    def observe_request(self, finish_reason: str, ttft_s: float | None, e2e_s: float, num_tokens: int) -> None:
        self.requests.labels(finish_reason=finish_reason).inc()
        self.e2e_latency.observe(e2e_s)
        if ttft_s is not None:
            self.time_to_first_token.observe(ttft_s)
            if num_tokens > 1:
                self.time_per_output_token.observe((e2e_s - ttft_s) / (num_tokens - 1))
