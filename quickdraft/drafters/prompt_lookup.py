"""``prompt-lookup``: copy what followed an earlier occurrence of the last n-gram.

No model is involved: for n from ``max_ngram`` down to ``min_ngram``, find the most recent
earlier place where the last n committed tokens occurred and propose the tokens that
followed it there. Its proposals are deterministic (one-hot q).
"""

from __future__ import annotations

from collections.abc import Sequence

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.runtime.base import Runtime


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
    def __init__(self, max_ngram: int, min_ngram: int, records: DrafterRecords | None = None) -> None:
        super().__init__(records)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> PromptLookupDrafter:
        return cls(options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram, records)

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        return [
            DraftProposal.copied(lookup_continuation(task.context, task.num_tokens, self.max_ngram, self.min_ngram))
            for task in tasks
        ]
