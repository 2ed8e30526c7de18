"""Does a seeded copy's own noise tell whether the target will accept it? A probe (it wraps HybridDrafter.propose
to record each step's drafts and their source), kept beside its output.

    .venv/bin/python results/xeon-167/copy_noise.py [TEMPERATURE]

Seeded sampling commits argmax(log p + g) at each position, and the noise g depends on (seed, position) only, so it
is known before the target runs. A copy c (a free draft from the suffix drafter, chosen without noise) is accepted
when the target's choice is c. If the target gave every copy the same probability π, its acceptance given its own
noise would be exp(-exp(-(g(c) + logit π))): from 0.14 at g = -1 to 0.95 at g = 2 for π = 0.63, a sharp signal for
where to end a block of copies. This measures how sharp it is on the default's own steps: every drafted token up to
and including a block's first rejection, on the 30 Spec-Bench first turns (128 tokens, seed 1), by source, with the
AUC of g(c) for acceptance and the acceptance by bins of g(c) against what a single π predicts.
"""

from __future__ import annotations

import math
import sys

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters.hybrid import HybridDrafter
from quickdraft.lossless.sampling import seeded_gumbel

EDGES = (-1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)  # bins of g(c)
blocks: list[tuple[int, list[int], str]] = []  # (context length, drafted tokens, source) of each step
propose_drafts = HybridDrafter.propose


def recording_propose(drafter: HybridDrafter, tasks, max_read_tokens=None):  # type: ignore[no-untyped-def]
    proposals = propose_drafts(drafter, tasks, max_read_tokens)
    for task, proposal in zip(tasks, proposals, strict=True):
        blocks.append((len(task.context), proposal.token_ids[0].tolist(), task.offer.source))
    return proposals


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """P(an accepted token's score > a rejected one's), by ranks."""
    ranks = torch.empty_like(scores)
    ranks[scores.argsort()] = torch.arange(len(scores), dtype=scores.dtype)
    accepted = int(labels.sum())
    rejected = len(labels) - accepted
    return (float(ranks[labels.bool()].sum()) - accepted * (accepted - 1) / 2) / (accepted * rejected)


def main() -> None:
    HybridDrafter.propose = recording_propose  # type: ignore[method-assign]
    temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
    pipeline = Pipeline.load()
    vocab_size = pipeline.target.vocab_size
    judged: dict[str, list[tuple[bool, float]]] = {}  # source -> (accepted, g(c)) of each judged draft
    config = GenerationConfig(max_new_tokens=128, sampling=SamplingParams(temperature=temperature, seed=1))
    for question in sample_questions(load_questions(default_questions_path()), 5, 0):
        prompt = pipeline.encode(question.turns[0], chat=True)
        blocks.clear()
        sequence = prompt + pipeline.generate(prompt, config, drafter="hybrid-suffix").token_ids
        for start, tokens, source in blocks:
            for position, token in enumerate(tokens, start=start):
                if position >= len(sequence):
                    break
                accepted = sequence[position] == token
                noise = float(seeded_gumbel(1, position, vocab_size)[token])
                judged.setdefault(source, []).append((accepted, noise))
                if not accepted:
                    break
    print(f"T {temperature:g}, seed 1; g(c) bins: < {EDGES[0]}, " + ", ".join(f"< {e}" for e in EDGES[1:]) + ", more")
    for source, pairs in sorted(judged.items()):
        labels = torch.tensor([float(accepted) for accepted, _ in pairs])
        noise = torch.tensor([g for _, g in pairs])
        rate = float(labels.mean())
        single_pi = torch.exp(-torch.exp(-(noise + math.log(rate / (1 - rate)))))  # one π for every draft
        bins = torch.bucketize(noise, torch.tensor(EDGES))
        measured = [f"{float(labels[bins == b].mean()):.2f} ({int((bins == b).sum())})" for b in range(len(EDGES) + 1)]
        predicted = [f"{float(single_pi[bins == b].mean()):.2f}" for b in range(len(EDGES) + 1)]
        print(f"{source}: {len(pairs)} judged, accepted {rate:.3f}, AUC of g(c) {auc(noise, labels):.3f}")
        print(f"  accepted by bin: {', '.join(measured)}")
        print(f"  one π predicts:  {', '.join(predicted)}")


if __name__ == "__main__":
    main()
