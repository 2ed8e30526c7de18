"""``quickdraft serve``: an OpenAI-compatible server, continuous batching with per-request speculation."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.cli.common import add_chat_template_argument, add_model_arguments, chat_template_of, gpu_note
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS
from quickdraft.errors import ConfigError
from quickdraft.server.access import API_KEY_VARIABLE, MAX_BODY_MB, REQUEST_TIMEOUT_S

SHUTDOWN_TIMEOUT_S = 25.0  # within Kubernetes' default grace period of 30 s before SIGKILL

if TYPE_CHECKING:  # the server's packages load when a server starts: generate runs without them
    from quickdraft.server.setup import ServerOptions

SERVE_DOC = """\
Serve the models over HTTP with OpenAI's API: POST /v1/completions, POST /v1/chat/completions, POST /v1/responses
(stream: true for server-sent events), GET /v1/models, POST /tokenize and /detokenize, GET /health and GET /metrics
(Prometheus). Requests decode together (continuous batching); each speculates with its own drafter and policy (the
defaults below, or extra_body {"drafter": ..., "policy": ...} per request), and goodput chooses every request's
drafts per step from the measured cost of the whole batch, falling to plain decoding when the batch is busy. Listens
on 127.0.0.1 unless --host says otherwise."""


def add_command(commands: Any, name: str, summary: str) -> None:
    serve = commands.add_parser(
        name,
        help=summary,
        description=SERVE_DOC,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    add_model_arguments(serve)
    add_chat_template_argument(serve)
    serve.add_argument(
        "--reasoning-format",
        choices=("auto", "none"),
        default="auto",
        help="auto (default): a thinking model's reasoning, between the <think> (or [THINK]) tags its template "
        "writes, goes to the message's reasoning_content, as llama-server gives it; none: it stays in the content",
    )
    add_serving_arguments(serve)
    serve.add_argument(
        "--served-model-name", default=None, metavar="NAME", help="the model name clients use (default: the target's)"
    )
    serve.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        metavar="N",
        help="max_tokens of a request that gives none, cut to what the context and the caches leave after its prompt "
        "(default 256)",
    )
    access = serve.add_argument_group("access: who may use the server and how much a request may ask")
    access.add_argument(
        "--api-key", default=None, metavar="KEY",
        help=f"clients must send 'Authorization: Bearer KEY' to every route but /health (default ${API_KEY_VARIABLE}; "
        "unset: open). The command line shows in `ps`: prefer the variable",
    )  # fmt: skip
    access.add_argument(
        "--metrics-public", action="store_true", help="serve /metrics without the API key (Prometheus scrapers)"
    )
    access.add_argument(
        "--max-body-mb", type=float, default=MAX_BODY_MB, metavar="MB",
        help=f"a larger request body gets 413 before it is read further (default {MAX_BODY_MB})",
    )  # fmt: skip
    access.add_argument(
        "--shutdown-timeout", type=float, default=SHUTDOWN_TIMEOUT_S, metavar="S",
        help="on SIGTERM or Ctrl-C, new requests get 503 and those running or waiting have up to S seconds to "
        f"finish; any left then end with a 503, or on a stream an error event (default {SHUTDOWN_TIMEOUT_S:g}; a "
        "second Ctrl-C or SIGTERM ends them at once)",
    )  # fmt: skip
    access.add_argument(
        "--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
        help=f"a request still running S seconds after it arrived is cancelled: 504, or an error event on a stream "
        f"(default {REQUEST_TIMEOUT_S:g}; 0: none)",
    )  # fmt: skip
    replicas = serve.add_argument_group("replicas on Ray Serve (pip install 'quickdraft[ray]')")
    replicas.add_argument(
        "--replicas", type=int, default=0, metavar="N",
        help="run N servers as a Ray Serve deployment behind this one endpoint, a conversation's requests kept on "
        "one replica (default 0: one server, no Ray)",
    )  # fmt: skip
    replicas.add_argument(
        "--threads-per-replica", type=int, default=None, metavar="T",
        help="cores each replica reserves and steps on (default: this machine's cores / N, at least 1)",
    )  # fmt: skip
    replicas.add_argument(
        "--max-replicas", type=int, default=None, metavar="M",
        help="autoscale between N and M replicas by requests in flight (default: N, fixed)",
    )  # fmt: skip
    replicas.add_argument(
        "--ray-address", default=None, metavar="ADDR",
        help="join this Ray cluster (`ray start --head` prints it; 'auto': the local one) instead of starting Ray "
        "in this process",
    )  # fmt: skip
    serve.set_defaults(handler=run)


def given_serving_arguments(args: argparse.Namespace) -> list[str]:
    """The flags of :func:`add_serving_arguments` that ``args`` holds with a value other than their default."""
    defaults = argparse.ArgumentParser(add_help=False)
    add_serving_arguments(defaults)
    return [action.option_strings[0] for action in defaults._actions if getattr(args, action.dest) != action.default]


def add_serving_arguments(parser: argparse.ArgumentParser, prefix_cache_mb: int = 1024) -> None:
    """The engine's settings, shared with ``bench-serve`` (which starts servers with them)."""
    parser.add_argument(
        "--drafter",
        default=DEFAULT_DRAFTER,
        help=f"the default drafter of a request: {', '.join(DRAFTERS.names())} (default {DEFAULT_DRAFTER}; none = "
        "plain decoding)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="the default policy of a request: goodput (default), fixed[:K], heuristic, confidence[:T] or "
        "specdec++[:T] (each explained in `quickdraft generate --help`)",
    )
    parser.add_argument("--max-draft-tokens", type=int, default=16, metavar="K", help="largest γ (default 16)")
    parser.add_argument("--max-running", type=int, default=32, metavar="N", help="requests decoded at once (32)")
    parser.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        metavar="N",
        help="requests queued beyond the free slots; one more gets 429, a request of more choices (n) than "
        "--max-running + N can ever hold a 400 (256)",
    )
    parser.add_argument(
        "--prefill-tokens-per-step",
        type=int,
        default=128,
        metavar="N",
        help="prompt tokens read per step beside the decoding requests (chunked prefill; default 128)",
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=prefix_cache_mb,
        metavar="MB",
        help="keys and values of finished requests kept for prompts that start alike: a system prompt, a chat's "
        f"earlier turns (native runtime; 0 = off; default {prefix_cache_mb})",
    )
    parser.add_argument(
        "--kv-cache-mb",
        type=int,
        default=None,
        metavar="MB",
        help="memory for the running requests' keys and values: each reserves its prompt and max_tokens, requests "
        "wait while it is full, and one that can never fit is refused (0 = no bound; default: 3/4 of the memory "
        "available once the models are loaded, 1/N of that for each of N local replicas (N the larger of "
        "--replicas and --max-replicas), less --prefix-cache-mb; on a GPU, no bound unless given)",
    )
    parser.add_argument("--recalibrate", action="store_true", help="measure the costs again instead of loading them")


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from quickdraft.server.http_server import uvicorn_config
    from quickdraft.server.setup import ServerOptions, build_server

    options = dataclasses.replace(ServerOptions.from_args(args), chat_template=chat_template_of(args))
    if not args.shutdown_timeout >= 0:  # NaN too
        raise ConfigError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout:g}")
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")
    if args.draft_head is not None and not Path(args.draft_head).is_file():  # else found at the first eagle request
        raise ConfigError(f"--draft-head {args.draft_head}: no such file")
    if args.metrics_public and options.access.api_key is None:
        print(
            "quickdraft: note: --metrics-public changes nothing without an API key: every path is open", file=sys.stderr
        )
    replica_options = (args.max_replicas, args.ray_address, args.threads_per_replica)  # 0 and "" given too
    if args.replicas or any(option is not None for option in replica_options):
        run_replicas(args, options)
        return
    check_address(args.host, args.port)  # before the models load, which takes minutes
    print("quickdraft: loading the models and getting every drafter's costs ready (timed the first time on a machine: "
          "minutes)", file=sys.stderr)  # fmt: skip
    server = build_server(options, own_thread=False)  # steps on this, the main thread; HTTP in another
    device = server.loop.engine.target.device
    for note in [*server.notes, *([gpu_note(device)] if device.type != "cpu" else [])]:
        print(f"quickdraft: {note}", file=sys.stderr)
    loop = server.loop
    http_server = uvicorn.Server(uvicorn_config(server.app, args.host, args.port))
    http = threading.Thread(target=http_server.run, name="quickdraft-http", daemon=True)
    http.start()

    def shut_down(*_: object) -> None:  # the first signal drains (--shutdown-timeout), a second stops at once
        if loop.draining:  # what is left ends as at the end of the grace: a 503, or an error event then [DONE]
            loop.drain(0)
            print("quickdraft: stopping now: the requests in flight end with an error", file=sys.stderr)
            return
        loop.drain(args.shutdown_timeout)  # before the line, so a signal that comes after it finds the drain begun
        print("quickdraft: shutting down: finishing the requests in flight", file=sys.stderr)

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)

    def watch() -> None:  # says where it serves once it listens; a server that stops (a port in use) stops the steps
        while http.is_alive() and not http_server.started:
            time.sleep(0.05)
        if http_server.started:
            print(f"quickdraft: serving {server.model_names[0]} on {url_of(args.host, args.port)}", file=sys.stderr)
        http.join()
        loop.stop(timeout=0)

    threading.Thread(target=watch, daemon=True).start()
    try:
        loop.run()
    finally:
        http_server.should_exit = True  # every request has had its answer: its connection closes
        http.join(timeout=10)
    if not http_server.started:  # uvicorn could not listen (its message is above): not a clean exit
        raise ConfigError(f"could not serve on {endpoint(args.host, args.port)}: the address is in use or not allowed")


