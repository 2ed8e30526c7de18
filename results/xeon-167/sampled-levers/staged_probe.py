"""Could the draft model check a copy in one forward instead of drafting it token by token? A probe (it wraps
HybridDrafter.propose), kept beside its output.

    .venv/bin/python results/xeon-167/sampled-levers/staged_probe.py [TEMPERATURE]

The idea (staged speculation): where the context offers a copy, the draft model reads the copy's tokens as rows of
one forward; its own choice after each row is its next draft, so a prefix it agrees with costs one forward instead
of one per token. It saves forwards only on the default's model-drafting steps that have a copy to check. For the
30 Spec-Bench first turns (128 tokens; seeded with seed 1 at TEMPERATURE, default 0.7; greedy at 0), this counts,
per category, the default's copy steps and model steps, the model steps with a copy on offer, and the sequential
draft forwards a staged check would have saved: min(m, drafted - 1), m the prefix of the copy the draft model drafted.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters.hybrid import HybridDrafter

counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # category -> count -> value
category = ["none"]
propose_drafts = HybridDrafter.propose


def propose(self, tasks, max_read_tokens=None):
    proposals = propose_drafts(self, tasks, max_read_tokens)
    for task, proposal in zip(tasks, proposals, strict=True):
        here = counts[category[0]]
        if task.offer.source == self.copy_source:
            here["copy steps"] += 1
            continue
        drafted = proposal.token_ids[0].tolist()
        if not drafted:
            continue
        copy = task.state.copied(task.context)[0]
        agreed = 0
        while agreed < min(len(copy), len(drafted)) and copy[agreed] == drafted[agreed]:
            agreed += 1
        here["model steps"] += 1
        here["with a copy"] += bool(copy)
        here["forwards"] += len(drafted)
        here["saved"] += min(agreed, len(drafted) - 1)
    return proposals


def main() -> None:
    HybridDrafter.propose = propose
    temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
    sampling = SamplingParams(temperature=temperature, seed=1 if temperature else None)
    pipeline = Pipeline.load()
    began = time.perf_counter()
    for question in sample_questions(load_questions(default_questions_path()), 5, 0):
        category[0] = question.category
        pipeline.generate(question.turns[0], GenerationConfig(max_new_tokens=128, sampling=sampling), chat=True)
    print(f"T {temperature:g}, {time.perf_counter() - began:.0f} s")
    total: dict[str, int] = defaultdict(int)
    for name, here in [*counts.items(), ("all", total)]:
        if name != "all":
            for key, value in here.items():
                total[key] += value
        share = here.get("saved", 0) / max(1, here.get("forwards", 0))
        print(f"{name:<15} " + "  ".join(f"{key} {value}" for key, value in here.items()) + f"  saved {share:.3f}")


if __name__ == "__main__":
    main()
