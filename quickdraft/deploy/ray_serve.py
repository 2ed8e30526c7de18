"""``quickdraft serve --replicas N``: N quickdraft servers as a Ray Serve deployment behind one OpenAI endpoint.

Two deployments make the application:

- ``QuickdraftReplica``: a whole quickdraft server (engine, loop, app: ``server/setup.py``), on ``threads`` cores
  of its own (a Ray actor reserving that many CPUs). N of them, or between N and ``max_replicas`` with Ray's
  autoscaling. Ray Serve health-checks each (``check_health``: its loop is stepping) and starts a new one for
  one that dies.
- ``QuickdraftIngress``: takes HTTP (Ray's proxy, on ``host:port``) and hands each request's method, path and
  body to a replica, chosen by ``ray_router.ConversationRouter`` from the request's affinity key, then relays
  the replica's response as it comes (``asgi.py``). So the API, its errors, streaming and cancellation are the
  single server's. A replica lost before it sent anything is retried once on another; one lost mid-stream ends
  the stream with an OpenAI-style error event (a whole response: a 503), never a hang.

``/health`` answers 200 while at least one replica runs (its body counts them); ``/metrics`` is the ingress's
Prometheus text (requests, retries, replica failures, running replicas); each replica's engine metrics are
Ray's to collect.
"""

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError

from quickdraft.deploy import ray_cluster
from quickdraft.deploy.asgi import ResponseStart, call_app
from quickdraft.deploy.router import affinity_key
from quickdraft.errors import ConfigError
from quickdraft.server.access import READ, check_media, read_body
from quickdraft.server.errors import add_error_handlers, shutting_down
from quickdraft.server.protocol import ApiError
from quickdraft.server.responses_api import KEPT_RESPONSE, chat_request, no_kept_response
from quickdraft.server.setup import ServerOptions, build_server

APP_NAME = "quickdraft"
REPLICA = "QuickdraftReplica"
INGRESS_REQUESTS = 4096  # requests the ingress relays at once (the replicas queue them)
STATUS_TTL_S = 1.0  # how long the ingress trusts what it last read of the replicas' states
WAIT_NOTE_S = 20.0  # while the replicas start, how often to say what Ray waits for
PROXY_FLUSH_S = 1.0  # after the last request's relay ends, before the deployment stops: the proxy passes it on


@dataclass(frozen=True)
class DeploymentOptions:
    """How many replicas, on how many cores each, where."""

    replicas: int
    threads: int  # per replica
    host: str = "127.0.0.1"
    port: int = 8000
    ray_address: str | None = None  # None: a Ray instance of this process's own
    max_replicas: int | None = None  # autoscaling between ``replicas`` and this
    target_ongoing_requests: int = 4  # autoscaling's target per replica
    max_ongoing_requests: int = 32  # a replica's share before Ray sends requests elsewhere (its max_running)
    max_waiting: int = 256  # a replica's waiting queue (its --max-waiting): Ray's queue holds that many per replica

    def max_queued_requests(self) -> int:
        """Requests Ray's queue may hold for the replicas before the next is answered 429, as one server's is: each
        replica's slots and waiting queue (Ray counts a burst's requests as queued until its router assigns them,
        so a bound of the waiting queues alone refused bursts that the slots could take)."""
        return (self.max_waiting + self.max_ongoing_requests) * (self.max_replicas or self.replicas)

    def autoscaling(self) -> dict[str, Any] | None:
        if self.max_replicas is None or self.max_replicas == self.replicas:
            return None
        return {
            "min_replicas": self.replicas, "initial_replicas": self.replicas, "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests, "upscale_delay_s": 5, "downscale_delay_s": 30,
        }  # fmt: skip


