"""Question files (Spec-Bench, MT-Bench, HumanEval and its infilling rows, GSM8K), their errors and the seeded
stratified sample."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from bench_helpers import SPEC_ROWS, write_jsonl

from quickdraft.bench.questions import keep_categories, load_questions, sample_questions
from quickdraft.errors import ConfigError


def test_spec_bench_groups_mt_bench_categories(tmp_path: Path) -> None:
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", SPEC_ROWS))
    assert [q.category for q in questions] == ["mt_bench", "mt_bench", "translation", "translation", "summarization"]
    assert questions[0].turns == ("w1 w2 w3", "w4 w5") and questions[0].question_id == "1"


def test_mt_bench_alone_keeps_its_categories(tmp_path: Path) -> None:
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", SPEC_ROWS[:2]))
    assert [q.category for q in questions] == ["writing", "coding"]


def test_humaneval_and_gsm8k_formats(tmp_path: Path) -> None:
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "x"}) + "\n")
    (humaneval,) = load_questions(path)
    assert (humaneval.category, humaneval.chat, humaneval.turns) == ("humaneval", False, ("def f():\n",))
    infill = {"task_id": "HumanEval/0/middle", "prompt": "def f():\n", "suffix": "    return x\n"}
    middle, at_the_end = load_questions(write_jsonl(tmp_path / "infill.jsonl", [infill, infill | {
        "task_id": "HumanEval/1/end", "suffix": ""}]))  # fmt: skip
    assert at_the_end.suffix == ""
    assert (middle.category, middle.chat, middle.turns, middle.suffix) == (
        "infill",
        False,
        ("def f():\n",),
        "    return x\n",
    )
    gsm = load_questions(write_jsonl(tmp_path / "test.jsonl", [{"question": "2+2?", "answer": "4"}] * 2))
    assert [q.category for q in gsm] == ["gsm8k", "gsm8k"] and gsm[1].question_id == "2"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{"broken\n', "line 2 of"),
        ('{"x": 1}\n', "unknown format"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"question_id": 1, "category": "qa", "turns": [""]}\n', "empty"),
        ('{"question_id": 1, "category": ["qa"], "turns": ["hi"]}\n', "'category' must hold non-empty text"),
        ('{"question_id": 1, "category": "qa", "turns": [["hi"]]}\n', "'turns' must hold non-empty text"),
        ('{"question_id": 1, "category": "qa", "turns": []}\n', "non-empty list"),
        ('{"question_id": [1], "category": "qa", "turns": ["hi"]}\n', "id must be a number or text"),
        ('{"task_id": "t", "prompt": 3}\n', "'prompt' must hold non-empty text"),
        ('{"question": null}\n', "'question' must hold non-empty text"),
        ("", "no questions"),
        (
            '{"question_id": 1, "category": "qa", "turns": ["hi"]}\n'
            '{"question_id": 1, "category": "rag", "turns": ["a"]}',
            "question_id '1' twice",  # entries are keyed by id: the second would replace the first
        ),
    ],
)
def test_bad_question_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_questions(path)


def test_missing_question_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_questions(tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match="is a directory; give a file"):
        load_questions(tmp_path)


def test_stratified_sample_is_seeded_and_per_category(tmp_path: Path) -> None:
    rows = [{"question_id": i, "category": f"c{i % 3}", "turns": ["w1"]} for i in range(30)]
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", rows))
    first = sample_questions(questions, 4, seed=7)
    assert first == sample_questions(questions, 4, seed=7)
    assert first != sample_questions(questions, 4, seed=8)
    assert [q.category for q in first] == ["c0", "c1", "c2"] * 4  # round-robin: a partial run covers all
    assert len(sample_questions(questions, 50, seed=0)) == 30
    with pytest.raises(ConfigError):
        sample_questions(questions, 0, seed=0)


def test_kept_categories_are_the_whole_samples_questions(tmp_path: Path) -> None:
    rows = [{"question_id": i, "category": ["qa", "rag", "translation"][i % 3], "turns": ["w1"]} for i in range(30)]
    sample = sample_questions(load_questions(write_jsonl(tmp_path / "q.jsonl", rows)), 4, seed=3)
    kept = keep_categories(sample, ("rag", "qa"))
    assert kept == [q for q in sample if q.category in ("qa", "rag")] and len(kept) == 8
    assert keep_categories(sample, ()) == sample
    with pytest.raises(ConfigError, match="no questions in summary; the questions have qa, rag, translation"):
        keep_categories(sample, ("rag", "summary"))
