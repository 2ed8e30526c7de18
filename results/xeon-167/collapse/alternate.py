"""Does the target's forward cost more right after the draft model's? The target's forward over k new tokens after
a 300-token prompt, timed repeated alone and timed after k − 1 one-token draft forwards (a drafting step's order),
with the draft's time per token, in one process, two rounds:

    cd /tmp && .venv/bin/python results/xeon-167/collapse/alternate.py
"""

from __future__ import annotations

import statistics
import time

import torch

from quickdraft.api import Pipeline

PROMPT_TOKENS = 300
REPEATS = 8


def main() -> None:
    pipeline = Pipeline.load()
    target, draft = pipeline.target, pipeline.draft
    generator = torch.Generator().manual_seed(0)
    target_cache, draft_cache = target.new_cache(1), draft.new_cache(1)
    prompt = torch.randint(0, 150000, (1, PROMPT_TOKENS), generator=generator)  # [1, P]
    target.forward(prompt, target_cache, last_only=True)
    draft.forward(prompt, draft_cache, last_only=True)

    def target_ms(k: int) -> float:
        token_ids = torch.randint(0, 150000, (1, k), generator=generator)  # [1, k]
        started = time.perf_counter()
        target.forward(token_ids, target_cache)
        elapsed = time.perf_counter() - started
        target_cache.truncate(PROMPT_TOKENS)
        return 1000 * elapsed

    def drafts_ms(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            draft.forward(torch.randint(0, 150000, (1, 1), generator=generator), draft_cache)
        elapsed = time.perf_counter() - started
        draft_cache.truncate(PROMPT_TOKENS)
        return 1000 * elapsed

    for _ in range(2):
        for k in (1, 2, 4, 9):
            drafts = max(k - 1, 1)
            alone = [target_ms(k) for _ in range(REPEATS)]
            after, drafting = [], []
            for _ in range(REPEATS):
                drafting.append(drafts_ms(drafts) / drafts)
                after.append(target_ms(k))
            print(
                f"k={k}: alone median {statistics.median(alone):.1f} min {min(alone):.1f}; "
                f"after {drafts} draft forwards median {statistics.median(after):.1f} min {min(after):.1f}; "
                f"draft per token {statistics.median(drafting):.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
