"""The coding agent: its tools on a real HumanEval task, its loop against a fake OpenAI-compatible endpoint (the
real openai client over an in-memory transport: no model, no network), and what it records."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from quickdraft.bench.agent import SYSTEM, AgentSettings, extract_code, run_agent, solve, summarize
from quickdraft.bench.agent_tools import SOLUTION, TOOLS, Task, Workspace, default_humaneval_path, load_tasks

TOY = Task(
    "Toy/0",
    'from typing import List\n\n\ndef add(a: int, b: int) -> int:\n    """a + b"""\n',
    "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "add",
)
RIGHT = "def add(a: int, b: int) -> int:\n    return a + b\n"
WRONG = "def add(a: int, b: int) -> int:\n    return a - b\n"


@pytest.fixture(scope="module")
def humaneval_0() -> Task:
    if default_humaneval_path() is None:
        pytest.skip("no ../shared/data/humaneval/HumanEval.jsonl.gz beside the repository")
    task = load_tasks()[0]
    assert task.task_id == "HumanEval/0" and task.entry_point == "has_close_elements"
    return task


def test_write_and_read_stay_inside_the_workspace(tmp_path: Path) -> None:
    root, outside = tmp_path / "work", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    workspace = Workspace(root, TOY)
    for path in ("../escape.py", str(outside / "x.py"), "a/../../escape.py", "link/x.py", "", ".", None):
        text, run = workspace.call("write_file", json.dumps({"path": path, "content": "x = 1\n"}))
        assert text.startswith("error:") and run is None, path
    assert not list(outside.iterdir()) and not (tmp_path / "escape.py").exists()
    assert workspace.call("read_file", json.dumps({"path": "../work/../../etc/passwd"}))[0].startswith("error:")
    assert workspace.call("write_file", json.dumps({"path": "pkg/a.py", "content": "x = 1\n"}))[0].startswith("wrote")
    assert workspace.call("read_file", json.dumps({"path": "pkg/a.py"})) == ("x = 1\n", None)
    assert workspace.call("read_file", '{"path": "missing.py"}')[0] == "error: no such file: missing.py"
    assert workspace.call("write_file", "{not json")[0].startswith("error: the arguments are not JSON")
    assert workspace.call("delete_everything", "{}")[0].startswith("error: no tool 'delete_everything'")


def test_run_tests_passes_the_canonical_solution_and_fails_a_wrong_one(tmp_path: Path, humaneval_0: Task) -> None:
    workspace = Workspace(tmp_path, humaneval_0)
    assert not workspace.run_tests().passed  # nothing written yet
    workspace.write_file(SOLUTION, humaneval_0.prompt + humaneval_0.canonical_solution)
    run = workspace.run_tests()
    assert run.passed and not run.timed_out and run.report().startswith("PASSED")
    workspace.write_file(SOLUTION, "def has_close_elements(numbers, threshold):\n    return False\n")
    run = workspace.run_tests()
    assert not run.passed and "AssertionError" in run.output and run.report().startswith("FAILED")
    workspace.write_file(SOLUTION, "import sys\nsys.exit(0)\n")  # exiting cleanly before the tests is no pass
    assert not workspace.run_tests().passed


def test_run_tests_kills_a_solution_that_runs_past_the_timeout(tmp_path: Path, humaneval_0: Task) -> None:
    """A child that keeps the output pipe open is killed too (the whole process group)."""
    workspace = Workspace(tmp_path, humaneval_0, test_timeout_s=1.0)
    spawn = f"import subprocess\nsubprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(60)'])\n"
    workspace.write_file(
        SOLUTION, spawn + "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    )
    started = time.monotonic()
    run = workspace.run_tests()
    assert run.timed_out and not run.passed and "timed out after 1 s" in run.output
    assert time.monotonic() - started < 15


def test_extract_code_takes_the_block_that_defines_the_function() -> None:
    answer = f"Here:\n```python\nprint('example')\n```\nand\n```python\n{RIGHT}```\n"
    assert extract_code(answer, "add") == RIGHT
    assert extract_code("```\nx = 1\n```", "add") == "x = 1\n"
    assert extract_code(f"```python\n{RIGHT}", "add") == RIGHT  # cut off by the token limit
    assert extract_code(RIGHT, "add") == RIGHT  # no fence, but the function and valid python
    assert extract_code("I would add the numbers.", "add") is None


class FakeEndpoint:
    """Answers /v1/chat/completions with scripted completions, keeping every request body it received."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        self.requests.append(json.loads(request.content))
        return httpx.Response(200, json=self.answers.pop(0))

    def client(self) -> openai.OpenAI:
        http = httpx.Client(transport=httpx.MockTransport(self))
        return openai.OpenAI(base_url="http://agent.test/v1", api_key="unused", http_client=http, max_retries=0)


def completion(content: str | None = None, calls: tuple[tuple[str, dict], ...] = ()) -> dict[str, Any]:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        for i, (name, arguments) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls or None}
    choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
    usage = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice],
            "usage": usage}  # fmt: skip


