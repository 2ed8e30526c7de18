"""Seeded and greedy decoding speed of one checkout: plain decoding, draft-model at γ 4 and the default, on the first
turn of a few Spec-Bench questions, and whether every answer equals plain decoding's.

    PYTHONPATH=CHECKOUT .venv/bin/python tools/seeded_speed.py OUT.json [--questions N] [--tokens N]

Run it for two checkouts in turns (A/B/B/A) to compare them: tokens per second of wall time, prompt included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams

METHODS = {"plain": ("none", "fixed:0"), "dm4": ("draft-model", "fixed:4"), "default": ("hybrid", "goodput")}
MODES = {"seeded": SamplingParams(temperature=0.7, seed=1), "greedy": SamplingParams()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--questions", type=int, default=6, help="questions, one per category first (default 6)")
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per answer (default 96)")
    args = parser.parse_args()
    pipeline = Pipeline.load()
    questions = sample_questions(load_questions(default_questions_path()), 1, 0)[: args.questions]
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    rates: dict[str, float] = {}
    answers: dict[str, list[list[int]]] = {}
    for mode, sampling in MODES.items():
        for name, (drafter, policy) in METHODS.items():
            warmup = GenerationConfig(max_new_tokens=8, sampling=sampling, policy=policy)
            pipeline.generate(prompts[0], warmup, drafter=drafter)
            config = GenerationConfig(max_new_tokens=args.tokens, sampling=sampling, policy=policy)
            results = [pipeline.generate(prompt, config, drafter=drafter) for prompt in prompts]
            tokens, seconds = (sum(getattr(r.stats, key) for r in results) for key in ("new_tokens", "wall_time_s"))
            rates[f"{mode} {name}"] = tokens / seconds
            answers[f"{mode} {name}"] = [result.token_ids for result in results]
            print(mode, name, round(tokens / seconds, 2), flush=True)
    for mode in MODES:
        same = all(answers[f"{mode} {name}"] == answers[f"{mode} plain"] for name in METHODS)
        print(mode, "same text as plain:", same)
    args.out.write_text(json.dumps(rates | {"texts": answers}))


if __name__ == "__main__":
    main()
