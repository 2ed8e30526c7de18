"""Run the coding agent (quickdraft/bench/agent.py) on HumanEval tasks against an OpenAI-compatible server, and
record every model call for `quickdraft bench-serve --workload agent --conversations FILE`.

    quickdraft serve --port 8000          # in another shell: starting the server is yours
    .venv/bin/python tools/agent_run.py --url http://127.0.0.1:8000 --tasks 20 --out agent.jsonl \\
        [--extra-body '{"drafter": "none"}'] [--max-tokens 384] [--max-turns 6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from quickdraft.bench.agent import MAX_TOKENS, MAX_TURNS, AgentSettings, run_agent, summarize
from quickdraft.bench.agent_tools import SOLUTION, TEST_TIMEOUT_S, load_tasks
from quickdraft.errors import ConfigError

DESCRIPTION = f"""\
A small coding agent, driven by the openai client with tools, on the first N HumanEval problems (a test set: only
evaluated on, never trained on; ../shared/data/humaneval by default). Each task is a conversation: the model may
call write_file, run_tests (the task's own tests, in a subprocess in a temporary directory, with a timeout) and
read_file, or answer with a python code block, which is tested as the whole solution (each later turn rewrites
it). A task stops when the tests pass or after --max-turns model calls. Greedy by default. Every model call is
recorded, request and response, one JSON line per task in --out, which `quickdraft bench-serve --workload agent
--conversations FILE` replays. Prints the pass rate and the mean latency per request.

The model's code runs on this machine as you (in a temporary directory, with a timeout and a memory cap, not a
sandbox). The solution goes to {SOLUTION}. Start the server yourself first: quickdraft serve --port PORT."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000 (its /v1 API is used)")
    parser.add_argument("--tasks", type=int, default=10, metavar="N", help="the first N HumanEval tasks (10)")
    parser.add_argument("--out", required=True, metavar="FILE.jsonl", help="where the conversations are recorded")
    parser.add_argument(
        "--extra-body", default="{}", metavar="JSON",
        help="a JSON object sent with every request, e.g. quickdraft's '{\"drafter\": \"none\"}' or "
        "'{\"drafter\": \"hybrid\", \"policy\": \"goodput\"}' (default {}: the server's defaults)",
    )  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, metavar="N", help=f"per request ({MAX_TOKENS})")
    parser.add_argument("--max-turns", type=int, default=MAX_TURNS, metavar="N", help=f"calls per task ({MAX_TURNS})")
    parser.add_argument("--temperature", type=float, default=0.0, help="the requests' temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=None, help="the requests' sampling seed (with --temperature)")
    parser.add_argument("--model", default=None, help="the model name to send (default: the server's first)")
    parser.add_argument("--tasks-file", default=None, metavar="PATH", help="a HumanEval.jsonl(.gz) file")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S", help="seconds one request may take (900)")
    parser.add_argument(
        "--test-timeout", type=float, default=TEST_TIMEOUT_S, metavar="S",
        help=f"seconds one test run may take ({TEST_TIMEOUT_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--api-key", default=None,
        help="the server's API key (default: $QUICKDRAFT_API_KEY; none needed without --api-key on the server)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        args.extra_body = json.loads(args.extra_body)
    except json.JSONDecodeError as error:
        parser.error(f"--extra-body is not JSON: {error.msg}")
    if not isinstance(args.extra_body, dict):
        parser.error("--extra-body must be a JSON object")
    if args.tasks < 1 or args.max_tokens < 1 or args.max_turns < 1:
        parser.error("--tasks, --max-tokens and --max-turns must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    import openai

    args = parse_args(argv)
    try:
        tasks = load_tasks(args.tasks_file)[: args.tasks]
    except ConfigError as error:
        print(f"agent_run: error: {error}", file=sys.stderr)
        return 1
    api_key = args.api_key or os.environ.get("QUICKDRAFT_API_KEY") or "unused"
    client = openai.OpenAI(base_url=f"{args.url.rstrip('/')}/v1", api_key=api_key, max_retries=0, timeout=args.timeout)
    try:
        model = args.model or client.models.list().data[0].id
    except openai.APIError as error:
        print(
            f"agent_run: error: no server answers at {args.url} ({error}); start one: quickdraft serve", file=sys.stderr
        )
        return 1
    settings = AgentSettings(
        model=model, max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=args.temperature,
        seed=args.seed, extra_body=args.extra_body, test_timeout_s=args.test_timeout,
    )  # fmt: skip

    def progress(record: dict[str, Any]) -> None:
        verdict = "passed" if record["passed"] else "failed"
        note = f" ({record['error']})" if record["error"] else ""
        print(f"{record['task_id']}: {verdict} after {record['turns']} model calls{note}", file=sys.stderr)

    records = run_agent(client, tasks, settings, Path(args.out), progress)
    summary = summarize(records)
    mean = summary["mean_latency_s"]
    print(
        f"pass rate {summary['passed']}/{summary['tasks']} ({100 * summary['pass_rate']:.1f}%); "
        f"mean latency per request {'–' if mean is None else f'{mean:.2f} s'} over {summary['requests']} requests; "
        f"recorded in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