class EngineReplica:
    """One quickdraft server in a Ray actor, its steps in a thread of their own."""

    def __init__(self, options: ServerOptions, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.server = build_server(options, own_thread=True)
        self.server.loop.start()

    async def handle(
        self, method: str, path: str, body: bytes, key: str | None = None, received: float | None = None
    ) -> AsyncIterator[ResponseStart | bytes]:
        """The server's response to one request: its start, then its body as it is sent (``key``: the router's;
        ``received``: when the ingress took it, Unix seconds, so its time limit counts its wait in Ray's queue)."""
        waited_s = 0.0 if received is None else time.time() - received
        async for part in call_app(self.server.app, method, path, body, waited_s):
            yield part

    def startup(self) -> tuple[list[str], list[str]]:
        """The model names it serves and what was done to get it ready (pairing, calibration, caches)."""
        return self.server.model_names, self.server.notes

    def check_health(self) -> None:
        if not self.server.loop.alive:
            raise RuntimeError("the replica's engine stopped stepping")

    def __del__(self) -> None:
        self.server.loop.stop(timeout=1.0)


def key_of(body: bytes, chat: bool, responses: bool = False) -> str | None:
    """The request's affinity key; a Responses request's is that of the chat request it means."""
    try:
        parsed = json.loads(body)
        if responses:
            parsed = chat_request(parsed)[0]
    except (ValueError, RecursionError, ApiError):  # not JSON, nested too deeply to read, or not a request
        return None  # the replica answers the error
    return affinity_key(parsed, chat) if isinstance(parsed, dict) else None


ingress_app = FastAPI(title="quickdraft (Ray Serve)")


add_error_handlers(ingress_app)  # an unknown path or method answered as a replica answers it


@serve.deployment(
    name="QuickdraftIngress", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=INGRESS_REQUESTS
)
@serve.ingress(ingress_app)
class Ingress:
    def __init__(self, replicas: Any, sizes: tuple[int, int], max_body_bytes: int) -> None:
        self.replicas = replicas
        self.max_body_bytes = max_body_bytes  # a body over it is refused as it arrives, as a replica would
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("quickdraft_ingress_requests", "requests by outcome", ["outcome"], registry=registry)
        self.retries = Counter(
            "quickdraft_ingress_retries",
            "requests sent again after a replica failed before answering",
            registry=registry,
        )
        self.failures = Counter(
            "quickdraft_ingress_replica_failures", "replicas lost while serving a request", registry=registry
        )
        self.running = Gauge("quickdraft_replicas_running", "replicas running", registry=registry)
        self.sizes = sizes  # the replicas asked for: (min, max), equal without autoscaling
        self._status: tuple[float, int] = (0.0, 0)  # when read, replicas running
        self.in_flight = 0  # requests sent on and not yet answered to their end
        self.draining = False

    async def drain(self, timeout_s: float) -> int:
        """Take no more requests (503 ``shutting_down``) and wait up to ``timeout_s`` for those in flight; returns
        how many are still running then."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(PROXY_FLUSH_S)  # a finished relay's last bytes may still be in Ray's proxy
        return self.in_flight

    def running_replicas(self) -> int:
        """Replicas running, from Ray Serve's status (read at most once a second)."""
        read_at, running = self._status
        if time.monotonic() - read_at > STATUS_TTL_S:
            deployment = serve.status().applications[APP_NAME].deployments[REPLICA]
            running = int(deployment.replica_states.get("RUNNING", 0))
            self._status = (time.monotonic(), running)
            self.running.set(running)
        return running

    @ingress_app.api_route("/health", methods=list(READ))
    async def health(self) -> JSONResponse:
        running = await asyncio.to_thread(self.running_replicas)
        if running < 1:
            raise ApiError(503, "no replica is running", kind="server_error")
        if self.draining:
            raise shutting_down()
        low, high = self.sizes
        return JSONResponse({"status": "ok", "replicas": running, "min_replicas": low, "max_replicas": high})

    @ingress_app.api_route("/metrics", methods=list(READ))
    async def metrics(self) -> Response:
        await asyncio.to_thread(self.running_replicas)
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    @ingress_app.api_route("/v1/models", methods=list(READ))
    async def models(self) -> Response:
        return await self.forward("GET", "/v1/models", b"", None, time.time())

    @ingress_app.api_route("/v1/models/{name:path}", methods=list(READ))
    async def one_model(self, name: str) -> Response:
        return await self.forward("GET", f"/v1/models/{name}", b"", None, time.time())

    @ingress_app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        received, body = await self.read(request)
        return await self.forward("POST", "/v1/completions", body, key_of(body, chat=False), received)

    @ingress_app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        received, body = await self.read(request)
        return await self.forward("POST", "/v1/chat/completions", body, key_of(body, chat=True), received)

    @ingress_app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        received, body = await self.read(request)
        return await self.forward("POST", "/tokenize", body, None, received)

    @ingress_app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        received, body = await self.read(request)
        return await self.forward("POST", "/detokenize", body, None, received)

    @ingress_app.api_route(KEPT_RESPONSE, methods=["GET", "HEAD", "POST", "DELETE"])
    async def a_kept_response(self, response_id: str) -> Response:
        raise no_kept_response(response_id)

    @ingress_app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        received, body = await self.read(request)
        return await self.forward("POST", "/v1/responses", body, key_of(body, chat=True, responses=True), received)

    async def read(self, request: Request) -> tuple[float, bytes]:
        """When the request arrived and its body, checked as a replica checks it first (its media type, its size)."""
        check_media(request)
        return time.time(), await read_body(request, self.max_body_bytes)

    async def forward(self, method: str, path: str, body: bytes, key: str | None, received: float) -> Response:
        """Send to a replica; once more to another if it is lost before it answers; relay what it sends.
        ``received``: when the request arrived (Unix seconds), from which the replica counts its time limit."""
        if self.draining:
            raise shutting_down("the server is shutting down: send the request again later")
        self.in_flight += 1
        try:
            return await self.send(method, path, body, key, received)
        except BaseException:
            self.in_flight -= 1
            raise

    async def send(self, method: str, path: str, body: bytes, key: str | None, received: float) -> Response:
        for attempt in (1, 2):
            parts = self.replicas.options(stream=True).handle.remote(method, path, body, key=key, received=received)
            try:
                start = await parts.__anext__()
                break
            except BackPressureError:  # Ray's queue for the replicas is full: as one server's full queue
                self.requests.labels("429").inc()
                message = "the server's queue is full; retry later"
                raise ApiError(429, message, kind="rate_limit_error", code="queue_full") from None
            except RayError:
                self.failures.inc()
                parts.cancel()
                if attempt == 2:
                    self.requests.labels("unavailable").inc()
                    raise ApiError(503, "no replica could take the request; try again", kind="server_error") from None
                self.retries.inc()
        assert isinstance(start, ResponseStart)
        self.requests.labels(str(start.status)).inc()
        media_type = start.header("content-type") or "application/json"
        return StreamingResponse(
            self.relay(parts, media_type.startswith("text/event-stream")), status_code=start.status,
            media_type=media_type,
        )  # fmt: skip

    async def relay(self, parts: Any, streamed: bool) -> AsyncIterator[bytes]:
        try:
            async for part in parts:
                yield part
        except RayError:
            self.failures.inc()
            failure = ApiError(503, "the replica serving this request was lost; send it again", kind="server_error")
            if streamed:
                yield f"data: {json.dumps(failure.body())}\n\ndata: [DONE]\n\n".encode()
        finally:
            parts.cancel()  # a client gone: the replica's app hears it and cancels the request
            self.in_flight -= 1


def deploy(server: ServerOptions, options: DeploymentOptions, note: Callable[[str], None] = print) -> None:
    """Start (or join) Ray, then run the application; returns once it is up. While Ray waits to place or start the
    replicas, ``note`` hears what it waits for every ``WAIT_NOTE_S``; replicas that cannot start raise
    ``ConfigError`` with their reason, as does a cluster whose Serve listens elsewhere than asked."""
    from ray.serve.config import RequestRouterConfig

    ray_cluster.join(options.ray_address)
    cpus = ray.cluster_resources().get("CPU", 0.0)
    if options.ray_address is None and options.replicas * options.threads > cpus:  # our own Ray: nothing adds CPUs
        raise ConfigError(
            f"{options.replicas} replicas of {options.threads} thread(s) need {options.replicas * options.threads} "
            f"CPUs; this machine has {cpus:g}: lower --replicas or --threads-per-replica"
        )
    serve.start(http_options={"host": options.host, "port": options.port})
    check_http(options)
    replica = serve.deployment(
        EngineReplica,
        name=REPLICA,
        num_replicas=None if options.autoscaling() else options.replicas,
        autoscaling_config=options.autoscaling(),
        ray_actor_options={"num_cpus": options.threads},
        max_ongoing_requests=options.max_ongoing_requests,
        max_queued_requests=options.max_queued_requests(),
        health_check_period_s=5,
        health_check_timeout_s=60,
        request_router_config=RequestRouterConfig(
            request_router_class="quickdraft.deploy.ray_router:ConversationRouter"
        ),
    ).bind(server, options.threads)
    sizes = (options.replicas, options.max_replicas or options.replicas)
    ingress = Ingress.bind(replica, sizes, server.access.max_body_bytes)
    serve.run_many([serve.RunTarget(ingress, name=APP_NAME, route_prefix="/")], wait_for_applications_running=False)
    wait_running(note)


def check_http(options: DeploymentOptions) -> None:
    """A cluster's Serve, once started, keeps its host and port (Ray ignores ours with a warning): refuse to run
    where the endpoint would not be the one asked for."""
    try:
        from ray.serve.context import _get_global_client  # Ray's own record of what its proxies listen on

        config = _get_global_client().http_config
    except (ImportError, AttributeError, RayError):  # Ray's internals moved: nothing to check against
        return
    if (config.host, config.port) != (options.host, options.port):
        raise ConfigError(
            f"Ray Serve on this cluster already listens on {config.host}:{config.port}, and keeps it: run with "
            f"--host {config.host} --port {config.port}, or stop Serve there first (`serve shutdown`)"
        )


def wait_running(note: Callable[[str], None]) -> None:
    """Until the application runs; what Ray waits for is noted every ``WAIT_NOTE_S`` (replicas it cannot place
    wait for CPUs), and replicas that fail to start raise ``ConfigError`` with the exception they raised."""
    started = noted = time.monotonic()
    while (status := serve.status().applications.get(APP_NAME)) is None or status.status != "RUNNING":
        replicas = None if status is None else status.deployments.get(REPLICA)
        message = "" if replicas is None else replicas.message
        if status is not None and status.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise ConfigError(f"the replicas did not start: {failure_reason(message or status.message)}")
        if time.monotonic() - noted > WAIT_NOTE_S:
            noted = time.monotonic()
            waiting = " ".join(message.split()) or "replicas to start"
            note(f"quickdraft: waited {noted - started:.0f} s; Ray waits for: {waiting}")
        time.sleep(0.5)


def failure_reason(message: str) -> str:
    """The exception that ended Ray's message about a replica that failed to start, without its module."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Interrupt|Exit)\b[^:]*:", line)]
    if not raised:
        return lines[-1] if lines else "Ray gave no reason (see its logs under /tmp/ray/session_latest/logs)"
    return re.sub(r"^[\w.]*\.(\w+):", r"\1:", raised[-1])


def startup() -> tuple[list[str], list[str]]:
    """A running replica's model names and startup notes (the replicas are alike: one speaks for all)."""
    replica = serve.get_deployment_handle(REPLICA, APP_NAME)
    return replica.startup.remote().result(timeout_s=60)


def drain(timeout_s: float, note: Callable[[str], None] = print) -> int | None:
    """Stop taking requests and give those in flight up to ``timeout_s`` to finish; how many were left (None: the
    application is not up, as when stopped while it started, or the ingress could not be asked: ``note`` hears
    why)."""
    try:
        ingress = serve.get_deployment_handle("QuickdraftIngress", APP_NAME)
        return int(ingress.drain.remote(timeout_s).result(timeout_s=timeout_s + 30))
    except Exception as error:  # Ray's errors: of an application that is not running, nothing to drain
        with contextlib.suppress(Exception):  # Ray itself may be going
            if (status := serve.status().applications.get(APP_NAME)) is not None and status.status == "RUNNING":
                note(f"quickdraft: the requests in flight could not be drained ({type(error).__name__}: {error})")
        return None


def shutdown(joined: bool) -> None:
    """Stop quickdraft's application: on a cluster it ``joined`` (``--ray-address``), that application only, leaving
    the cluster's others; else Serve and the Ray it started."""
    if not ray.is_initialized():  # Ray never started: nothing to stop (serve.shutdown would start one)
        return
    if joined:
        serve.delete(APP_NAME)
    else:
        serve.shutdown()
    ray.shutdown()
