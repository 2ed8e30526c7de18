"""``quickdraft serve``'s HTTP side: an OpenAI-compatible FastAPI app over the batched engine's loop
(completions, chat completions, the Responses API over the chat path: :mod:`quickdraft.server.responses_api`;
/tokenize and /detokenize).

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

from quickdraft.api import Pipeline
from quickdraft.engine import Event, GenerationResult, QueueFull
from quickdraft.errors import QuickdraftError
from quickdraft.prompts import generation_prompt, thinking_of
from quickdraft.server.access import OPEN, READ, WAITED, Access, read_json
from quickdraft.server.answers import Tagged, Tracker, collect, scores_only, stream_chunks
from quickdraft.server.errors import add_error_handlers, shutting_down
from quickdraft.server.fields import count, flag
from quickdraft.server.loop import ServerStopping, ServingLoop
from quickdraft.server.messages import prompt_batch
from quickdraft.server.metrics import ServerMetrics
from quickdraft.server.protocol import ApiError, ApiRequest, ServerDefaults, error_param, parse_request, template_kwargs
from quickdraft.server.reasoning import Thinking, opened_by
from quickdraft.server.responses import batch_body, new_id, response_body
from quickdraft.server.responses_api import KEPT_RESPONSE, chat_request, no_kept_response, renamed
from quickdraft.server.responses_output import new_response_id, output_items, response_object, stream_events
from quickdraft.server.tokenize import detokenize, tokenize
from quickdraft.server.tool_formats import tool_format_of
from quickdraft.text import dropped_ids
from quickdraft.vocabularies import spelled, token_pieces

LOG = logging.getLogger("quickdraft.server")
RETRY = {"retry-after": "1"}  # a full queue's 429: when to send again (the openai client waits that long, not blind)


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
    positions = loop.engine.scheduler.settings.max_positions
    capacity = loop.engine.scheduler.settings.max_running + loop.engine.scheduler.settings.max_waiting  # requests
    defaults = dataclasses.replace(defaults, max_context=pipeline.target.max_context, max_positions=positions)
    tool_format = tool_format_of(pipeline.tokenizer)  # the chat template's, which tools need
    infill_ends = pipeline.infill_end_ids()  # where a fill-in-the-middle answer ends besides the model's end tokens
    template = getattr(pipeline.tokenizer, "chat_template", None)
    tags = thinking_of(template) if isinstance(template, str) else None  # kept in chat answers' text, split off or not

    @functools.lru_cache(maxsize=64)
    def opens_thinking(variables: str) -> bool:  # JSON of the template's variables: two renders once, not per request
        return tags is not None and opened_by(generation_prompt(pipeline.tokenizer, json.loads(variables)), tags)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="quickdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)  # fmt: skip  # a path with a slash added is unknown: a 404, not a redirect
    app.add_middleware(ServerFailures)

    add_error_handlers(app)

    @app.api_route("/health", methods=list(READ))
    async def health() -> JSONResponse:
        if loop.draining:  # a load balancer sends no more requests here (the loop may have ended already)
            raise shutting_down()
        if not loop.alive:
            raise ApiError(503, "the engine is not running", kind="server_error")
        return JSONResponse({"status": "ok"})

    started = int(time.time())
    card = {"object": "model", "created": started, "owned_by": "quickdraft", "max_model_len": defaults.max_context}
    entries = {name: {"id": name} | card for name in defaults.model_names}  # max_model_len: vLLM's, for clients

    @app.api_route("/v1/models", methods=list(READ))
    async def models(request: Request) -> dict[str, Any]:
        access.authorize(request.headers.get("authorization"))
        return {"object": "list", "data": list(entries.values())}

    @app.api_route("/v1/models/{name:path}", methods=list(READ))
    async def one_model(request: Request, name: str) -> dict[str, Any]:
        access.authorize(request.headers.get("authorization"))
        if name not in entries:
            raise ApiError(404, f"the model {name!r} does not exist", "model", code="model_not_found")
        return entries[name]

    @app.api_route("/metrics", methods=list(READ))
    async def prometheus(request: Request) -> Response:
        access.authorize(request.headers.get("authorization"), metrics=True)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @functools.cache
    def spell(token_id: int) -> tuple[str, bytes]:
        """A token's text and its own bytes (logprobs' ``bytes``): :func:`spelled`."""
        return spelled(pipeline.tokenizer, vocabulary_pieces(), token_id)

    @functools.cache
    def vocabulary_pieces() -> list[bytes]:  # [V], made on the first request for logprobs
        return token_pieces(pipeline.tokenizer)

    def decode(token_ids: list[int]) -> str:  # an echoed prompt of token ids, special tokens spelled
        return str(pipeline.tokenizer.decode(token_ids))

    def encode(
        prompt: Any, chat: bool, tools: Any = None, template_kwargs: Any = None, suffix: str | None = None
    ) -> list[int]:
        if chat:
            return pipeline.encode_chat(prompt, tools, template_kwargs)
        if isinstance(prompt, list) and any(not 0 <= token < pipeline.target.vocab_size for token in prompt):
            raise ApiError(400, f"token ids must be in [0, {pipeline.target.vocab_size})", "prompt")
        if suffix is not None:
            return pipeline.encode_infill(prompt, suffix)
        return list(prompt) if isinstance(prompt, list) else pipeline.encode(prompt)

    def arrived(request: Request) -> float:
        """When ``request`` arrived: a replica's request waited in Ray's queue before it came here."""
        return time.perf_counter() - request.scope.get(WAITED, 0.0)

    async def start(
        request: Request,
        chat: bool,
        translate: Any = None,
        body: Any = None,
        arrival: float | None = None,
        events: Queue | None = None,
        first_index: int = 0,
    ) -> tuple[Any, ApiRequest, Queue, Tracker]:
        """Read (unless ``body`` was read, the request having arrived at ``arrival``), check and submit a request's
        choices: (what ``translate`` adds, the parsed request, its choices' events, its tracker). ``translate``: the
        body (of another API) -> the chat body it means, and what else its answer needs. ``events``: a queue shared
        by a list's prompts, where choice j is tagged ``first_index`` + j."""
        arrival = arrived(request) if arrival is None else arrival
        access.authorize(request.headers.get("authorization"))
        if body is None:
            body = await read_json(request, access.max_body_bytes, access.body_timeout_s)
        translated, extra = translate(body) if translate is not None else (body, None)
        try:
            api = await asyncio.to_thread(  # tokenizing a long prompt takes seconds: not on the event loop
                parse_request, translated, chat, defaults, encode, pipeline.drafter, tool_format, infill_ends, decode
            )
        except ApiError as error:
            raise error if translate is None else renamed(error) from None
        if tags is not None and chat:  # the tags' text, where they are special tokens
            config = api.serve.config
            kept = dataclasses.replace(config, kept_special_tokens=(*config.kept_special_tokens, tags.open, tags.close))
            free = config.grammar is None or config.grammar.opens_free  # else no </think> can come
            variables = template_kwargs(translated, defaults.template_kwargs)
            opened = free and opens_thinking(json.dumps(variables, sort_keys=True))  # the template opens a block
            if config.grammar is not None and config.grammar.opens_free and api.tools is not None:
                kept = dataclasses.replace(kept, grammar=api.tools.grammar(think=(tags.open, tags.close, opened)))
            api = dataclasses.replace(api, serve=dataclasses.replace(api.serve, config=kept))
            if defaults.split_reasoning:
                api = dataclasses.replace(api, thinking=Thinking(opened, tags))
        if not chat and api.serve.config.logprobs is not None:  # completions' offsets skip what the text leaves out
            api = dataclasses.replace(api, silent=dropped_ids(pipeline.tokenizer, api.serve.config.kept_special_tokens))
        if not loop.alive:  # after a drain ended the loop, still a shutdown's 503
            raise shutting_down() if loop.draining else ApiError(503, "the engine is not running", kind="server_error")
        if api.n > capacity:  # never fits, however long the client waits: no "retry later"
            message = f"n is at most {capacity} on this server: it runs and queues that many requests at once"
            raise ApiError(400, message + " (--max-running and --max-waiting)", "n")
        events: asyncio.Queue[Tagged] = asyncio.Queue() if events is None else events
        event_loop = asyncio.get_running_loop()
        track = Tracker(arrival, metrics, access.request_timeout_s, api.n)

        def deliver(index: int, event: Event) -> None:  # on the event loop; timed even after a client went away
            event = scores_only(event) if api.scores_only else event  # the metrics count what the answer says
            track.see(index, event)
            events.put_nowait((first_index + index, event))

        def sink(index: int) -> Callable[[Event], None]:
            def tell(event: Event) -> None:  # on the engine's thread
                with contextlib.suppress(RuntimeError):  # the caller's event loop closed: no one is left to tell
                    event_loop.call_soon_threadsafe(deliver, index, event)

            return tell

        try:  # in a worker thread: compiling a grammar can take a second, and would stall every other client
            for index, choice in enumerate(api.choices):
                await asyncio.to_thread(loop.submit, choice, sink(index))
        except BaseException as error:
            cancel_unfinished(api, track)  # the choices submitted before one was refused go too
            if isinstance(error, QueueFull):
                raise ApiError(429, str(error), kind="rate_limit_error", code="queue_full", headers=RETRY) from None
            if isinstance(error, ServerStopping):
                raise shutting_down(str(error)) from None
            if isinstance(error, QuickdraftError):  # the prompt does not fit, a policy the server cannot run, ...
                refused = ApiError(400, str(error), error_param(error, api.chat))
                raise refused if translate is None else renamed(refused) from None
            raise
        return extra, api, events, track

    def cancel_unfinished(api: ApiRequest, track: Tracker) -> None:
        """Free the slots of the request's choices still running, at the next step."""
        for index in track.unfinished:
            loop.cancel(api.choices[index].request_id)

    async def generate(request: Request, chat: bool, body: Any = None, arrival: float | None = None) -> Response:
        _, api, events, track = await start(request, chat, body=body, arrival=arrival)
        if api.stream:
            chunks = cancelled_when_left(stream_chunks([api], events, track, spell), [(api, track)])
            return StreamingResponse(chunks, media_type="text/event-stream")
        results = await whole(request, api, events, track)
        return JSONResponse(response_body(api, new_id(chat), results, spell))

    async def whole(request: Request, api: ApiRequest, events: Queue, track: Tracker) -> list[GenerationResult]:
        try:
            return await collect(request, events, track, api.n)
        finally:
            cancel_unfinished(api, track)

    async def cancelled_when_left(
        texts: AsyncIterator[str], parts: list[tuple[ApiRequest, Tracker]]
    ) -> AsyncIterator[str]:
        try:
            async for text in texts:
                yield text
        finally:  # ended, failed, or the client went away: the choices still running free their slots
            for api, track in parts:
                cancel_unfinished(api, track)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        arrival = arrived(request)  # its time to first token counts the reading of its body, as every request's
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes, access.body_timeout_s)
        prompts = prompt_batch(body)
        if prompts is None:
            return await generate(request, False, body, arrival)
        return await batch(request, body, prompts, arrival)

    async def batch(request: Request, body: dict[str, Any], prompts: list[Any], arrival: float) -> Response:
        """OpenAI's completion of several prompts: a request each, choice j of prompt i at index i·n + j, answered
        whole together or streamed as one stream of their chunks; one that is refused refuses them all, its error
        naming it (``prompt[2]: ...``)."""
        n = count(body, "n", 1) or 1
        if len(prompts) * n > capacity:
            message = f"a list of prompts runs a request per prompt and choice: {len(prompts)} prompts × n {n} = "
            message += f"{len(prompts) * n}, at most {capacity} on this server (--max-running and --max-waiting)"
            raise ApiError(400, message, "prompt")
        streamed = flag(body, "stream", False)
        shared: Queue | None = asyncio.Queue() if streamed else None  # [Tagged]: every prompt's events, streamed
        started: list[tuple[Any, ApiRequest, Queue, Tracker]] = []
        try:
            for position, prompt in enumerate(prompts):
                part = body | {"prompt": prompt}
                try:
                    first_index = position * n if streamed else 0  # a shared queue tags the list's choices
                    started.append(
                        await start(request, False, body=part, arrival=arrival, events=shared, first_index=first_index)
                    )
                except ApiError as error:
                    error.message = f"prompt[{position}]: {error.message}"
                    raise
        except BaseException:  # the prompts submitted before one was refused go too
            for _, api, _, track in started:
                cancel_unfinished(api, track)
            raise
        if shared is not None:
            created = started[0][1].created  # one stream, one time, as a whole answer has
            apis = [dataclasses.replace(api, created=created) for _, api, _, _ in started]
            chunks = stream_chunks(apis, shared, started[0][3], spell)  # its prompts' time limits are one: one arrival
            texts = cancelled_when_left(chunks, [(api, track) for _, api, _, track in started])
            return StreamingResponse(texts, media_type="text/event-stream")
        try:
            parts = await asyncio.gather(*(whole(request, api, events, track) for _, api, events, track in started))
        finally:  # the answers of all are left when one fails
            for _, api, _, track in started:
                cancel_unfinished(api, track)
        response_id = new_id(False)
        bodies = [
            response_body(api, response_id, part, spell) for (_, api, _, _), part in zip(started, parts, strict=True)
        ]
        return JSONResponse(batch_body(bodies, n))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes, access.body_timeout_s)
        names = defaults.model_names
        return JSONResponse(
            await asyncio.to_thread(tokenize, body, pipeline, names, tool_format, spell, defaults.template_kwargs)
        )

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> JSONResponse:
        access.authorize(request.headers.get("authorization"))
        body = await read_json(request, access.max_body_bytes, access.body_timeout_s)
        return JSONResponse(await asyncio.to_thread(detokenize, body, pipeline, defaults.model_names))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        echo, api, events, track = await start(request, True, chat_request)
        if api.stream:
            texts = cancelled_when_left(stream_events(api, echo, events, track, spell), [(api, track)])
            return StreamingResponse(texts, media_type="text/event-stream")
        (result,) = await whole(request, api, events, track)
        output = output_items(api, result, spell)
        return JSONResponse(response_object(api, echo, new_response_id(), output, result, spell=spell))

    @app.api_route(KEPT_RESPONSE, methods=["GET", "HEAD", "POST", "DELETE"])
    async def a_kept_response(request: Request, response_id: str) -> Response:  # retrieve, delete, cancel, items
        access.authorize(request.headers.get("authorization"))
        raise no_kept_response(response_id)

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
