"""The coding agent's tasks and tools: HumanEval problems, and a per-task workspace whose tools really run.

Rules:
- HumanEval is a test set: its problems are only evaluated on here, never trained on.
- Every path a tool takes is relative to the task's workspace (a temporary directory); one that resolves outside
  it (``..``, an absolute path elsewhere, a symbolic link out) is refused, and so is the workspace itself.
- ``run_tests`` runs, in a fresh ``python -I`` subprocess in the workspace: the task's prompt (its imports and
  helpers), then :data:`SOLUTION` as written, then the task's ``test`` and ``check(entry_point)``. The tests pass
  when that process prints a marker it is given only after ``check`` returned, within the timeout; a process
  still running at the timeout is killed with its whole process group. Its address space is capped
  (:data:`MEMORY_LIMIT_BYTES`).
- This is not a sandbox: the model's code runs as the user who runs the agent. Run it where that is acceptable.
- A tool's failure (a bad path, bad arguments, an unknown tool) is text the model reads, never an exception.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.errors import ConfigError

DEFAULT_HUMANEVAL = Path("shared") / "data" / "humaneval" / "HumanEval.jsonl.gz"  # beside the repository
SOLUTION = "solution.py"  # the file run_tests runs
TEST_TIMEOUT_S = 10.0
MEMORY_LIMIT_BYTES = 2 * 2**30
MAX_FILE_BYTES = 200_000  # write_file takes at most this much
READ_LIMIT_CHARS = 20_000  # read_file returns at most this much
OUTPUT_TAIL_CHARS = 1_500  # of the tests' stdout and stderr, the end

# OpenAI's function tools, as the agent offers them
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": f"Write a file in the task's directory (the solution goes to {SOLUTION}).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": f"Run the task's tests against {SOLUTION}; returns PASSED or FAILED and the output's end.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file in the task's directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
]

# Runs in the tests' subprocess; reads the task as JSON from stdin.
RUNNER = """\
import json, resource, sys
task = json.load(sys.stdin)
resource.setrlimit(resource.RLIMIT_AS, (task["memory"], task["memory"]))
namespace = {"__name__": "solution"}
exec(compile(task["prompt"], "prompt", "exec"), namespace)
with open(task["solution"], encoding="utf-8") as file:
    exec(compile(file.read(), task["solution"], "exec"), namespace)
exec(compile(task["test"], "test", "exec"), namespace)
namespace["check"](namespace[task["entry_point"]])
print(task["marker"])
"""


@dataclass(frozen=True)
class Task:
    """One HumanEval problem."""

    task_id: str
    prompt: str  # the function's signature and docstring
    test: str  # defines check(candidate)
    entry_point: str  # the function's name
    canonical_solution: str = ""  # the reference body (for tests of the harness only)


@dataclass(frozen=True)
class TestRun:
    """One run of a task's tests."""

    passed: bool
    output: str  # the end of stdout and stderr
    timed_out: bool = False

    def report(self) -> str:
        """The tool's answer: PASSED or FAILED (and why), then the output's end."""
        verdict = "PASSED" if self.passed else "FAILED" + (" (timed out)" if self.timed_out else "")
        return f"{verdict}\n{self.output}".rstrip()


class ToolError(Exception):
    """A tool refused its arguments; the message is what the model reads."""


def default_humaneval_path() -> Path | None:
    """``../shared/data/humaneval/HumanEval.jsonl.gz`` seen from the working directory or from the repository."""
    bases = (Path.cwd().parent, Path(__file__).resolve().parents[3])
    return next((path for base in bases if (path := base / DEFAULT_HUMANEVAL).is_file()), None)


