"""The default on the bench's first questions in its order (every turn, seeded T 0.7 unless told), in one process,
counting each step's source (model drafts, copies, plain) by question: does the first math question run without
the draft model after the four before it?

    .venv/bin/python results/xeon-167/collapse/sequence_probe.py [COUNT] [TEMPERATURE]
"""

from __future__ import annotations

import sys
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.bench.run import encode_turn
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.policies.goodput import GoodputPolicy

sys.path.insert(0, str(Path(__file__).parents[1]))  # draft_sources.py, the probe beside, has the per-source hook
from draft_sources import counting_observe, tally


def main() -> None:
    GoodputPolicy.observe = counting_observe  # type: ignore[method-assign]
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.7
    sampling = SamplingParams(temperature=temperature, seed=1) if temperature > 0 else SamplingParams()
    pipeline = Pipeline.load()
    questions = sample_questions(load_questions(default_questions_path()), 5, 0)[:count]
    for question in questions:
        tally.clear()
        answers: list[str] = []
        for _ in question.turns:
            config = GenerationConfig(max_new_tokens=128, sampling=sampling, policy="goodput")
            result = pipeline.generate(encode_turn(pipeline, question, answers), config, drafter="hybrid-suffix")
            answers.append(pipeline.tokenizer.decode(result.token_ids, skip_special_tokens=True))
        counts = {source: {key: tally[source, key] for key in ("steps", "drafted", "accepted")} for source, _ in tally}
        print(question.question_id, question.category, counts, flush=True)


if __name__ == "__main__":
    main()
