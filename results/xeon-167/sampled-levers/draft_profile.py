"""Where a seeded step's time goes, drafting included: a cProfile of the draft-model drafter at a fixed γ 4. A probe,
kept beside its output.

    .venv/bin/python results/xeon-167/sampled-levers/draft_profile.py [TEMPERATURE]

Six questions (the first six mt_bench and math_reasoning questions of the bench's seed-0 sample, first turns), 128
tokens, seeded (seed 1) at TEMPERATURE (default 0.7), after one untimed question. Prints the wall time and the
functions by their own time and by cumulative time. cProfile slows Python calls, so the Python shares are upper bounds.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, keep_categories, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams


def main() -> None:
    temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
    pipeline = Pipeline.load()
    sample = sample_questions(load_questions(default_questions_path()), 5, 0)
    questions = keep_categories(sample, ("mt_bench", "math_reasoning"))[:6]
    sampling = SamplingParams(temperature=temperature, seed=1 if temperature else None)
    config = GenerationConfig(max_new_tokens=128, num_draft_tokens=4, sampling=sampling)
    pipeline.generate(questions[0].turns[0], config, drafter="draft-model", chat=True)  # untimed
    profile = cProfile.Profile()
    began = time.perf_counter()
    profile.enable()
    for question in questions:
        pipeline.generate(question.turns[0], config, drafter="draft-model", chat=True)
    profile.disable()
    print(f"wall {time.perf_counter() - began:.1f} s")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
