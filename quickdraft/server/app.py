"""``quickdraft serve``'s HTTP side: an OpenAI-compatible FastAPI app over the batched engine's loop
(completions, chat completions, and the Responses API over the chat path: :mod:`quickdraft.server.responses_api`).

Handlers parse and validate a request, submit it to the :class:`ServingLoop` (whose one thread runs every
step) and read its events from an asyncio queue the loop's thread feeds. A streamed request is cancelled
when its client goes away (Starlette stops the stream); a whole one when its client is found gone while it
waits. Every error a client can cause is an OpenAI-style JSON error with its status, never a 500; a failure of
the server's own is a JSON 500 (its traceback in the server's log), and the connection stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import time
from asyncio import Queue
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from quickdraft.api import Pipeline
from quickdraft.engine import Event, GenerationResult, QueueFull, RequestFailed, RequestFinished, TokenDelta
from quickdraft.errors import QuickdraftError
from quickdraft.server.access import OPEN, WAITED, Access, read_json
from quickdraft.server.errors import failure, shutting_down
from quickdraft.server.loop import ServerStopping, ServingLoop
from quickdraft.server.metrics import ServerMetrics
from quickdraft.server.protocol import ApiError, ApiRequest, ServerDefaults, parse_request
from quickdraft.server.responses import chunk_body, logprobs_body, new_id, response_body, usage_chunk
from quickdraft.server.responses_api import chat_request, renamed
from quickdraft.server.responses_output import new_response_id, output_items, response_object, stream_events
from quickdraft.server.tokenize import detokenize, tokenize
from quickdraft.server.tools import CallFilter, split_calls
from quickdraft.vocabularies import token_pieces

DISCONNECT_POLL_S = 0.5  # how often a waiting non-streamed request checks that its client is still there
LOG = logging.getLogger("quickdraft.server")


def create_app(
    pipeline: Pipeline,
    loop: ServingLoop,
    defaults: ServerDefaults,
    access: Access = OPEN,
) -> FastAPI:
    """The app; it starts ``loop`` when the server starts and stops it when the server stops. ``access``: who may
    use it and how much a request may ask (:mod:`quickdraft.server.access`)."""
    metrics = ServerMetrics(loop.engine)
    loop.engine.on_step = metrics.observe_step
    defaults = dataclasses.replace(defaults, max_context=pipeline.target.max_context)
    template = getattr(pipeline.tokenizer, "chat_template", None)
    chat_template = template if isinstance(template, str) else ""  # tools need its tool-call format

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(ServerFailures)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        body = ApiError(error.status_code, str(error.detail)).body()  # its headers kept: a 405's Allow
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not loop.alive:
            raise ApiError(503, "the engine is not running", kind="server_error")
        if loop.draining:  # a load balancer sends no more requests here
            raise shutting_down()
        return JSONResponse({"status": "ok"})

    started = int(time.time())
    entries = {name: {"id": name, "object": "model", "created": started, "owned_by": "quickdraft"} for name in
               defaults.model_names}  # fmt: skip

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        access.authorize(request.headers.get("authorization"))
        return {"object": "list", "data": list(entries.values())}

    @app.get("/v1/models/{name:path}")
    async def one_model(request: Request, name: str) -> dict[str, Any]:
        access.authorize(request.headers.get("authorization"))
        if name not in entries:
            raise ApiError(404, f"the model {name!r} does not exist", "model", code="model_not_found")
        return entries[name]

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        access.authorize(request.headers.get("authorization"), metrics=True)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @functools.cache
    def spell(token_id: int) -> tuple[str, bytes]:
        """A token's text and its own bytes (logprobs' ``bytes``: a byte token's is not its text's U+FFFD)."""
        pieces = vocabulary_pieces()
        text = pipeline.tokenizer.decode([token_id])
        return text, pieces[token_id] if token_id < len(pieces) and pieces[token_id] else text.encode()

    @functools.cache
    def vocabulary_pieces() -> list[bytes]:  # [V], made on the first request for logprobs
        return token_pieces(pipeline.tokenizer)

    def encode(prompt: Any, chat: bool, tools: Any = None) -> list[int]:
        if chat:
            return pipeline.encode_chat(prompt, tools)
        if isinstance(prompt, list):  # token ids
            if any(not 0 <= token < pipeline.target.vocab_size for token in prompt):
                raise ApiError(400, f"token ids must be in [0, {pipeline.target.vocab_size})", "prompt")
            return list(prompt)
        return pipeline.encode(prompt)

    async def start(request: Request, chat: bool, translate: Any = None) -> tuple[Any, ApiRequest, Queue, Tracker]:
        """Read, check and submit a request: (its body, the parsed request, its events, its tracker). ``translate``:
        the body (of another API) -> the chat body it means, and what else its answer needs."""
        arrival = time.perf_counter() - request.scope.get(WAITED, 0.0)  # a replica's request waited in Ray's queue
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes)
        translated, extra = translate(body) if translate is not None else (body, None)
        try:
            api = await asyncio.to_thread(  # tokenizing a long prompt takes seconds: not on the event loop
                parse_request, translated, chat, defaults, encode, pipeline.drafter, chat_template
            )
        except ApiError as error:
            raise error if translate is None else renamed(error) from None
        if not loop.alive:
            raise ApiError(503, "the engine is not running", kind="server_error")
        events: asyncio.Queue[Event] = asyncio.Queue()
        event_loop = asyncio.get_running_loop()
        track = Tracker(arrival, metrics, access.request_timeout_s)

        def deliver(event: Event) -> None:  # on the event loop; timed even after a client went away
            track.see(event)
            events.put_nowait(event)

        def sink(event: Event) -> None:  # on the engine's thread
            with contextlib.suppress(RuntimeError):  # the caller's event loop closed: no one is left to tell
                event_loop.call_soon_threadsafe(deliver, event)

        try:  # in a worker thread: compiling a grammar can take a second, and would stall every other client
            await asyncio.to_thread(loop.submit, api.serve, sink)
        except QueueFull as error:
            raise ApiError(429, str(error), kind="rate_limit_error", code="queue_full") from None
        except ServerStopping as error:
            raise shutting_down(str(error)) from None
        except QuickdraftError as error:  # the prompt does not fit, a policy the server cannot run, ...
            raise ApiError(400, str(error)) from None
        return extra, api, events, track

    async def generate(request: Request, chat: bool) -> Response:
        _, api, events, track = await start(request, chat)
        if api.stream:
            return StreamingResponse(stream(api, events, track, loop.cancel), media_type="text/event-stream")
        result = await whole(request, api, events, track)
        return JSONResponse(response_body(api, new_id(chat), result, spell))

    async def whole(request: Request, api: ApiRequest, events: Queue, track: Tracker) -> GenerationResult:
        try:
            return await collect(request, events, track)
        finally:
            if not track.done:
                loop.cancel(api.serve.request_id)

    async def cancelled_when_left(texts: AsyncIterator[str], api: ApiRequest, track: Tracker) -> AsyncIterator[str]:
        try:
            async for text in texts:
                yield text
        finally:
            if not track.done:  # the client went away: free the request's slot at the next step
                loop.cancel(api.serve.request_id)

    async def stream(
        api: ApiRequest, events: asyncio.Queue[Event], track: Tracker, cancel: Callable[[str], None]
    ) -> AsyncIterator[str]:
        response_id = new_id(api.chat)
        offset = 0  # completions' text_offset: characters of the tokens streamed so far
        calls = CallFilter() if api.tools else None  # holds back what may open a tool call
        try:
            if api.chat:
                yield sse(chunk_body(api, response_id, None))
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), track.seconds_left())
                except TimeoutError:
                    yield sse(track.timeout().body())
                    break
                logprobs = None
                if isinstance(event, TokenDelta) and event.logprobs:
                    logprobs = logprobs_body(api, event.logprobs, spell, offset)
                    offset += sum(len(token) for token in logprobs["tokens"]) if logprobs and not api.chat else 0
                if isinstance(event, TokenDelta):
                    text = event.text if calls is None else calls.feed(event.text)
                    if text or api.return_token_ids or logprobs:
                        yield sse(chunk_body(api, response_id, text, event.token_ids, logprobs=logprobs))
                elif isinstance(event, RequestFinished):
                    reason = event.result.finish_reason
                    if calls is not None and api.tools is not None:  # calls exists exactly when tools do
                        content, found = split_calls(calls.text, api.tools.names)
                        if content[calls.sent :] or found:  # the held text that was no call; the calls, whole
                            yield sse(chunk_body(api, response_id, content[calls.sent :], tool_calls=found))
                        reason = api.tools.finish_reason(reason, bool(found))
                    yield sse(chunk_body(api, response_id, "", (), reason))
                    if api.include_usage:
                        yield sse(usage_chunk(api, response_id, event.result))
                    break
                elif isinstance(event, RequestFailed):
                    yield sse(failure(event).body())
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not track.done:  # the client went away: free the request's slot at the next step
                cancel(api.serve.request_id)

    async def collect(request: Request, events: asyncio.Queue[Event], track: Tracker) -> GenerationResult:
        """The request's result, its client checked every ``DISCONNECT_POLL_S`` while it runs (events or not)."""
        check_at = time.monotonic() + DISCONNECT_POLL_S
        while True:
            left = track.seconds_left()
            wait_s = max(0.0, check_at - time.monotonic() if left is None else min(left, check_at - time.monotonic()))
            try:
                event = await asyncio.wait_for(events.get(), wait_s)
            except TimeoutError:
                if track.seconds_left() == 0:
                    raise track.timeout() from None
                event = None
            if time.monotonic() >= check_at:
                if await request.is_disconnected():
                    raise ApiError(499, "the client closed the connection") from None
                check_at = time.monotonic() + DISCONNECT_POLL_S
            if isinstance(event, RequestFinished):
                return event.result
            if isinstance(event, RequestFailed):
                raise failure(event)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes)
        names = defaults.model_names
        return JSONResponse(await asyncio.to_thread(tokenize, body, pipeline, names, chat_template, spell))

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> JSONResponse:
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes)
        return JSONResponse(await asyncio.to_thread(detokenize, body, pipeline, defaults.model_names))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        echo, api, events, track = await start(request, True, chat_request)
        if api.stream:
            texts = cancelled_when_left(stream_events(api, echo, events, track, spell), api, track)
            return StreamingResponse(texts, media_type="text/event-stream")
        result = await whole(request, api, events, track)
        output = output_items(api, result, spell)
        return JSONResponse(response_object(api, echo, new_response_id(), output, result))

    return app


