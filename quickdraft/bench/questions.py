"""Benchmark prompt sets: Spec-Bench / MT-Bench, HumanEval (and its infilling rows) and GSM8K files, read where they
lie.

Every format becomes a list of :class:`Question`. Spec-Bench groups the eight MT-Bench
categories into one subtask, ``mt_bench``; so do we when a file holds Spec-Bench subtasks.
"""

from __future__ import annotations

import gzip
import itertools
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from quickdraft.errors import ConfigError
from quickdraft.files import input_file

MT_BENCH_CATEGORIES = frozenset(
    {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
)
SPEC_BENCH_SUBTASKS = frozenset({"translation", "summarization", "qa", "math_reasoning", "rag"})
DEFAULT_QUESTIONS = Path("shared") / "data" / "spec_bench" / "question.jsonl"  # beside the repository


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]  # user turns, answered one after another with the model's own answers in the history
    chat: bool = True  # False: complete the text as is (HumanEval), no chat template
    suffix: str | None = None  # fill in the middle: the answer goes between the one turn and this ("": the end)

    def __post_init__(self) -> None:
        if not self.turns or any(not isinstance(turn, str) or not turn.strip() for turn in self.turns):
            raise ConfigError(f"question {self.question_id} has an empty or missing turn")


def default_questions_path() -> Path | None:
    """``../shared/data/spec_bench/question.jsonl`` seen from the working directory or from the repository."""
    bases = (Path.cwd().parent, Path(__file__).resolve().parents[3])
    return next((path for base in bases if (path := base / DEFAULT_QUESTIONS).is_file()), None)


def load_questions(path: str | Path) -> list[Question]:
    """Read a question file; the format is recognised per line (``turns``, ``question`` or ``prompt``)."""
    path = input_file("--questions", path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            questions = [_parse_row(line, path, number) for number, line in enumerate(lines, start=1) if line.strip()]
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise ConfigError(f"--questions: cannot read {path}: {error}") from None
    if not questions:
        raise ConfigError(f"--questions: {path} holds no questions")
    seen: set[str] = set()
    for question in questions:  # entries are keyed by id: a second question of one id would replace the first
        if question.question_id in seen:
            raise ConfigError(f"--questions: {path} holds question_id {question.question_id!r} twice")
        seen.add(question.question_id)
    if SPEC_BENCH_SUBTASKS & {q.category for q in questions}:
        questions = [replace(q, category="mt_bench") if q.category in MT_BENCH_CATEGORIES else q for q in questions]
    return questions


def sample_questions(questions: list[Question], per_category: int | None, seed: int) -> list[Question]:
    """A seeded, stratified sample of ``per_category`` questions per category (all if None).

    The sample is ordered round-robin over the categories (file order within each), so a run that
    is stopped part-way, and resumed later, has covered every category alike.
    """
    if per_category is not None and per_category < 1:
        raise ConfigError(f"--per-category must be >= 1, got {per_category}")
    rng = random.Random(seed)
    by_category: dict[str, list[int]] = {}
    for index, question in enumerate(questions):
        by_category.setdefault(question.category, []).append(index)
    columns = [
        indices if per_category is None else sorted(rng.sample(indices, min(per_category, len(indices))))
        for indices in by_category.values()
    ]
    rounds = itertools.zip_longest(*columns)
    return [questions[i] for round_ in rounds for i in round_ if i is not None]


def _parse_row(line: str, path: Path, number: int) -> Question:
    where = f"line {number} of {path}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--questions: {where} is not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise ConfigError(f"--questions: {where} is not a JSON object")
    if "turns" in row:  # Spec-Bench / MT-Bench
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or "category" not in row:
            raise ConfigError(f"--questions: {where}: 'turns' must be a non-empty list and 'category' present")
        turns = tuple(_text(turn, "turns", where) for turn in turns)
        return Question(_id(row.get("question_id", number), where), _text(row["category"], "category", where), turns)
    if "prompt" in row and "suffix" in row and "task_id" in row:  # HumanEval infilling: the middle of a function
        task, turn = _id(row["task_id"], where), (_text(row["prompt"], "prompt", where),)
        if not isinstance(row["suffix"], str):
            raise ConfigError(f"--questions: {where}: 'suffix' must be text, got {row['suffix']!r}")
        return Question(task, "infill", turn, chat=False, suffix=row["suffix"])
    if "prompt" in row and "task_id" in row:  # HumanEval: complete the function
        return Question(_id(row["task_id"], where), "humaneval", (_text(row["prompt"], "prompt", where),), chat=False)
    if "question" in row:  # GSM8K
        return Question(_id(row.get("id", number), where), "gsm8k", (_text(row["question"], "question", where),))
    raise ConfigError(
        f"--questions: {where}: unknown format; expected Spec-Bench/MT-Bench rows (question_id, category, turns), "
        f"HumanEval rows (task_id, prompt), HumanEval infilling rows (task_id, prompt, suffix) or GSM8K rows "
        f"(question)"
    )


def _text(value: object, name: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"--questions: {where}: {name!r} must hold non-empty text, got {value!r}")
    return value


def _id(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise ConfigError(f"--questions: {where}: a question's id must be a number or text, got {value!r}")
    return str(value)


def keep_categories(questions: list[Question], categories: tuple[str, ...]) -> list[Question]:
    """The questions of ``categories`` only (all when empty), in their order. Applied to a sample, it keeps the
    questions the whole file's sample holds in those categories, so a partial bench reruns part of a full one. A
    name the questions lack is an error that lists the names they have."""
    if not categories:
        return questions
    present = list(dict.fromkeys(question.category for question in questions))
    unknown = [category for category in categories if category not in present]
    if unknown:
        have = ", ".join(present)
        raise ConfigError(f"--categories: no questions in {', '.join(unknown)}; the questions have {have}")
    return [question for question in questions if question.category in categories]
