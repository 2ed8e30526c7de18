"""How often does the draft model's greedy choice equal the target's, per weight format and vocabulary size?

    .venv/bin/python tools/draft_agreement.py [QUESTIONS.jsonl] [--per-category N] [--tokens N]
        [--formats auto:0,q4:0,q4:32768,q4:49152+prompt,...]

A draft model's weights (``--draft-weights``) and the vocabulary its LM head computes (``--draft-vocabulary``)
change only how often its drafts are accepted, never the output. Under greedy decoding, a draft at position t is
accepted when the draft model's argmax after the committed tokens equals the target's token there, so the
teacher-forced agreement along the target's own greedy answer is the acceptance rate of every draft in a block.
For each sampled Spec-Bench question (first turn, the bench's seed-0 sample) the target decodes ``--tokens``
tokens greedily; each draft configuration then reads prompt and answer in one forward and is scored on the
answer's positions. Prints the agreement per category and overall (tokens pooled). ``+prompt`` after a vocabulary
size also computes each question's prompt tokens (``Runtime.focus_vocabulary``, as the drafters do).
``second`` after them is how often the draft's second choice is the target's token where its first is not: what a
draft tree's sibling at that position would add.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime
from quickdraft.tokens import frequent_tokens


def greedy_answer(pipeline: Pipeline, prompt: list[int], tokens: int) -> list[int]:
    cache = pipeline.target.new_cache(1)
    logits = pipeline.target.forward(torch.tensor([prompt]), cache, last_only=True)[0, -1]  # [V]
    answer: list[int] = []
    while len(answer) < tokens:
        answer.append(int(logits.argmax()))
        if answer[-1] in pipeline.eos_token_ids:
            break
        logits = pipeline.target.forward(torch.tensor([[answer[-1]]]), cache)[0, -1]
    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="target tokens per question (default 128)")
    parser.add_argument("--formats", default="q4:0,q4:32768,q4:32768+prompt,q4:49152,q4:49152+prompt")
    args = parser.parse_args()
    pipeline = Pipeline.load(draft=None)
    from quickdraft.models import DEFAULT_DRAFT, resolve_model

    draft_path = resolve_model(DEFAULT_DRAFT)
    questions = sample_questions(load_questions(args.questions), args.per_category, 0)
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    answers = [greedy_answer(pipeline, prompt, args.tokens) for prompt in prompts]
    print(f"# {len(questions)} questions, {sum(map(len, answers))} target tokens")
    for spec in args.formats.split(","):
        weights, _, size = spec.partition(":")
        size, focused, _ = size.partition("+prompt")  # focused: "+prompt" or ""
        vocabulary = frequent_tokens(pipeline.tokenizer, int(size)) if int(size or 0) else None
        draft = NativeRuntime.load(draft_path, LoadOptions(weights, vocabulary))
        matches: dict[str, list[bool]] = defaultdict(list)
        for question, prompt, answer in zip(questions, prompts, answers, strict=True):
            if focused:
                draft.focus_vocabulary(prompt)
            context = torch.tensor([prompt + answer[:-1]])
            logits = draft.forward(context, draft.new_cache(1))[0, len(prompt) - 1 :]  # predicts each answer token
            top2 = logits.topk(2, dim=-1).indices  # [T, 2]
            agree = (top2[:, 0] == torch.tensor(answer)).tolist()
            runner_up = (top2[:, 1] == torch.tensor(answer)).tolist()
            second = [hit for first, hit in zip(agree, runner_up, strict=True) if not first]
            matches[question.category] += agree
            matches["overall"] += agree
            matches["second"] += second
        print(f"{spec:<12} " + "  ".join(f"{name} {sum(m) / len(m):.3f}" for name, m in matches.items()), flush=True)


if __name__ == "__main__":
    main()