@pytest.fixture
def settings() -> Iterator[AgentSettings]:
    yield AgentSettings(model="m", max_tokens=64, extra_body={"drafter": "none"}, test_timeout_s=20.0)


def test_a_tool_turn_then_a_passing_answer_stops_at_the_pass(tmp_path: Path, settings: AgentSettings) -> None:
    endpoint = FakeEndpoint([
        completion("Trying.", (("write_file", {"path": SOLUTION, "content": WRONG}), ("run_tests", {}))),
        completion(f"Fixed:\n```python\n{RIGHT}```"),
        completion("never asked for"),
    ])  # fmt: skip
    out = tmp_path / "agent.jsonl"
    (record,) = run_agent(endpoint.client(), [TOY], settings, out)
    assert (record["passed"], record["turns"], record["error"]) == (True, 2, None)
    assert len(endpoint.requests) == 2 and len(endpoint.answers) == 1
    first, second = endpoint.requests
    assert [m["role"] for m in first["messages"]] == ["system", "user"] and first["messages"][0]["content"] == SYSTEM
    assert first["tools"] == TOOLS and first["tool_choice"] == "auto" and first["max_tokens"] == 64
    assert first["temperature"] == 0 and first["drafter"] == "none"  # greedy; extra_body goes along
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool", "tool"]
    assert second["messages"][2]["tool_calls"][0]["function"]["name"] == "write_file"
    assert second["messages"][4]["tool_call_id"] == "call_1" and second["messages"][4]["content"].startswith("FAILED")
    (line,) = out.read_text(encoding="utf-8").splitlines()
    saved = json.loads(line)
    assert saved == json.loads(json.dumps(record)) and saved["task_id"] == "Toy/0"
    for call, sent in zip(saved["calls"], endpoint.requests, strict=True):  # every request, exactly as sent
        assert {key: sent[key] for key in ("messages", "tools", "tool_choice", "max_tokens")} == {
            key: call["request"][key] for key in ("messages", "tools", "tool_choice", "max_tokens")
        }
        assert call["response"]["usage"]["completion_tokens"] == 12 and call["response"]["latency_s"] >= 0
    assert saved["calls"][0]["response"]["finish_reason"] == "tool_calls"
    assert saved["calls"][0]["response"]["tool_calls"][1]["function"] == {"name": "run_tests", "arguments": "{}"}
    assert summarize([record]) | {"mean_latency_s": None} == {
        "tasks": 1, "passed": 1, "pass_rate": 1.0, "requests": 2, "mean_latency_s": None, "mean_turns": 2.0,
        "errors": [],
    }  # fmt: skip


def test_six_failing_answers_stop_at_six_each_rewriting_the_last(tmp_path: Path, settings: AgentSettings) -> None:
    endpoint = FakeEndpoint([completion(f"```python\n{WRONG}```") for _ in range(8)])
    record = solve(endpoint.client(), TOY, settings)
    assert (record["passed"], record["turns"], len(endpoint.requests)) == (False, 6, 6)
    for turn, sent in enumerate(endpoint.requests):  # each turn: the last answer and its failure, then a rewrite
        assert len(sent["messages"]) == 2 + 2 * turn
        if turn:
            assert sent["messages"][-2]["content"] == f"```python\n{WRONG}```"
            assert sent["messages"][-1]["content"].startswith("The tests failed:")
            assert "AssertionError" in sent["messages"][-1]["content"]
    assert [call["request"]["messages"] for call in record["calls"]] == [r["messages"] for r in endpoint.requests]


def test_a_failed_call_ends_the_task_and_is_recorded(tmp_path: Path, settings: AgentSettings) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "too long", "type": "invalid_request_error"}})

    http = httpx.Client(transport=httpx.MockTransport(refuse))
    client = openai.OpenAI(base_url="http://agent.test/v1", api_key="unused", http_client=http, max_retries=0)
    record = solve(client, TOY, settings)
    assert (record["passed"], record["turns"]) == (False, 1) and "BadRequestError" in record["error"]
    assert "response" not in record["calls"][0] and record["calls"][0]["request"]["messages"][1]["role"] == "user"


def test_the_command_line_explains_itself(capsys: pytest.CaptureFixture) -> None:
    path = Path(__file__).resolve().parents[2] / "tools" / "agent_run.py"
    spec = importlib.util.spec_from_file_location("agent_run", path)
    assert spec is not None and spec.loader is not None
    agent_run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_run)
    with pytest.raises(SystemExit) as exit_:
        agent_run.parse_args(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for words in ("--url", "--tasks", "--out", "--extra-body", "--max-tokens", "bench-serve --workload agent"):
        assert words in text
    with pytest.raises(SystemExit):
        agent_run.parse_args(["--url", "http://127.0.0.1:1", "--out", "x.jsonl", "--extra-body", "[1]"])
    assert "--extra-body must be a JSON object" in capsys.readouterr().err
