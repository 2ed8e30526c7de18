"""Structured output on the default pair: Spec-Bench first turns answered under a JSON schema, by constrained plain
decoding and by the default drafter (hybrid, goodput) under the same constraint, greedy, taking turns.

    .venv/bin/python tools/bench_structured.py [--per-category 2] [--max-new-tokens 160] [--out FILE.json]

Reported per answer: whether the two are the same tokens, whether the answer parses as JSON and has the schema's
required keys with their types (when it ended within the budget), and both methods' tokens/s.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig
from quickdraft.grammar import GrammarKind, GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "answer": {"type": "string"},
        "key_points": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "confidence": {"type": "number"},
    },
    "required": ["topic", "answer", "key_points", "confidence"],
}
TYPES = {"topic": str, "answer": str, "key_points": list, "confidence": (int, float)}


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return isinstance(value, dict) and all(isinstance(value.get(key), kind) for key, kind in TYPES.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pipeline = Pipeline.load()
    grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, grammar=grammar)
    questions = sample_questions(load_questions(default_questions_path()), args.per_category, 0)
    rows = []
    for index, question in enumerate(questions):
        instruction = f"{question.turns[0]}\n\nAnswer in JSON with the keys topic, answer, key_points, confidence."
        prompt_ids = pipeline.encode(instruction, chat=True)
        results = {}
        for drafter in ("none", "hybrid") if index % 2 == 0 else ("hybrid", "none"):
            started = time.perf_counter()
            result = pipeline.generate(prompt_ids, config, drafter)
            results[drafter] = (result, time.perf_counter() - started)
        (plain, plain_s), (spec, spec_s) = results["none"], results["hybrid"]
        row = {
            "question_id": question.question_id,
            "category": question.category,
            "tokens": len(plain.token_ids),
            "finish_reason": plain.finish_reason,
            "identical": plain.token_ids == spec.token_ids,
            "valid": valid(plain.text) if plain.finish_reason != "length" else None,
            "plain_tokens_per_s": round(len(plain.token_ids) / plain_s, 2),
            "default_tokens_per_s": round(len(spec.token_ids) / spec_s, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    ended = [row for row in rows if row["valid"] is not None]
    plain_s = sum(row["tokens"] / row["plain_tokens_per_s"] for row in rows)
    spec_s = sum(row["tokens"] / row["default_tokens_per_s"] for row in rows)
    summary = {
        "answers": len(rows),
        "identical": sum(row["identical"] for row in rows),
        "ended_within_budget": len(ended),
        "valid": sum(bool(row["valid"]) for row in ended),
        "default_speedup": round(plain_s / spec_s, 3),
    }
    print(json.dumps({"summary": summary}))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
