"""``quickdraft serve``: an OpenAI-compatible server, continuous batching with per-request speculation."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from quickdraft.cli.common import add_model_arguments
from quickdraft.config import GenerationConfig
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS
from quickdraft.engine import SchedulerSettings
from quickdraft.errors import ConfigError

SERVE_DOC = """\
Serve the models over HTTP with OpenAI's API: POST /v1/completions, POST /v1/chat/completions (stream: true
for server-sent events), GET /v1/models, GET /health and GET /metrics (Prometheus). Requests decode together
(continuous batching); each speculates with its own drafter and policy (the defaults below, or extra_body
{"drafter": ..., "policy": ...} per request), and goodput chooses every request's drafts per step from the
measured cost of the whole batch, falling to plain decoding when the batch is busy. Listens on 127.0.0.1
unless --host says otherwise."""


def add_command(commands: Any) -> None:
    serve = commands.add_parser(
        "serve",
        help="an OpenAI-compatible server",
        description=SERVE_DOC,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    add_model_arguments(serve)
    add_serving_arguments(serve)
    serve.add_argument(
        "--served-model-name", default=None, metavar="NAME", help="the model name clients use (default: the target's)"
    )
    serve.add_argument(
        "--default-max-tokens", type=int, default=256, metavar="N", help="max_tokens of a request that gives none"
    )
    serve.set_defaults(handler=run)


def add_serving_arguments(parser: argparse.ArgumentParser, prefix_cache_mb: int = 1024) -> None:
    """The engine's settings, shared with ``bench-serve`` (which starts servers with them)."""
    parser.add_argument(
        "--drafter",
        default=DEFAULT_DRAFTER,
        choices=DRAFTERS.names(),
        help=f"the default drafter of a request (default {DEFAULT_DRAFTER}; none = plain decoding)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="the default policy of a request: goodput (default), fixed[:K], …",
    )
    parser.add_argument("--max-draft-tokens", type=int, default=16, metavar="K", help="largest γ (default 16)")
    parser.add_argument("--max-running", type=int, default=32, metavar="N", help="requests decoded at once (32)")
    parser.add_argument(
        "--max-waiting", type=int, default=256, metavar="N", help="queued requests; one more gets 429 (256)"
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
    parser.add_argument("--recalibrate", action="store_true", help="measure the costs again instead of loading them")


def run(args: argparse.Namespace) -> None:
    import uvicorn

    from quickdraft.api import Pipeline
    from quickdraft.server import ServerDefaults, create_app
    from quickdraft.server.loop import ServingLoop
    from quickdraft.server.setup import serving_engine

    settings = SchedulerSettings(args.max_running, args.max_waiting, args.prefill_tokens_per_step)
    GenerationConfig(policy=args.policy, max_draft_tokens=args.max_draft_tokens)  # a bad policy fails here
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 1..65535, got {args.port}")
    if args.default_max_tokens < 1:
        raise ConfigError(f"--default-max-tokens must be >= 1, got {args.default_max_tokens}")
    pipeline = Pipeline.load(
        args.target,
        args.draft or default_draft(args),
        args.runtime,
        draft_weights=args.draft_weights,
        draft_vocabulary=args.draft_vocabulary,
    )
    pipeline.draft_head = Path(args.draft_head) if args.draft_head else None
    pipeline.drafter(args.drafter)  # a default drafter these models cannot run fails here
    if args.prefix_cache_mb < 0:
        raise ConfigError(f"--prefix-cache-mb must be >= 0, got {args.prefix_cache_mb}")
    engine, notes = serving_engine(
        pipeline, settings, args.max_draft_tokens, args.recalibrate, prefix_cache_mb=args.prefix_cache_mb
    )
    for note in notes:
        print(f"quickdraft: {note}", file=sys.stderr)
    names = model_names(pipeline, args.served_model_name)
    defaults = ServerDefaults(names, args.drafter, args.policy, args.default_max_tokens)
    loop = ServingLoop(engine, own_thread=False)  # steps on this, the main thread; HTTP in another
    app = create_app(pipeline, loop, defaults)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    http = threading.Thread(target=server.run, name="quickdraft-http", daemon=True)
    print(f"quickdraft: serving {names[0]} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    http.start()
    signal.signal(signal.SIGTERM, lambda *_: loop.stop(timeout=0))
    watcher = threading.Thread(target=lambda: (http.join(), loop.stop(timeout=0)), daemon=True)
    watcher.start()  # a server that stops (a port in use) stops the steps too
    try:
        loop.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        http.join(timeout=10)


def default_draft(args: argparse.Namespace) -> str | None:
    """The draft model: the default one unless the server decodes without one by default."""
    from quickdraft.models import DEFAULT_DRAFT

    return DEFAULT_DRAFT if DRAFTERS.get(args.drafter).needs_draft_model else None


def model_names(pipeline: Any, served_name: str | None) -> tuple[str, ...]:
    """What ``model`` may say: the served name first, and the target's directory name (a packaged model's name)."""
    path = pipeline.target_path
    name = "target" if path is None else (path.parent.name if path.name == "hf" else path.name)
    return (served_name, name) if served_name else (name,)
