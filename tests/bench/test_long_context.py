"""Long-context questions (``bench --context-lengths``): standard-library source cut to each length, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import bench_args, chat_model_dirs

from quickdraft.bench.long_context import long_context_questions, source_lines
from quickdraft.bench.settings import BenchSettings
from quickdraft.cli import main
from quickdraft.errors import ConfigError

__all__ = ["chat_model_dirs"]  # the fixture, used here by name


def characters(text: str) -> int:
    """A stand-in tokenizer: four characters a token."""
    return len(text) // 4


def test_each_question_fills_its_length_less_the_answer_and_asks_about_its_last_function() -> None:
    questions = long_context_questions([4096, 1024], 128, characters)
    assert [question.category for question in questions] == ["context-1024", "context-4096"]
    for question, length in zip(questions, (1024, 4096), strict=True):
        prompt = question.turns[0]
        assert length - 128 - 40 <= characters(prompt) <= length - 128  # the longest cut at a line that fits
        last_function = next(line for line in reversed(prompt.splitlines()) if line.lstrip().startswith("def "))
        assert f"`{last_function.split('def ', 1)[1].split('(')[0]}`" in prompt.splitlines()[-1]
    assert questions[0].turns[0].startswith("# ---- typing.py ----")  # the same text on every run
    assert len(source_lines()) > 20_000


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([100], "at least 64 tokens beyond"),  # no room for a context beside a 128-token answer
        ([1024, 1024], "distinct"),
        ([65_536], "exceed the 32768 positions the model holds"),
        ([10**8], "fills fewer than"),
    ],
)
def test_lengths_that_cannot_be_asked_are_refused(lengths: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        long_context_questions(lengths, 128, characters, max_context=32_768 if lengths != [10**8] else None)


def test_bench_asks_long_context_questions_and_times_the_answer_apart(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = bench_args(chat_model_dirs, tmp_path / "unused", tmp_path / "out", "--methods", "prompt-lookup:2", "--json")
    args[1:3] = ["--context-lengths", "200,120"]  # instead of --questions
    del args[args.index("--per-category") : args.index("--per-category") + 2]  # a question file's sample
    assert main(args) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["config"]["categories"] == ["context-120", "context-200"]
    assert results["config"]["questions"].endswith("standard library")
    for name in ("baseline", "prompt-lookup:2"):  # the answer timed apart from the prompt's reading
        overall = results["methods"][name]["overall"]
        assert overall["prefill_s"] > 0 and overall["decode_tokens_per_s"] > 0
    for line in (tmp_path / "out" / "entries.jsonl").read_text().splitlines():
        entry = json.loads(line)  # which rate is higher depends on the machine: a timed test would only guess
        assert 0 < entry["prefill_s"] < entry["wall_time_s"]
    assert results["methods"]["prompt-lookup:2"]["overall"]["decode_speedup"] > 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "speedup after the prompt" in report and "(one per context length)" in report and "seed" not in report
    assert "no draft model" in report  # prompt lookup loads none
    assert main([*args, "--question-seed", "3", "--per-category", "2"]) == 1
    assert "--per-category, --question-seed draw a sample of a question file" in capsys.readouterr().err
    args[2] = "120,9999"
    assert main(args) == 1  # longer than the tiny model's 512 positions: a clear error before anything runs
    assert "exceed the 512 positions the model holds" in capsys.readouterr().err
    args[2] = "120,300"
    assert main([*args, "--max-context", "256"]) == 1  # or than the cap on them
    assert (
        "300 tokens exceed the 256 positions the model holds (its context, or --max-context)" in capsys.readouterr().err
    )
    args[1:3] = ["--context-lengths", "1024,x"]
    assert main(args) == 1 and "comma-separated token counts" in capsys.readouterr().err
    args[1:3] = ["--context-lengths", "50"]
    assert main(args) == 1 and "at least 64 tokens beyond --max-new-tokens" in capsys.readouterr().err


def test_lengths_are_checked_before_any_model_is_resolved() -> None:
    with pytest.raises(ConfigError, match="distinct lengths"):
        BenchSettings(context_lengths=(4096, 4096))
    with pytest.raises(ConfigError, match="two question sets"):
        BenchSettings(context_lengths=(4096,), questions=Path("question.jsonl"))
