"""What several bench test files share: question rows, chat models, bench arguments, fake peers' model, entries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quickdraft.api import Pipeline
from quickdraft.bench.base import Method, TurnResult
from quickdraft.bench.metrics import Entry
from quickdraft.cli import main

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"

SPEC_ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["w1 w2 w3", "w4 w5"]},
    {"question_id": 2, "category": "coding", "turns": ["w6 w7", "w8"]},
    {"question_id": 3, "category": "translation", "turns": ["w9 w10 w11"]},
    {"question_id": 4, "category": "translation", "turns": ["w12 w13"]},
    {"question_id": 5, "category": "summarization", "turns": ["w3 w4 w5 w6 w3 w4 w5"]},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chat_model_dirs(tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Copies of the tiny target/draft directories with a chat template (multi-turn questions need one); the
    session's own directories keep having none."""
    from transformers import AutoTokenizer

    root, copies = tmp_path_factory.mktemp("chat-models"), dict(tiny_model_dirs)
    for role in ("target", "draft"):
        copies[role] = Path(shutil.copytree(tiny_model_dirs[role], root / role))
        tokenizer = AutoTokenizer.from_pretrained(copies[role])
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(copies[role])
    return copies


def bench_args(dirs: dict[str, Path], questions: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--questions",
        str(questions),
        "--target",
        str(dirs["target"]),
        "--draft",
        str(dirs["draft"]),
        "--out",
        str(out),
        "--max-new-tokens",
        "6",
        "--per-category",
        "2",
        "--profile-context",
        "16",
        *extra,
    ]


def bench_error_before_loading(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, methods: str
) -> str:
    """The one error line of a bench naming ``methods`` that cannot run here: it must stop before any model
    is loaded."""
    import quickdraft.api

    def no_loading(*args, **kwargs):
        raise AssertionError("a method that cannot run must fail before any model is loaded")

    monkeypatch.setattr(quickdraft.api.Pipeline, "load", no_loading)
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    assert main(bench_args(dirs, questions, tmp_path / "out", "--methods", methods)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    return err


EOS_ID = 31  # the tiny pipeline's end-of-sequence token


def next_word(context: list[int]) -> int:
    """The fake llama.cpp model's greedy choice: counts up 1..9 cyclically, ends after 40 positions."""
    return EOS_ID if len(context) >= 40 else context[-1] % 9 + 1


COUNTING_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # the fake peers' models count on: 3, 4, ...


def run_to_budget(pipeline: Pipeline, *methods: Method) -> list[TurnResult]:
    """Each fake peer's turn after :data:`COUNTING_PROMPT` with a budget of 20 tokens, which stops it; its
    steps add up to its tokens and are timed in order within the call."""
    results = [method.run(pipeline, COUNTING_PROMPT, max_new_tokens=20) for method in methods]
    for result in results:
        assert result.token_ids == [3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]
        assert sum(result.step_sizes) == 20 and len(result.step_times_s) == len(result.step_sizes)
        assert result.step_times_s == sorted(result.step_times_s) and result.wall_time_s >= result.step_times_s[-1]
    return results


def entry(method: str, question: str, category: str, tokens: int, seconds: float, **kw) -> Entry:
    defaults = {"run": 0, "token_ids": [1] * tokens, "step_sizes": [1] * tokens, "token_latencies_s": []}
    return Entry(method, question, category, new_tokens=tokens, wall_time_s=seconds, **(defaults | kw))
