"""Would a draft model with some of its layers left out pay? A probe, kept beside its output.

    .venv/bin/python results/xeon-167/sampled-levers/draft_layers.py [MAX_DROPPED]

A drafted token costs about its weight bytes, and each of the default draft's 24 layers is about 1/24 of those
(its LM head the rest). First the probe ranks the layers by how little they change the hidden state (ShortGPT's block
influence, 1 - cos(h_in, h_out), averaged over the draft model's reading of the 30 Spec-Bench first turns); then,
leaving out the 1..MAX_DROPPED (default 4) least influential layers (never the first or last), it measures on the same
30 questions (128 tokens, teacher-forced, as tools/draft_bits.py does) how often the draft's choice is the target's:
greedy, and seeded at T 0.7 (the coupled match). Layers left out keep nothing in the cache; the others are unchanged.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from sampling_acceptance import Setting, draft_matches, target_answers, teacher_forced_logits

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions

SEED = 1


def block_influence(pipeline: Pipeline, prompts: list[list[int]]) -> list[float]:
    """1 - cos(input, output) of each draft layer, averaged over every prompt token."""
    decoder = pipeline.draft.decoder
    count = len(decoder.layers)
    totals = torch.zeros(count)
    tokens = 0
    for prompt in prompts:
        cache = pipeline.draft.new_cache(1)
        _, _, (features,) = decoder.forward_rows(
            [(cache.static, prompt, False)], capture=range(1, count + 1)
        )  # [T, L·H]
        after = features.reshape(len(prompt), count, -1).transpose(0, 1)  # [L, T, H]: after each layer
        before = torch.cat([decoder.embedding[torch.tensor(prompt)][None].float(), after[:-1]])  # [L, T, H]
        totals += (1 - torch.nn.functional.cosine_similarity(before, after, dim=-1)).sum(dim=-1)  # [L]
        tokens += len(prompt)
    return (totals / tokens).tolist()


def main() -> None:
    max_dropped = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    began = time.perf_counter()
    pipeline = Pipeline.load()
    draft = pipeline.draft
    decoder = draft.decoder
    questions = sample_questions(load_questions(default_questions_path()), 5, 0)
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    influence = block_influence(pipeline, prompts)
    print("block influence:", " ".join(f"{index}:{value:.3f}" for index, value in enumerate(influence)))
    inner = sorted(range(1, len(influence) - 1), key=lambda index: influence[index])
    settings = {"greedy": Setting(0.0), "T0.7": Setting(0.7)}
    answers = []
    for number, prompt in enumerate(prompts, start=1):
        answers.append(target_answers(pipeline, prompt, settings, 128, SEED))
        print(f"[{time.perf_counter() - began:.0f} s] target answers {number}/{len(prompts)}", file=sys.stderr)
    all_layers = list(decoder.layers)
    vocab_size = pipeline.target.vocab_size
    for dropped_count in range(max_dropped + 1):
        dropped = sorted(inner[:dropped_count])
        decoder.layers = [layer for index, layer in enumerate(all_layers) if index not in dropped]
        decoder._layers_spec = None  # rebuilt for the kept layers on the next forward
        counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for prompt, answer in zip(prompts, answers, strict=True):
            draft.focus_vocabulary(prompt)
            cache = draft.new_cache(1)
            first = draft.forward(torch.tensor([prompt]), cache, last_only=True)[0, -1]  # [V_draft]
            for name, setting in settings.items():
                tokens = answer[name]
                logits = teacher_forced_logits(draft, cache, first, len(prompt), tokens)  # [T, V_draft]
                matches = draft_matches(logits, tokens, setting.sampling(SEED), len(prompt), vocab_size)
                counts[name][0] += sum(matches)
                counts[name][1] += len(matches)
        line = "  ".join(f"{name} {hits / total:.3f}" for name, (hits, total) in counts.items())
        print(f"left out {dropped or 'none'}: {len(decoder.layers)} layers  {line}", flush=True)
    decoder.layers = all_layers
    decoder._layers_spec = None
    print(f"# {len(questions)} questions, {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
