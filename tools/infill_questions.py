"""Fill-in-the-middle questions from HumanEval, in HumanEval infilling's row format (task_id, prompt, suffix), for
``quickdraft bench --questions``: each function's canonical solution with its middle third of lines (at least one)
left out; the prompt is the function's signature and docstring with the lines before, the suffix the lines after.
Functions of fewer than three solution lines are skipped. A test set: for benchmarks, never for training.

    .venv/bin/python tools/infill_questions.py ../shared/data/humaneval/HumanEval.jsonl.gz /tmp/humaneval-infill.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path


def infill_rows(problems: list[dict]) -> list[dict]:
    rows = []
    for problem in problems:
        lines = problem["canonical_solution"].splitlines(keepends=True)
        if len(lines) < 3:
            continue
        start = len(lines) // 3
        end = start + max(1, len(lines) // 3)
        suffix = "".join(lines[end:])
        if not suffix.strip():
            continue
        rows.append({
            "task_id": f"{problem['task_id']}/middle",
            "prompt": problem["prompt"] + "".join(lines[:start]),
            "suffix": suffix,
            "canonical_middle": "".join(lines[start:end]),
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("humaneval", type=Path, help="HumanEval.jsonl.gz")
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    args = parser.parse_args()
    with gzip.open(args.humaneval, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    rows = infill_rows(problems)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"{len(rows)} of {len(problems)} functions written to {args.out}")


if __name__ == "__main__":
    main()
