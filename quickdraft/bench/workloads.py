"""What ``quickdraft bench-serve`` sends: its workloads, and the token ids its lossless reference decodes.

Workloads:
- ``spec-bench`` (the default): the first turns of a stratified sample of Spec-Bench questions, each sent as one
  user message, ``--num-prompts`` of them (24), at most ``--max-tokens`` new tokens each (96).
- ``agent``: every recorded model call of every conversation in ``--conversations`` (JSON lines written by
  ``tools/agent_run.py``, see ``bench/agent.py``), in file order, each sent with its exact ``messages``, ``tools``
  and ``tool_choice``, so runs of different configurations compare the same requests. A call recorded as failed
  is left out. Each request keeps its recorded ``max_tokens`` unless ``--max-tokens`` is given; ``--num-prompts``
  takes the first N calls.

The reference: single-request plain decoding of exactly what the server decodes. A chat is turned into token ids
and settings by the server's own request parsing (:func:`quickdraft.server.protocol.parse_request`: roles, tool
turns, tools rendered by the chat template, ``tool_choice``'s grammar), so the reference reads the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from quickdraft.bench.names import WORKLOADS
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.bench.serve_load import Prompt
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.files import input_file
from quickdraft.lossless.sampling import SamplingParams

DEFAULT_NUM_PROMPTS = 24  # spec-bench
DEFAULT_MAX_TOKENS = 96  # spec-bench, and an agent call recorded without max_tokens


def workload_prompts(
    workload: str, questions: str | None, conversations: str | None, count: int | None, seed: int,
    max_tokens: int | None,
) -> list[Prompt]:  # fmt: skip
    """The requests of one run of ``workload`` (see the module's rules)."""
    if workload not in WORKLOADS:
        raise ConfigError(f"--workload is one of {', '.join(WORKLOADS)}, got {workload!r}")
    if workload == "agent":
        if conversations is None:
            raise ConfigError("--workload agent replays --conversations FILE (from tools/agent_run.py): give one")
        if questions is not None:
            raise ConfigError("--workload agent replays --conversations FILE, not --questions: give one of them")
        return agent_prompts(conversations, max_tokens)[:count]
    if conversations is not None:
        raise ConfigError("--conversations needs --workload agent")
    return spec_bench_prompts(questions, count or DEFAULT_NUM_PROMPTS, seed)


def spec_bench_prompts(path: str | None, count: int, seed: int) -> list[Prompt]:
    """``count`` first turns of a stratified sample of the questions (round-robin over the categories)."""
    source = Path(path) if path else default_questions_path()
    if source is None:
        raise ConfigError("no question file: pass --questions (Spec-Bench question.jsonl)")
    questions = load_questions(source)
    categories = len({question.category for question in questions})
    sample = sample_questions(questions, math.ceil(count / categories), seed)[:count]
    return [Prompt(question.question_id, question.category, question.turns[0]) for question in sample]


def agent_prompts(path: str | Path, max_tokens: int | None = None) -> list[Prompt]:
    """Every answered model call of the recorded conversations in ``path``: ``TASK#TURN`` is its id, the task its
    category; ``max_tokens`` (if given) replaces each call's own."""
    path = input_file("--conversations", path)
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"--conversations: line {number} of {path}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where} is not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("calls"), list) or "task_id" not in record:
            raise ConfigError(f"{where} is not a recorded conversation (task_id, calls)")
        for call in record["calls"]:
            request = call.get("request") if isinstance(call, dict) else None
            messages = request.get("messages") if isinstance(request, dict) else None
            if not messages or not isinstance(messages, list):
                raise ConfigError(f"{where}: every call needs a request with messages")
            if "response" not in call:  # a failed call: nothing to replay
                continue
            prompts.append(Prompt(
                f"{record['task_id']}#{call.get('turn', len(prompts) + 1)}", str(record["task_id"]),
                messages=tuple(request["messages"]), tools=tuple(request.get("tools") or ()),
                tool_choice=request.get("tool_choice"),
                max_tokens=max_tokens or request.get("max_tokens") or DEFAULT_MAX_TOKENS,
            ))  # fmt: skip
    if not prompts:
        raise ConfigError(f"--conversations: {path} holds no answered model calls")
    if len({prompt.question_id for prompt in prompts}) < len(prompts):
        raise ConfigError(f"--conversations: {path} holds a task's turn twice (one run per file)")
    return prompts


def requests_digest(prompts: list[Prompt]) -> str:
    """A hash of every request's chat, tools and token limit: which references a saved file holds."""
    text = json.dumps([[p.question_id, p.chat(), p.max_tokens] for p in prompts], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def served_input(
    pipeline: Any, prompt: Prompt, max_tokens: int, sampling: SamplingParams, policy: str | None = None
) -> tuple[list[int], GenerationConfig]:
    """The prompt's token ids and settings as ``quickdraft serve`` makes them from the request the load test sends
    (``policy``: the configuration's, for single-request runs). A Spec-Bench text is the one user turn of the chat
    template; a recorded chat goes through the server's own request parsing."""
    limit = prompt.max_tokens or max_tokens
    if not prompt.messages:
        return pipeline.encode(prompt.text, chat=True), GenerationConfig(limit, policy=policy, sampling=sampling)
    from quickdraft.server.errors import ApiError
    from quickdraft.server.protocol import ServerDefaults, parse_request
    from quickdraft.server.tool_formats import tool_format_of

    body = prompt.chat() | {"max_tokens": limit, "temperature": sampling.temperature, "seed": sampling.seed,
                            "drafter": "none"}  # fmt: skip
    try:
        api = parse_request(
            body, True, ServerDefaults(("reference",), max_context=pipeline.target.max_context),
            lambda messages, chat, tools=None, template_kwargs=None: pipeline.encode_chat(
                messages, tools, template_kwargs), pipeline.drafter, tool_format_of(pipeline.tokenizer),
        )  # fmt: skip
    except ApiError as error:
        raise ConfigError(f"request {prompt.question_id}: the server would refuse it: {error.message}") from None
    served = api.serve.config
    config = GenerationConfig(
        served.max_new_tokens, policy=policy, sampling=served.sampling, stop=served.stop, grammar=served.grammar
    )
    return list(api.serve.prompt_ids), config
