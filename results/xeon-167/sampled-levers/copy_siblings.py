"""When the target rejects a seeded copy, was its token another follower the suffix index knew? A probe (it wraps
HybridSuffixDrafter.propose to record, for each copied block, the index's followers at every depth ranked as the
drafter ranks them), kept beside its output.

    .venv/bin/python results/xeon-167/sampled-levers/copy_siblings.py [TEMPERATURE]

On the 30 Spec-Bench first turns (128 tokens, seed 1), the default's own steps: each copied block up to and
including its first rejection. There, the rank of the target's token among the followers (rank 1 was the copy
itself): a sibling copy at that depth is accepted only at rank 2 or beyond. For blocks accepted whole, whether the
next follower was the target's next token, and whether the block ended on the policy's γ or on the copy rule.
"""

from __future__ import annotations

import sys
from collections import Counter

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters.hybrid import HybridSuffixDrafter
from quickdraft.drafters.suffix import MAX_MATCH, MIN_MATCH

blocks: list[tuple] = []  # (context length, drafts, followers by depth or None, source, γ asked, copies on offer)
propose_drafts = HybridSuffixDrafter.propose


def ranked_followers(drafter: HybridSuffixDrafter, state, sequence: list[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """The followers of the longest suffix either index saw, most frequent first (the drafter's tie rules)."""
    for n in range(min(MAX_MATCH, len(sequence)), MIN_MATCH - 1, -1):
        ngram = tuple(sequence[-n:])
        local, local_latest = state.local.followers(ngram)
        shared, shared_latest = drafter.suffix.answers.followers(ngram)
        counts = Counter(local) + Counter(shared)
        if counts:
            return sorted(counts, key=lambda t: (counts[t], t == local_latest, t == shared_latest), reverse=True)
    return []


def recording_propose(drafter, tasks, max_read_tokens=None):  # type: ignore[no-untyped-def]
    proposals = propose_drafts(drafter, tasks, max_read_tokens)
    for task, proposal in zip(tasks, proposals, strict=True):
        tokens = proposal.token_ids[0].tolist()
        if task.offer.source == drafter.copy_source and tokens:
            state = task.state.copies.state
            tail = list(state.tokens[-MAX_MATCH:])
            followers = [ranked_followers(drafter, state, tail + tokens[:depth]) for depth in range(len(tokens) + 1)]
            offered = len(task.state.copied(task.context)[0])
            blocks.append((len(task.context), tokens, followers, "copy", task.num_tokens, offered))
        else:
            blocks.append((len(task.context), tokens, None, "model", task.num_tokens, 0))
    return proposals


def main() -> None:
    HybridSuffixDrafter.propose = recording_propose  # type: ignore[method-assign]
    temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
    pipeline = Pipeline.load()
    sampling = SamplingParams(temperature=temperature, seed=1) if temperature else SamplingParams()
    config = GenerationConfig(max_new_tokens=128, sampling=sampling)
    by_category: dict[str, Counter] = {}
    for question in sample_questions(load_questions(default_questions_path()), 5, 0):
        prompt = pipeline.encode(question.turns[0], chat=True)
        blocks.clear()
        sequence = prompt + pipeline.generate(prompt, config, drafter="hybrid-suffix").token_ids
        counts = by_category.setdefault(question.category, Counter())
        for start, tokens, followers, source, asked, offered in blocks:
            counts[f"{source} steps"] += 1
            for depth, token in enumerate(tokens):
                if start + depth >= len(sequence):
                    break
                counts[f"{source} judged"] += 1
                if sequence[start + depth] == token:
                    counts[f"{source} accepted"] += 1
                    continue
                if source == "copy":
                    ranked = followers[depth]
                    rank = ranked.index(sequence[start + depth]) + 1 if sequence[start + depth] in ranked else 0
                    counts["rejected copies"] += 1
                    counts[f"rejected, target's token at rank {rank or 'none'}"] += 1
                break
            else:
                if source == "copy" and start + len(tokens) < len(sequence):
                    ranked = followers[len(tokens)]
                    limit = "the policy's γ" if asked < offered else "the copy rule"
                    right = bool(ranked) and ranked[0] == sequence[start + len(tokens)]
                    counts[f"whole blocks ended by {limit}"] += 1
                    counts[f"whole blocks ended by {limit}, next follower right"] += right
    total = sum(by_category.values(), Counter())
    for category, counts in [*by_category.items(), ("all", total)]:
        print(category, dict(sorted(counts.items())))


if __name__ == "__main__":
    main()
