"""A small coding agent over an OpenAI-compatible server: HumanEval tasks, tools that really run, every model call
recorded (the conversations ``quickdraft bench-serve --workload agent`` replays).

Rules:
- A task's conversation opens with a system message and the task's prompt. Each turn is one model call offering
  :data:`~quickdraft.bench.agent_tools.TOOLS` (``tool_choice`` auto); the model's tool calls run in the task's
  workspace and each answers with a ``tool`` message.
- An answer without tool calls that holds a python code block is taken as the whole solution: it is written to
  ``solution.py`` and tested, and a failure is told to the model as a user message asking for the whole solution
  again (code-edit rounds: each turn rewrites the previous answer). An answer with neither is asked for one.
- The task stops as soon as a test run passes, after ``max_turns`` model calls, or at a failed call. It passed
  when the last solution written passes the tests (run once more at the end if it changed after its last run).
- Greedy (temperature 0) unless told otherwise; ``extra_body`` goes with every call (quickdraft's ``drafter``,
  ``policy``, ...).
- Every call is recorded as sent: ``messages``, ``tools``, ``tool_choice``, ``max_tokens``, ``temperature`` (and
  ``seed`` if given); and as answered: content, tool calls, finish reason, usage and latency (seconds, the
  client's). One JSON line per task: task id, passed, turns, the calls.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.bench.agent_tools import SOLUTION, TEST_TIMEOUT_S, TOOLS, Task, TestRun, ToolError, Workspace

MAX_TURNS = 6
MAX_TOKENS = 384
SYSTEM = (
    "You are a careful Python programmer. Complete the function the user gives you. Write the whole file (its "
    f"imports, the function and any helpers) to {SOLUTION} with the write_file tool, then call run_tests, and fix "
    "the code until the tests pass. If you cannot call tools, reply with the whole solution in one ```python code "
    "block."
)
NO_CODE = (
    f"I found no solution in your answer. Write the whole file to {SOLUTION} with write_file and call run_tests, "
    "or reply with the whole solution in one ```python code block."
)
FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class AgentSettings:
    """How the agent calls the model."""

    model: str
    max_turns: int = MAX_TURNS
    max_tokens: int = MAX_TOKENS
    temperature: float = 0.0
    seed: int | None = None
    extra_body: Mapping[str, Any] | None = None  # sent with every call (quickdraft's drafter, policy, ...)
    test_timeout_s: float = TEST_TIMEOUT_S


def user_prompt(task: Task) -> str:
    return f"Complete this function:\n\n```python\n{task.prompt.rstrip()}\n```"


def failed_tests(run: TestRun) -> str:
    """The user's message after a plain answer failed its tests."""
    return (
        f"The tests failed:\n{run.output}\n\nRewrite the whole solution: reply with all of it in one ```python code "
        f"block, or write it to {SOLUTION} with write_file and call run_tests."
    )


def extract_code(text: str, entry_point: str = "") -> str | None:
    """The solution in an answer: the first fenced code block that defines ``entry_point`` (the first block if
    none does; a block cut off by the token limit counts to the end); without fences, the whole answer if it
    defines ``entry_point`` and compiles. None if there is none."""
    blocks = [block for block in FENCED.findall(text) if block.strip()]
    defines = [block for block in blocks if entry_point and f"def {entry_point}" in block]
    if defines or blocks:
        return (defines or blocks)[0]
    if entry_point and f"def {entry_point}" in text:
        try:
            compile(text, SOLUTION, "exec")
        except (SyntaxError, ValueError):
            return None
        return text
    return None


