"""The target's own answers to the 30 Spec-Bench first turns (the bench's seed-0 sample, 128 tokens): seeded T 0.7
(seed 1), greedy and seeded T 1.0, decoded by the default drafter (the same text as plain decoding). Written to
answers.json beside this file, for copy_siblings.py's neighbours and ../draft-sparsity/teal_probe.py.

    .venv/bin/python results/xeon-167/sampled-levers/answers.py
"""

from __future__ import annotations

import json
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams


def main() -> None:
    pipeline = Pipeline.load()
    answers = []
    for temperature in (0.7, 0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, seed=1) if temperature else SamplingParams()
        config = GenerationConfig(max_new_tokens=128, sampling=sampling)
        for question in sample_questions(load_questions(default_questions_path()), 5, 0):
            prompt = pipeline.encode(question.turns[0], chat=True)
            answer = pipeline.generate(prompt, config, drafter="hybrid-suffix").token_ids
            answers.append({"t": temperature, "category": question.category, "prompt": prompt, "answer": answer})
    Path(__file__).with_name("answers.json").write_text(json.dumps(answers))


if __name__ == "__main__":
    main()
