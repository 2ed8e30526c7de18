"""Would a draft model that reads only the last W tokens of a long document still agree with the target, greedy
and seeded? A probe for rag and summarization, the categories ``tools/draft_window.py`` skips, kept beside its
output.

    .venv/bin/python results/xeon-167/sampled-levers/window_probe.py [CATEGORIES] [WINDOWS]

For each question of CATEGORIES (default rag,summarization; the bench's seed-0 sample of 5 per category, first
turn) the target decodes 128 tokens greedily and seeded at T 0.7 (seed 1); the default draft model then reads the
prompt's last W tokens (W = 0: all of it) and follows the answer. Prints, per W, how often its choice is the
target's (greedy: the argmax; seeded: the Gumbel-max choice under the position's noise, the coupled match) and how
long reading the window took.
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
from quickdraft.bench.questions import default_questions_path, keep_categories, load_questions, sample_questions

SEED = 1


def main() -> None:
    categories = tuple((sys.argv[1] if len(sys.argv) > 1 else "rag,summarization").split(","))
    windows = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "0,1024,512,256,128").split(",")]
    began = time.perf_counter()
    pipeline = Pipeline.load()
    draft = pipeline.draft
    questions = keep_categories(sample_questions(load_questions(default_questions_path()), 5, 0), categories)
    settings = {"greedy": Setting(0.0), "T0.7": Setting(0.7)}
    vocab_size = pipeline.target.vocab_size
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # name -> [matches or seconds, positions or reads]
    for question in questions:
        prompt = pipeline.encode(question.turns[0], chat=True)
        answers = target_answers(pipeline, prompt, settings, 128, SEED)
        for window in windows:
            seen = prompt if window == 0 or window >= len(prompt) else prompt[-window:]
            draft.focus_vocabulary(prompt)
            draft_cache = draft.new_cache(1)
            start = time.perf_counter()
            draft_first = draft.forward(torch.tensor([seen]), draft_cache, last_only=True)[0, -1]  # [V_draft]
            counts[f"read s, W {window}"][0] += time.perf_counter() - start
            counts[f"read s, W {window}"][1] += 1
            for name, setting in settings.items():
                tokens = answers[name]
                logits = teacher_forced_logits(draft, draft_cache, draft_first, len(seen), tokens)  # [T, V_draft]
                matches = draft_matches(logits, tokens, setting.sampling(SEED), len(prompt), vocab_size)
                for key in (f"{name}, W {window}", f"{name}, W {window}, {question.category}"):
                    counts[key][0] += sum(matches)
                    counts[key][1] += len(matches)
        print(f"[{time.perf_counter() - began:.0f} s] {question.category} {question.question_id}: prompt {len(prompt)}")
    for key in sorted(counts):
        total, number = counts[key]
        print(f"{key:<36} {total / number:.3f}  ({int(number)})")


if __name__ == "__main__":
    main()