def solve(client: Any, task: Task, settings: AgentSettings) -> dict[str, Any]:
    """Run the agent on ``task`` through ``client`` (an ``openai.OpenAI``): the task's record (see the rules)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": user_prompt(task)},
    ]
    calls: list[dict[str, Any]] = []
    passed, error = False, None
    with tempfile.TemporaryDirectory(prefix="quickdraft-agent-") as directory:
        workspace = Workspace(Path(directory), task, settings.test_timeout_s)
        for turn in range(1, settings.max_turns + 1):
            request: dict[str, Any] = {
                "messages": copy.deepcopy(messages), "tools": copy.deepcopy(TOOLS), "tool_choice": "auto",
                "max_tokens": settings.max_tokens, "temperature": settings.temperature,
            }  # fmt: skip
            if settings.seed is not None:
                request["seed"] = settings.seed
            started = time.perf_counter()
            try:
                response = client.chat.completions.create(
                    model=settings.model, **copy.deepcopy(request), extra_body=dict(settings.extra_body or {})
                )
                choice = response.choices[0]
            except Exception as failure:  # a failed call ends the task, recorded
                error = f"{type(failure).__name__}: {failure}"
                calls.append({"turn": turn, "request": request, "error": error,
                              "latency_s": time.perf_counter() - started})  # fmt: skip
                break
            answer = response_record(response, choice, time.perf_counter() - started)
            calls.append({"turn": turn, "request": request, "response": answer})
            run = act(workspace, messages, answer)
            if run is not None and run.passed:
                passed = True
                break
        if not passed and workspace.untested and error is None:
            passed = workspace.run_tests().passed
    return {"task_id": task.task_id, "passed": passed, "turns": len(calls), "error": error, "calls": calls}


def response_record(response: Any, choice: Any, latency_s: float) -> dict[str, Any]:
    """A model call's answer as recorded: content, tool calls (OpenAI's dicts), finish reason, usage, latency, and
    quickdraft's ``speculation`` counts where the server sent them."""
    message, usage = choice.message, response.usage
    tool_calls = [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}
        for call in message.tool_calls or [] if getattr(call, "function", None) is not None
    ]  # fmt: skip
    return {
        "content": message.content,
        "tool_calls": tool_calls,
        "finish_reason": choice.finish_reason,
        "usage": usage.model_dump() if hasattr(usage, "model_dump") else usage,
        "latency_s": latency_s,
        "speculation": getattr(response, "speculation", None),
    }


def act(workspace: Workspace, messages: list[dict[str, Any]], answer: Mapping[str, Any]) -> TestRun | None:
    """Append the model's answer to ``messages`` and act on it (tool calls, or a plain answer's code); the turn's
    last test run, if the tests ran."""
    if answer["tool_calls"]:
        messages.append({"role": "assistant", "content": answer["content"], "tool_calls": answer["tool_calls"]})
        last = None
        for call in answer["tool_calls"]:
            text, run = workspace.call(call["function"]["name"], call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            last = run or last
        return last
    content = answer["content"] or ""
    messages.append({"role": "assistant", "content": content})
    code = extract_code(content, workspace.task.entry_point)
    if code is None:
        messages.append({"role": "user", "content": NO_CODE})
        return None
    try:
        workspace.write_file(SOLUTION, code)
    except ToolError as error:
        messages.append({"role": "user", "content": f"Your solution could not be written: {error}"})
        return None
    run = workspace.run_tests()
    if not run.passed:
        messages.append({"role": "user", "content": failed_tests(run)})
    return run


def run_agent(
    client: Any,
    tasks: Iterable[Task],
    settings: AgentSettings,
    out: Path,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Solve every task in turn, writing each task's record to ``out`` (JSON lines) as it finishes; the records."""
    records = []
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as file:
        for task in tasks:
            record = solve(client, task, settings)
            file.write(json.dumps(record) + "\n")
            file.flush()
            records.append(record)
            if progress is not None:
                progress(record)
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Pass rate, model calls, mean latency per call (answered calls), and the failed calls."""
    latencies = [call["response"]["latency_s"] for record in records for call in record["calls"] if "response" in call]
    passed = sum(record["passed"] for record in records)
    return {
        "tasks": len(records),
        "passed": passed,
        "pass_rate": passed / len(records) if records else None,
        "requests": len(latencies),
        "mean_latency_s": sum(latencies) / len(latencies) if latencies else None,
        "mean_turns": sum(record["turns"] for record in records) / len(records) if records else None,
        "errors": [record["error"] for record in records if record["error"] is not None],
    }