class ServerFailures:
    """ASGI middleware: an exception no handler answered becomes a JSON 500 in OpenAI's shape, logged with its
    traceback, where Starlette's own last resort would answer and then re-raise it, closing the connection."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as error:
            if started:  # a response is under way: nothing else can be said on it
                raise
            LOG.exception("the server failed on a request to %s", scope.get("path"))
            failure = ApiError(500, f"the server failed on this request: {type(error).__name__}", kind="server_error")
            await JSONResponse(failure.body(), status_code=500)(scope, receive, send)


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


class Tracker:
    """A request's timings for the metrics: arrival, first token, end."""

    def __init__(self, arrival: float, metrics: ServerMetrics, timeout_s: float | None = None) -> None:
        self.arrival = arrival
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.first_token: float | None = None
        self.done = False

    def seconds_left(self) -> float | None:
        """Seconds until the request's timeout (0 once past it); None without one."""
        if self.timeout_s is None:
            return None
        return max(0.0, self.arrival + self.timeout_s - time.perf_counter())

    def timeout(self) -> ApiError:
        message = f"the request ran past this server's {self.timeout_s:g} s limit (--request-timeout)"
        return ApiError(504, message, kind="server_error", code="timeout")

    def see(self, event: Event) -> None:
        now = time.perf_counter()
        if isinstance(event, TokenDelta) and event.token_ids and self.first_token is None:
            self.first_token = now
        elif isinstance(event, RequestFinished):
            self.done = True
            ttft = None if self.first_token is None else self.first_token - self.arrival
            result = event.result
            self.metrics.observe_request(result.finish_reason, ttft, now - self.arrival, len(result.token_ids))
        elif isinstance(event, RequestFailed):
            self.done = True
            self.metrics.observe_failure()
