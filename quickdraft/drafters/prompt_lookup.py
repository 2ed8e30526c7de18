"""``prompt-lookup``: copy what followed an earlier occurrence of the last n-gram.

No model is involved: for n from ``max_ngram`` down to ``min_ngram``, find the most recent
earlier place where the last n committed tokens occurred and propose the tokens that
followed it there. Its proposals are deterministic (one-hot q).
"""

from __future__ import annotations

import torch

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, KeepDrafting
from quickdraft.runtime.base import Runtime
from quickdraft.sampling import SamplingParams


def lookup_continuation(token_ids: list[int], num_tokens: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the latest earlier match of the longest suffix n-gram."""
    length = len(token_ids)
    for ngram in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = token_ids[length - ngram :]
        # latest start first; a match must end before the suffix starts to have a continuation
        for start in range(length - ngram - 1, -1, -1):
            if token_ids[start : start + ngram] == suffix:
                follow = start + ngram
                return token_ids[follow : follow + num_tokens]
    return []


class PromptLookupDrafter(Drafter):
    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> PromptLookupDrafter:
        return cls(options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram)

    def propose(
        self,
        context_ids: list[list[int]],
        num_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
        copies: bool = True,
    ) -> DraftProposal:
        rows = [lookup_continuation(ids, num_tokens, self.max_ngram, self.min_ngram) for ids in context_ids]
        shortest = min(len(row) for row in rows)  # one γ for the whole batch
        if shortest == 0:
            return DraftProposal.empty(len(context_ids))
        token_ids = torch.tensor([row[:shortest] for row in rows], dtype=torch.long)  # [B, γ]
        return DraftProposal(token_ids=token_ids, probs=None)
