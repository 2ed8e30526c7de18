"""Would a draft model that reads only the end of the prompt still agree with the target?

    .venv/bin/python tools/draft_window.py [QUESTIONS.jsonl] [--windows 0,8,16,32] [--look N] [--tokens N]

Reading the prompt is what makes a draft model's first draft dear on short answers (see goodput's
reading gate). A cheaper reading would keep the chat template's fixed start (which a served draft
model has cached) and only the last W tokens before the first draft, as StreamingLLM-style draft
caches do. For each sampled Spec-Bench question (first turn, the bench's seed-0 sample, long-document
categories skipped) the target decodes ``--tokens`` tokens greedily; the draft model then reads the
context as it stands after ``--look`` generated tokens, whole (W = 0) or cut to the template's start
plus the last W tokens, and follows the target's tokens from there. Prints, per W, the fraction of
the remaining tokens where the draft model's greedy choice equals the target's.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.tokens import common_prefix_length


def agreement(pipeline: Pipeline, read: list[int], follow: list[int]) -> float:
    """The draft model reads ``read``, then predicts each token of ``follow`` before being fed it."""
    assert pipeline.draft is not None
    cache = pipeline.draft.new_cache(1)
    logits = pipeline.draft.forward(torch.tensor([read]), cache, last_only=True)[0, -1]  # [V]
    matches = []
    for token in follow:
        matches.append(int(logits.argmax()) == token)
        logits = pipeline.draft.forward(torch.tensor([[token]]), cache)[0, -1]
    return statistics.fmean(matches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--windows", default="0,8,16,32", help="prompt tokens kept (0 = all; default 0,8,16,32)")
    parser.add_argument("--look", type=int, default=4, help="tokens generated before the draft model reads (default 4)")
    parser.add_argument("--tokens", type=int, default=40, help="generated tokens per question (default 40)")
    parser.add_argument("--skip", default="summarization,rag", help="categories to skip (long documents)")
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    pipeline = Pipeline.load()
    skip = set(args.skip.split(","))
    questions = [
        q for q in sample_questions(load_questions(args.questions), args.per_category, 0) if q.category not in skip
    ]
    fixed_start = common_prefix_length(  # the chat template's start, shared by every request
        pipeline.encode_chat([{"role": "user", "content": "a"}]),
        pipeline.encode_chat([{"role": "user", "content": "b c"}]),
    )
    print(f"# chat template start: {fixed_start} tokens; draft model reads after {args.look} generated tokens")
    print(
        "category         question  prompt  tokens  "
        + "  ".join(f"{'W=' + (str(w) if w else 'all'):>6}" for w in windows)
    )
    for question in questions:
        prompt = pipeline.encode_chat([{"role": "user", "content": question.turns[0]}])
        cache = pipeline.target.new_cache(1)
        logits = pipeline.target.forward(torch.tensor([prompt]), cache, last_only=True)[0, -1]  # [V]
        generated: list[int] = []
        for _ in range(args.tokens):
            generated.append(int(logits.argmax()))
            if generated[-1] in pipeline.eos_token_ids:
                break
            logits = pipeline.target.forward(torch.tensor([[generated[-1]]]), cache)[0, -1]
        context, start = prompt + generated, len(prompt) + args.look
        if start >= len(context):
            continue
        scores = []
        for window in windows:
            whole = window == 0 or start - fixed_start <= window
            read = context[:start] if whole else context[:fixed_start] + context[start - window : start]
            scores.append(agreement(pipeline, read, context[start:]))
        print(
            f"{question.category:<16} {question.question_id:>8}  {len(prompt) - fixed_start:>6}  {len(generated):>6}  "
            + "  ".join(f"{score:>6.2f}" for score in scores),
            flush=True,
        )


if __name__ == "__main__":
    main()