def load_tasks(path: str | Path | None = None) -> list[Task]:
    """The HumanEval problems of ``path`` (gzip-compressed or plain JSON lines; default: the shared copy), in file
    order."""
    source = Path(path) if path is not None else default_humaneval_path()
    if source is None or not source.is_file():
        raise ConfigError(f"no HumanEval file: {source or DEFAULT_HUMANEVAL} (pass --tasks-file)")
    opener = gzip.open if source.suffix == ".gz" else open
    tasks = []
    with opener(source, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or not {"task_id", "prompt", "test", "entry_point"} <= row.keys():
                raise ConfigError(f"line {number} of {source} is not a HumanEval problem (task_id, prompt, test, ...)")
            tasks.append(
                Task(row["task_id"], row["prompt"], row["test"], row["entry_point"], row.get("canonical_solution", ""))
            )
    return tasks


class Workspace:
    """A task's directory and the tools that act in it."""

    def __init__(self, root: Path, task: Task, test_timeout_s: float = TEST_TIMEOUT_S) -> None:
        self.root = root.resolve()
        self.task = task
        self.test_timeout_s = test_timeout_s
        self.untested = False  # the solution changed since the tests last ran

    def path(self, name: Any) -> Path:
        """``name`` inside the workspace; ToolError for anything else."""
        if not isinstance(name, str) or not name.strip() or "\0" in name:
            raise ToolError("path must be a non-empty file name relative to the task's directory")
        resolved = (self.root / name).resolve()
        if resolved == self.root or not resolved.is_relative_to(self.root):
            raise ToolError(f"path {name!r} is outside the task's directory; use a relative path such as {SOLUTION}")
        return resolved

    def write_file(self, path: Any, content: Any) -> str:
        target = self.path(path)
        if not isinstance(content, str):
            raise ToolError("content must be text")
        if len(content.encode("utf-8", "replace")) > MAX_FILE_BYTES:
            raise ToolError(f"content is longer than {MAX_FILE_BYTES} bytes")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8", errors="replace")  # lone surrogates from JSON escapes: "?"
        self.untested |= target == self.root / SOLUTION
        return f"wrote {len(content)} characters to {target.relative_to(self.root)}"

    def read_file(self, path: Any) -> str:
        target = self.path(path)
        if not target.is_file():
            raise ToolError(f"no such file: {path}")
        text = target.read_text(encoding="utf-8", errors="replace")
        return text if len(text) <= READ_LIMIT_CHARS else text[:READ_LIMIT_CHARS] + "\n[... cut]"

    def run_tests(self) -> TestRun:
        """The task's tests against :data:`SOLUTION` (see the module's rules)."""
        if not (self.root / SOLUTION).is_file():
            return TestRun(False, f"no {SOLUTION}: write the solution there first")
        self.untested = False
        marker = f"tests-passed-{uuid.uuid4().hex}"
        task = {"prompt": self.task.prompt, "test": self.task.test, "entry_point": self.task.entry_point,
                "solution": SOLUTION, "marker": marker, "memory": MEMORY_LIMIT_BYTES}  # fmt: skip
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", RUNNER], cwd=self.root, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = process.communicate(json.dumps(task).encode(), timeout=self.test_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            text = output.decode("utf-8", "replace")
            return TestRun(False, tail(text + f"\ntimed out after {self.test_timeout_s:g} s"), timed_out=True)
        text = output.decode("utf-8", "replace")
        lines = text.rstrip().splitlines()
        passed = process.returncode == 0 and bool(lines) and lines[-1] == marker
        if passed:
            shown = "\n".join(lines[:-1]) or "all tests passed"
        elif process.returncode == 0:
            shown = text + "\n(the tests did not run to their end: did the solution exit?)"
        else:
            shown = text
        return TestRun(passed, tail(shown))

    def call(self, name: str, arguments: str) -> tuple[str, TestRun | None]:
        """Run the tool ``name`` with its JSON ``arguments``: the text the model reads, and the test run if it
        ran the tests."""
        try:
            parsed = json.loads(arguments) if arguments and arguments.strip() else {}
        except json.JSONDecodeError as error:
            return f"error: the arguments are not JSON ({error.msg})", None
        if not isinstance(parsed, dict):
            return "error: the arguments must be a JSON object", None
        try:
            if name == "write_file":
                return self.write_file(parsed.get("path"), parsed.get("content")), None
            if name == "read_file":
                return self.read_file(parsed.get("path")), None
            if name == "run_tests":
                run = self.run_tests()
                return run.report(), run
        except ToolError as error:
            return f"error: {error}", None
        except OSError as error:
            return f"error: {error.strerror or error}", None
        return f"error: no tool {name!r}; the tools are write_file, run_tests and read_file", None


def tail(text: str, limit: int = OUTPUT_TAIL_CHARS) -> str:
    """The end of ``text``, at most ``limit`` characters."""
    return text if len(text) <= limit else "[...]\n" + text[-limit:]
