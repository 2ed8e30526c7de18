"""``prompt-lookup``: copy what followed an earlier occurrence of the last n-gram.

No model is involved: for n from ``max_ngram`` down to ``min_ngram``, find the most recent
earlier place where the last n committed tokens occurred and propose the tokens that
followed it there. Its proposals are deterministic (one-hot q).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.runtime.base import KVCache, Runtime


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


class NgramIndex:
    """:func:`lookup_continuation` over one request's committed tokens, which only grow: each n-gram's latest
    start is kept as tokens arrive, so a lookup costs the same at 32k tokens as at 100. A context that does not
    extend the one indexed is indexed anew. The scan is the oracle (``tests/drafters/test_prompt_lookup.py``)."""

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []  # the context indexed
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def continuation(self, context: Sequence[int], num_tokens: int) -> list[int]:
        """What :func:`lookup_continuation` gives for ``context`` [T]."""
        self._extend(context)
        tokens, length = self.tokens, len(self.tokens)
        for ngram in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self.latest[ngram].get(tuple(tokens[length - ngram :]))
            if start is not None:
                return tokens[start + ngram : start + ngram + num_tokens]
        return []

    def _extend(self, context: Sequence[int]) -> None:
        indexed = len(self.tokens)
        if len(context) < indexed or (indexed and context[indexed - 1] != self.tokens[-1]):
            self.tokens, indexed = [], 0
            for latest in self.latest.values():
                latest.clear()
        self.tokens.extend(context[indexed:])
        length = len(self.tokens)
        for ngram, latest in self.latest.items():  # starts that end before the last token: matches with a follower
            for start in range(max(0, indexed - ngram), length - ngram):
                latest[tuple(self.tokens[start : start + ngram])] = start


@dataclass(eq=False)
class PromptLookupState(DraftState):
    index: NgramIndex


class PromptLookupDrafter(Drafter):
    copies_context = True

    def __init__(self, max_ngram: int, min_ngram: int, records: DrafterRecords | None = None) -> None:
        super().__init__(records)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> PromptLookupDrafter:
        return cls(options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram, records)

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> PromptLookupState:
        return PromptLookupState(NgramIndex(self.max_ngram, self.min_ngram))

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        proposals = []
        for task in tasks:
            assert isinstance(task.state, PromptLookupState)
            proposals.append(DraftProposal.copied(task.state.index.continuation(task.context, task.num_tokens)))
        return proposals
