"""Does one seed stand for seeded sampling? The default (hybrid-suffix + goodput) and seeded plain decoding at
TEMPERATURE with SEED, taking turns question by question, on the first turns of the bench's 18-question sample (3 per
category, question seed 0), 128 new tokens: the default's tokens per target step and acceptance, and its speedup
(mean tokens/s over plain decoding's, the prompt included, as the bench computes it) and after the prompts. A probe
kept beside its output (seed_variance.txt).

    cd /tmp && for s in 1 2 3 4 5; do python results/zen5-26/seed_variance.py 0.7 $s; done

Run one seed per process: within a process the suffix drafter keeps earlier answers, and a later seed's answers to
the same questions copy from them.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams


def main() -> None:
    temperature, seed = float(sys.argv[1]), int(sys.argv[2])
    pipeline = Pipeline.load()
    questions = sample_questions(load_questions(default_questions_path()), 3, 0)
    pipeline.generate(questions[0].turns[0], GenerationConfig(max_new_tokens=16), chat=True)  # untimed
    config = GenerationConfig(max_new_tokens=128, sampling=SamplingParams(temperature=temperature, seed=seed))
    totals: dict[str, Counter[str]] = {"default": Counter(), "plain": Counter()}
    for index, question in enumerate(questions):
        order = ("default", "plain") if index % 2 == 0 else ("plain", "default")
        for method in order:
            drafter = {} if method == "default" else {"drafter": "none"}
            began = time.perf_counter()
            stats = pipeline.generate(question.turns[0], config, chat=True, **drafter).stats
            wall, total = time.perf_counter() - began, totals[method]
            total["rate"] += stats.new_tokens / wall  # summed per question, as the bench's mean tokens/s
            total["decoding"] += wall - stats.prefill_s
            total["tokens"] += stats.new_tokens
            total["forwards"] += stats.target_forwards
            total["proposed"] += stats.draft_tokens_proposed
            total["accepted"] += stats.draft_tokens_accepted
    default, plain = totals["default"], totals["plain"]
    print(
        f"T {temperature} seed {seed}: {default['tokens']} tokens, {default['tokens'] / default['forwards']:.2f} a "
        f"target step, acceptance {default['accepted'] / max(1, default['proposed']):.3f} of {default['proposed']} "
        f"drafts; speedup {default['rate'] / plain['rate']:.3f}x, after the prompts "
        f"{plain['decoding'] / default['decoding']:.3f}x"
    )


if __name__ == "__main__":
    main()
