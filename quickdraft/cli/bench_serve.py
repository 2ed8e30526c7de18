"""``quickdraft bench-serve``: its arguments; the harness is :mod:`quickdraft.cli.bench_serve_run` (the load itself
``bench/serve_load.py``), imported when the command runs so that ``--help`` imports neither torch nor the models."""

from __future__ import annotations

import argparse
from typing import Any

from quickdraft.bench.names import WORKLOADS
from quickdraft.cli.common import add_chat_template_argument, add_model_arguments, add_sampling_arguments
from quickdraft.cli.serve import add_serving_arguments

DEFAULT_CONFIGS = (
    "plain=none,fixed-hy=hybrid+fixed:3,goodput-hy=hybrid+goodput,goodput-hs=hybrid-suffix+goodput,"
    "fixed-dm=draft-model+fixed:3,goodput-dm=draft-model+goodput,"
    "goodput-hy-cache=hybrid+goodput:cache,"
    "llama=llama-server,llama-draft=llama-server:draft,llama-cache=llama-server:cache"
)
BENCH_SERVE_DOC = """\
Load-test an OpenAI-compatible quickdraft server with the official openai client (AsyncOpenAI): Spec-Bench prompts
(first turns, chat, greedy unless --temperature, streamed) sent at each --rates (seq: one user at a time; a number:
Poisson arrivals, requests per second; inf: all at once) under each --configs (NAME=DRAFTER[+POLICY], sent per
request in extra_body; or NAME=llama-server[:draft]: llama.cpp's own server on the same GGUF, started here, plain or
with its draft-model speculation; either with :cache, whose requests may reuse the prompts earlier runs left cached,
cache_prompt in both servers). --workload agent sends instead every model call tools/agent_run.py recorded
(--conversations FILE: a coding agent's conversations) as it was sent, tools and all. Reports throughput, TTFT, time
per output token and end-to-end latency (mean, p50, p90, p99), checks every response against single-request plain
decoding (greedy or seeded), and ends with a run in which a fraction of the clients disconnect mid-stream (is every
other request served, and does the server's memory return to idle?). Starts `quickdraft serve` on a free loopback
port unless --url is given, and a llama-server per llama-server configuration (built once from the vendored
llama.cpp of llama-cpp-python, about 7 minutes on two cores), with as many slots as requests per run. The report
puts quickdraft's default (hybrid-suffix+goodput) beside the best llama-server at every rate. Writes results.json,
report.md and latency.png to --out."""


def add_command(commands: Any, name: str, summary: str) -> None:
    bench = commands.add_parser(
        name,
        help=summary,
        description=BENCH_SERVE_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--workload", choices=WORKLOADS, default="spec-bench",
        help="spec-bench (the default: Spec-Bench first turns) or agent (replay --conversations)",
    )  # fmt: skip
    bench.add_argument(
        "--questions", metavar="PATH", help="question file (default ../shared/data/spec_bench/question.jsonl)"
    )
    bench.add_argument(
        "--conversations", metavar="FILE", help="--workload agent: the JSONL tools/agent_run.py recorded"
    )
    bench.add_argument(
        "--num-prompts", type=int, metavar="N", help="requests per run (default 24; agent: every recorded call)"
    )
    bench.add_argument(
        "--max-tokens", type=int, metavar="N", help="new tokens per request at most (96; agent: each call's own)"
    )
    bench.add_argument(
        "--rates", default="seq,0.5,1,2,inf", metavar="R,R", help="request rates (default seq,0.5,1,2,inf)"
    )
    bench.add_argument(
        "--configs", default=DEFAULT_CONFIGS, metavar="A,B", help=f"configurations (default {DEFAULT_CONFIGS})"
    )
    add_sampling_arguments(
        bench,
        "the prompt sample and the arrivals",
        "the requests' temperature (default 0: greedy)",
        "the requests' sampling seed (with --temperature): responses must then equal seeded plain decoding",
    )
    bench.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds a request may take (900)")
    bench.add_argument(
        "--disconnect-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="clients that disconnect in the last run (0.1)",
    )
    bench.add_argument("--url", help="an already running server (http://127.0.0.1:PORT); default: start one")
    bench.add_argument("--no-reference", action="store_true", help="skip the lossless check (no model loaded here)")
    bench.add_argument(
        "--single-request",
        action="store_true",
        help="first decode every prompt alone with the engine in this process (no server), under each configuration, "
        "one after another: the latencies the server's one-user run is compared with",
    )
    bench.add_argument(
        "--out", default="bench-serve-results", metavar="DIR", help="output directory (default bench-serve-results)"
    )
    add_model_arguments(bench)
    add_chat_template_argument(bench, variables=False)  # the servers' and the references' (llama-server: with --jinja)
    add_serving_arguments(bench)  # the prefix cache is on; only :cache configurations' requests use it
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    from quickdraft.cli.bench_serve_run import run_bench_serve

    run_bench_serve(args)
