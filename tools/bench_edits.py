"""Predicted outputs on a code-edit workload: plain decoding, the default drafter, and the default drafter given the
original file as the prediction (OpenAI's Predicted Outputs), greedy, one process, taking turns.

    .venv/bin/python tools/bench_edits.py [--files N] [--min-lines 100] [--max-lines 200] [--out FILE.json]
        [--methods plain,default,predicted[,suffix,prompt-lookup]]

Each task is a module of Python's own standard library (read from this interpreter's installation, nothing
downloaded) of min-lines..max-lines lines and the instruction to rename one of its top-level functions everywhere
and reply with the whole file: an edit that changes few lines. The chat prompt holds the file; the prediction is
the file as it is. Reported per task and overall: wall time with the prompt's reading (what a user waits for) and
decoding alone (after the first token), the speedup of each method over plain decoding, the share of lines the
answer changed, and whether every method gave plain decoding's tokens.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import random
import sysconfig
import time
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig

ALL_METHODS = {
    "plain": ("none", False), "default": ("hybrid", False), "predicted": ("hybrid", True),
    "suffix": ("suffix", False), "prompt-lookup": ("prompt-lookup", False),
}  # fmt: skip


def edit_tasks(count: int, min_lines: int, max_lines: int, seed: int = 0) -> list[tuple[str, str, str, str]]:
    """(module name, source, old function name, new name) for ``count`` standard-library modules."""
    tasks = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        if not min_lines <= source.count("\n") <= max_lines or path.name.startswith("_"):
            continue
        try:
            functions = [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
        except SyntaxError:
            continue
        functions = [name for name in functions if not name.startswith("_") and source.count(name) >= 2]
        if functions:
            tasks.append((path.stem, source, functions[0], f"{functions[0]}_renamed"))
    random.Random(seed).shuffle(tasks)
    return tasks[:count]


def changed_lines(original: str, answer: str) -> float:
    """The share of the original's lines the answer does not keep as they are."""
    body = answer.split("```python\n", 1)[-1].split("```", 1)[0] if "```" in answer else answer
    kept = sum(
        block.size
        for block in difflib.SequenceMatcher(None, original.splitlines(), body.splitlines()).get_matching_blocks()
    )
    return 1.0 - kept / max(1, len(original.splitlines()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--min-lines", type=int, default=100)
    parser.add_argument("--max-lines", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--methods", default="plain,default,predicted", help=f"of {', '.join(ALL_METHODS)}")
    args = parser.parse_args()
    methods = {name: ALL_METHODS[name] for name in args.methods.split(",")}
    if "plain" not in methods:
        raise SystemExit("--methods needs plain: the speedups are over it")
    pipeline = Pipeline.load()
    tasks = edit_tasks(args.files, args.min_lines, args.max_lines)
    rows = []
    for index, (module, source, old, new) in enumerate(tasks):
        instruction = (
            f"Rename the function `{old}` to `{new}` everywhere in this file (its definition and every use). "
            f"Reply with the whole updated file in one Python code block and nothing else.\n\n```python\n{source}```"
        )
        prompt_ids = pipeline.encode(instruction, chat=True)
        prediction_ids = pipeline.encode(source)
        config = GenerationConfig(max_new_tokens=int(1.2 * len(prediction_ids)) + 64)
        order = list(methods) if index % 2 == 0 else list(reversed(methods))
        results, token_ids, texts = {}, {}, {}
        for method in order:
            drafter, predicted = methods[method]
            started = time.perf_counter()
            result = pipeline.generate(prompt_ids, config, drafter, prediction=prediction_ids if predicted else None)
            wall_s = time.perf_counter() - started
            stats = result.stats
            decode_s = wall_s - stats.step_times_s[0]  # after the first token: the prompt's reading left out
            token_ids[method], texts[method] = result.token_ids, result.text
            results[method] = {
                "tokens": len(result.token_ids),
                "wall_s": round(wall_s, 3),
                "decode_s": round(decode_s, 3),
                "tokens_per_s": round(len(result.token_ids) / wall_s, 2),
                "decode_tokens_per_s": round((len(result.token_ids) - 1) / decode_s, 2),
                "mean_accepted_tokens": round(stats.mean_accepted_tokens or 0.0, 3),
                "predicted_tokens_accepted": stats.predicted_tokens_accepted,
            }
        row = {"module": module, "lines": source.count("\n"), "prompt_tokens": len(prompt_ids)}
        row["prediction_tokens"] = len(prediction_ids)
        row["changed_lines"] = round(changed_lines(source, texts["plain"]), 3)
        row["identical"] = all(ids == token_ids["plain"] for ids in token_ids.values())
        rows.append(row | {method: results[method] for method in methods})
        print(json.dumps(rows[-1]), flush=True)
    summary: dict[str, object] = {"identical": all(row["identical"] for row in rows)}
    for method in methods:  # tokens/s over all tasks (the same tokens for every method), as a ratio to plain's
        for name, key in (("speedup", "wall_s"), ("decode_speedup", "decode_s")):
            plain_s, method_s = (sum(row[m][key] for row in rows) for m in ("plain", method))
            summary[f"{method} {name}"] = round(plain_s / method_s, 3)
    print(json.dumps({"summary": summary}))
    if args.out:
        args.out.write_text(json.dumps({"tasks": rows, "summary": summary}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
