"""Prefix caching on multi-turn chats: MT-Bench's two-turn questions, each second turn resending the conversation,
with the prefix cache and without it, one process, taking turns.

    .venv/bin/python tools/bench_prefix_cache.py [--questions N] [--max-new-tokens 128] [--out FILE.json]

Each question's first turn runs on both engines (the cached one keeps its conversation), then its second turn on
both: the time to the first token of the second turn (reading its prompt) with the cache and without, and whether
every answer is the same token for token. The default drafter and policy; greedy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.engine import Engine, Request, generate
from quickdraft.engine.prefix_cache import PrefixCache

MT_BENCH = Path(__file__).parents[1].parent / "shared" / "data" / "mt_bench" / "question.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--path", type=Path, default=MT_BENCH)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    questions = [json.loads(line) for line in args.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    questions = questions[:: max(1, len(questions) // args.questions)][: args.questions]  # across the categories
    pipeline = Pipeline.load()
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    pipeline.setup_policy("hybrid", config)
    drafter = pipeline.drafter("hybrid")
    store = PrefixCache(1024 * 2**20, pipeline.target.kv_bytes_per_token, pipeline.target.copy_prefix)
    engines = {
        "cached": Engine(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, prefix_cache=store),
        "uncached": Engine(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids),
    }
    rows = []
    for index, question in enumerate(questions):
        order = list(engines) if index % 2 == 0 else list(reversed(engines))
        messages = [{"role": "user", "content": question["turns"][0]}]
        request = Request(tuple(pipeline.encode_chat(messages)), config, drafter)
        first = {name: generate(engines[name], request) for name in order}
        messages += [{"role": "assistant", "content": first["uncached"].text}]
        messages += [{"role": "user", "content": question["turns"][1]}]
        prompt_ids = tuple(pipeline.encode_chat(messages))
        second = {name: generate(engines[name], Request(prompt_ids, config, drafter)) for name in order}
        row = {
            "question_id": question["question_id"],
            "category": question["category"],
            "prompt_tokens": len(prompt_ids),
            "cached_tokens": second["cached"].stats.cached_prompt_tokens,
            "ttft_s": {name: round(result.stats.step_times_s[0], 4) for name, result in second.items()},
            "identical": first["cached"].token_ids == first["uncached"].token_ids
            and second["cached"].token_ids == second["uncached"].token_ids,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    ttft = {name: sum(row["ttft_s"][name] for row in rows) / len(rows) for name in engines}
    summary = {
        "questions": len(rows),
        "mean_ttft_s": {name: round(value, 4) for name, value in ttft.items()},
        "ttft_ratio": round(ttft["cached"] / ttft["uncached"], 3),
        "identical": all(row["identical"] for row in rows),
    }
    print(json.dumps({"summary": summary}))
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
