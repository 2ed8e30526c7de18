"""How well the target's own confidence predicts a draft model's acceptance, question by question.

    .venv/bin/python tools/target_confidence.py [QUESTIONS.jsonl] [--per-category N] [--tokens N] [--look N]

For each sampled Spec-Bench question (first turn, the bench's seed-0 sample) the target decodes
greedily while the draft model reads the same tokens; per generated token it records the target's
top probability and whether the draft model's greedy choice equals the target's. Prints, per
question, the mean target top probability over its first ``--look`` tokens (what goodput sees
before it decides to read) and over all the tokens, and the fraction of matches: the evidence
goodput's look-before-reading relies on.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.lossless.sampling import argmax, top_probability


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="generated tokens per question (default 32)")
    parser.add_argument("--look", type=int, default=4, help="tokens goodput looks at before reading (default 4)")
    parser.add_argument("--skip", default="summarization,rag", help="categories to skip (long documents)")
    args = parser.parse_args()
    pipeline = Pipeline.load()
    assert pipeline.draft is not None
    skip = set(args.skip.split(","))
    questions = [
        q for q in sample_questions(load_questions(args.questions), args.per_category, 0) if q.category not in skip
    ]
    print(f"category         question  tokens  top probability, first {args.look}  top probability  draft matches")
    for question in questions:
        prompt = torch.tensor([pipeline.encode_chat([{"role": "user", "content": question.turns[0]}])])
        target_cache, draft_cache = pipeline.target.new_cache(1), pipeline.draft.new_cache(1)
        target_logits = pipeline.target.forward(prompt, target_cache, last_only=True)[0, -1]  # [V]
        draft_logits = pipeline.draft.forward(prompt, draft_cache, last_only=True)[0, -1]  # [V]
        confidences, matches = [], []
        for _ in range(args.tokens):
            token = int(argmax(target_logits))
            confidences.append(float(top_probability(target_logits)))  # what goodput's estimate hears
            matches.append(int(argmax(draft_logits)) == token)
            if token in pipeline.eos_token_ids:
                break
            target_logits = pipeline.target.forward(torch.tensor([[token]]), target_cache)[0, -1]
            draft_logits = pipeline.draft.forward(torch.tensor([[token]]), draft_cache)[0, -1]
        print(
            f"{question.category:<16} {question.question_id:>8}  {len(matches):>6}  "
            f"{statistics.fmean(confidences[: args.look]):>24.2f}  "
            f"{statistics.fmean(confidences):>15.2f}  {statistics.fmean(matches):>13.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