def url_of(host: str, port: int) -> str:
    """The API's base URL on ``host:port``."""
    return f"http://{endpoint(host, port)}/v1"


def endpoint(host: str, port: int) -> str:
    """``host:port``, an IPv6 address bracketed as URLs write it (``[::1]:8000``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_address(host: str, port: int) -> None:
    """Bind ``host:port`` once, as the server will: a port in use or a host this machine does not have is an error
    with its reason now, not after the models have loaded."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as error:  # socket.gaierror for a host name too
        raise ConfigError(f"cannot serve on {endpoint(host, port)}: {error.strerror or error}") from None


def run_replicas(args: argparse.Namespace, server: ServerOptions) -> None:
    """``--replicas N``: the deployment on Ray Serve (``deploy/ray_serve.py``), until SIGTERM or Ctrl-C."""
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1 with the replica options, got {args.replicas}")
    if server.access.api_key is not None:
        raise ConfigError(
            f"an API key (--api-key or ${API_KEY_VARIABLE}) is not supported with --replicas yet: serve the replicas "
            "behind a proxy that checks keys, on loopback"
        )
    if args.max_replicas is not None and args.max_replicas < args.replicas:
        raise ConfigError(f"--max-replicas ({args.max_replicas}) must be >= --replicas ({args.replicas})")
    threads = args.threads_per_replica
    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) // args.replicas)
    if threads < 1:
        raise ConfigError(f"--threads-per-replica must be >= 1, got {threads}")
    try:
        from quickdraft.deploy import ray_serve
    except ImportError as error:
        raise ConfigError(
            f"--replicas needs Ray Serve ({error.name} is missing): pip install 'quickdraft[ray]'"
        ) from None
    ray_address = None if args.ray_address is None else args.ray_address.strip()
    if ray_address == "local":  # Ray's name for a Ray of this process's own, as without the flag
        ray_address = None
    if ray_address is None:  # the replicas share this machine's memory, and Ray's proxy listens here
        server = dataclasses.replace(server, memory_share=1 / max(args.replicas, args.max_replicas or 0))
        check_address(args.host, args.port)
    deployment = ray_serve.DeploymentOptions(
        args.replicas, threads, args.host, args.port, ray_address, args.max_replicas,
        max_ongoing_requests=server.scheduler.max_running, max_waiting=server.scheduler.max_waiting,
    )  # fmt: skip
    stop = threading.Event()
    replicas = f"{args.replicas} replica{'s' if args.replicas > 1 else ''}"
    print(f"quickdraft: starting {replicas} of {threads} thread(s) on Ray Serve ...", file=sys.stderr)
    try:
        ray_serve.deploy(server, deployment, note=lambda message: print(message, file=sys.stderr))
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after Ray's start, which sets a handler that aborts
        served = print_startup(ray_serve)
        print(f"quickdraft: serving {served}on {url_of(args.host, args.port)} ({replicas})", file=sys.stderr)
        stop.wait()
        drain(ray_serve, args.shutdown_timeout)
    except KeyboardInterrupt:  # Ctrl-C drains as SIGTERM does; a second one stops at once
        with contextlib.suppress(KeyboardInterrupt):
            drain(ray_serve, args.shutdown_timeout)
    finally:
        ray_serve.shutdown(joined=ray_address is not None)


def print_startup(ray_serve: Any) -> str:
    """Print a replica's startup notes, as a single server prints its own; returns ``"NAME "``, the model served."""
    try:
        names, notes = ray_serve.startup()
    except Exception as error:  # Ray's errors: the replicas run, only their notes are lost
        print(f"quickdraft: the replicas' startup notes could not be read ({type(error).__name__})", file=sys.stderr)
        return ""
    for note in notes:
        print(f"quickdraft: {note}", file=sys.stderr)
    return f"{names[0]} "


def drain(ray_serve: Any, timeout_s: float) -> None:
    """The replicas' requests in flight finish, up to ``timeout_s``, before the deployment stops."""
    print("quickdraft: shutting down: finishing the requests in flight", file=sys.stderr)
    left = ray_serve.drain(timeout_s, note=lambda message: print(message, file=sys.stderr))
    if left:
        print(f"quickdraft: {left} requests were still running after {timeout_s:g} s; they are cut", file=sys.stderr)
