"""``bench-serve --workload agent``: recorded agent conversations become requests with their messages and tools,
the lossless reference encodes them as the server does, and a replay against a tiny served model is lossless."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import native_pipeline

from quickdraft.bench.agent_tools import TOOLS
from quickdraft.bench.base import GREEDY
from quickdraft.bench.serve_load import Prompt
from quickdraft.bench.workloads import agent_prompts, requests_digest, served_input, workload_prompts
from quickdraft.cli import main
from quickdraft.errors import ConfigError
from quickdraft.server.tool_formats import HERMES

# a Hermes-format template over the word tokenizer (its words w0 .. w30): tools, calls and tool turns rendered
HERMES_WORDS = (
    "{% if tools %}w1 {% for t in tools %}{{ t.function.name }} {% endfor %}" + HERMES.marker + " w1 {% endif %}"
    "{% for m in messages %}w2 {{ m.role }} {{ m.content or '' }} {% for c in m.tool_calls or [] %}" + HERMES.marker +
    " {{ c.function.name }} {{ c.function.arguments | tojson }} w4 {% endfor %}{% endfor %}w3 "
)  # fmt: skip
SYSTEM = {"role": "system", "content": "w5 w6 w7"}
USER = {"role": "user", "content": "w8 w9 w10 w8 w9 w10"}
CALL = {"id": "call_0", "type": "function",
        "function": {"name": "write_file", "arguments": '{"path": "solution.py", "content": "w11 w12"}'}}  # fmt: skip


def call(turn: int, messages: list[dict[str, Any]], answered: bool = True, max_tokens: int = 6) -> dict[str, Any]:
    request = {"messages": messages, "tools": TOOLS, "tool_choice": "auto", "max_tokens": max_tokens,
               "temperature": 0.0}  # fmt: skip
    if not answered:
        return {"turn": turn, "request": request, "error": "APITimeoutError: timed out", "latency_s": 1.0}
    answer = {"content": "w13", "tool_calls": [], "finish_reason": "stop", "usage": None, "latency_s": 0.5}
    return {"turn": turn, "request": request, "response": answer}


def write_conversations(path: Path) -> Path:
    """Two tasks as tools/agent_run.py records them: a tool turn and its result; a plain answer rewritten after
    its failure, then a call that failed."""
    tool_turn = [SYSTEM, USER, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "call_0", "content": "w14 w15 w11 w12"}]  # fmt: skip
    rewrite = [SYSTEM, USER, {"role": "assistant", "content": "w11 w12 w16"}, {"role": "user", "content": "w17 w11"}]
    records = [
        {"task_id": "Toy/0", "passed": True, "turns": 2, "error": None,
         "calls": [call(1, [SYSTEM, USER]), call(2, tool_turn, max_tokens=5)]},
        {"task_id": "Toy/1", "passed": False, "turns": 3, "error": "APITimeoutError: timed out",
         "calls": [call(1, [SYSTEM, USER]), call(2, rewrite), call(3, rewrite, answered=False)]},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_recorded_calls_become_requests_with_their_messages_and_tools(tmp_path: Path) -> None:
    prompts = agent_prompts(write_conversations(tmp_path / "agent.jsonl"))
    assert [prompt.question_id for prompt in prompts] == ["Toy/0#1", "Toy/0#2", "Toy/1#1", "Toy/1#2"]  # no failed
    assert [prompt.max_tokens for prompt in prompts] == [6, 5, 6, 6]
    chat = prompts[1].chat()
    assert chat["messages"][2]["tool_calls"] == [CALL] and chat["messages"][3]["role"] == "tool"
    assert chat["tools"] == TOOLS and chat["tool_choice"] == "auto"
    chat["messages"].clear()  # the client gets copies
    assert len(prompts[1].chat()["messages"]) == 4
    assert [p.max_tokens for p in agent_prompts(tmp_path / "agent.jsonl", max_tokens=3)] == [3, 3, 3, 3]
    assert len(workload_prompts("agent", None, str(tmp_path / "agent.jsonl"), 3, 0, None)) == 3
    assert Prompt("1", "qa", "w1 w2").chat() == {"messages": [{"role": "user", "content": "w1 w2"}]}  # Spec-Bench
    shorter = agent_prompts(tmp_path / "agent.jsonl", max_tokens=3)
    assert requests_digest(prompts) != requests_digest(shorter) and requests_digest(prompts) == requests_digest(
        agent_prompts(tmp_path / "agent.jsonl")
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{oops", "not JSON"),
        ('{"task_id": "a"}', "not a recorded conversation"),
        ('{"task_id": "a", "calls": [{"request": {"messages": []}}]}', "needs a request with messages"),
        ('{"task_id": "a", "calls": []}', "no answered model calls"),
        ('{"task_id": "a", "calls": [{"turn": 1, "request": {"messages": [{"role": "user", "content": "w1"}]}, '
         '"response": {}}]}\n' * 2, "twice"),
    ],
)  # fmt: skip
def test_bad_conversation_files_are_clear_errors(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "agent.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=words):
        agent_prompts(path)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--workload", "agent"], "--conversations FILE"),
        (["--conversations", "agent.jsonl"], "needs --workload agent"),
        (["--workload", "agent", "--conversations", "missing.jsonl"], "no such file"),
        (["--workload", "agent", "--conversations", "a.jsonl", "--questions", "q.jsonl"], "not --questions"),
        (["--max-tokens", "0"], "--max-tokens must be >= 1"),
    ],
)
def test_workload_arguments_fail_before_any_work(
    args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["bench-serve", *args, "--out", str(tmp_path / "out")]) == 1
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_reference_encodes_a_chat_with_tools_as_the_server_does(tmp_path: Path) -> None:
    pipeline = native_pipeline()
    pipeline.tokenizer.chat_template = HERMES_WORDS
    prompt = agent_prompts(write_conversations(tmp_path / "agent.jsonl"))[1]
    prompt_ids, config = served_input(pipeline, prompt, 96, GREEDY)
    served = [SYSTEM, USER, {"role": "assistant", "content": "", "tool_calls": [
        CALL | {"function": {"name": "write_file", "arguments": {"path": "solution.py", "content": "w11 w12"}}}]},
        {"role": "tool", "content": "w14 w15 w11 w12", "tool_call_id": "call_0"}]  # fmt: skip
    assert prompt_ids == pipeline.encode_chat(served, TOOLS)  # arguments as objects, tools rendered
    assert prompt_ids != pipeline.encode_chat(served)
    assert (config.max_new_tokens, config.grammar, config.sampling) == (5, None, GREEDY)  # the call's own limit
    text_ids, text_config = served_input(pipeline, Prompt("1", "qa", "w1 w2"), 96, GREEDY)
    assert text_ids == pipeline.encode("w1 w2", chat=True) and text_config.max_new_tokens == 96
    pipeline.tokenizer.chat_template = "{% for m in messages %}{{ m.content }} {% endfor %}"  # no tool format
    with pytest.raises(ConfigError, match=r"the server would refuse it: .*tool-call format"):
        served_input(pipeline, prompt, 96, GREEDY)


def hermes_copy(source: Path, destination: Path) -> Path:
    """A copy of a tiny model directory whose chat template renders tools."""
    from transformers import AutoTokenizer

    shutil.copytree(source, destination)
    tokenizer = AutoTokenizer.from_pretrained(destination)
    tokenizer.chat_template = HERMES_WORDS
    tokenizer.save_pretrained(destination)
    return destination


def test_bench_serve_replays_recorded_agent_requests_losslessly(
    native_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    target = hermes_copy(native_model_dirs["target"], tmp_path / "target")
    draft = hermes_copy(native_model_dirs["draft"], tmp_path / "draft")
    out = tmp_path / "out"
    args = ["bench-serve", "--workload", "agent", "--conversations", str(write_conversations(tmp_path / "a.jsonl"))]
    args += ["--rates", "seq,inf", "--configs", "plain=none,fixed=draft-model+fixed:2", "--disconnect-fraction", "0"]
    args += ["--target", str(target), "--draft", str(draft), "--out", str(out), "--single-request"]
    args += ["--max-running", "4", "--prefill-tokens-per-step", "16"]
    assert main(args) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    settings = results["settings"]
    assert (settings["workload"], settings["num_prompts"], settings["max_tokens"]) == ("agent", 4, 6)
    assert [(run["config"], run["rate"]) for run in results["runs"]] == [
        (config, rate) for rate in ("seq", "inf") for config in ("plain", "fixed")
    ]
    for run in results["runs"]:
        summary = run["summary"]
        assert summary["completed"] == summary["compared"] == summary["lossless"] == 4 and not summary["errors"]
        assert [record["question_id"] for record in run["records"]] == ["Toy/0#1", "Toy/0#2", "Toy/1#1", "Toy/1#2"]
    assert set(results["single_request"]) == {"plain", "fixed"}
    references = json.loads((out / "references.json").read_text(encoding="utf-8"))
    assert references["key"]["workload"] == "agent" and len(references["outputs"]["Toy/0#2"]) <= 5
    assert "4 recorded agent requests per run" in (out / "report.md").read_text(encoding="utf-8")
