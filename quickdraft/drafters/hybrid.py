"""``hybrid``: copy from the context when it repeats itself, otherwise draft with the draft model.

Prompt lookup costs nothing and is right most of the time where an answer quotes its prompt
(summaries, questions about a document, code edits); the draft model costs a forward per token
and is right about as often wherever the answer is new text. So each step first looks for the
last ``hybrid_min_ngram``..``prompt_lookup_max_ngram`` committed tokens earlier in the context:
with a match, the step's drafts are the tokens that followed it (one-hot q); without one, the draft
model drafts (its own q). The draft model follows the committed tokens lazily, so copied steps cost
it nothing until it drafts again, when it reads what it missed in one forward.

Before each step the drafter says how many drafts it can copy (:meth:`free_drafts`): a policy then
chooses γ for copies with copies' own acceptance and no drafting cost, and for the draft model with
its acceptance and measured costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.costs import CostModel
from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, KeepDrafting
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.prompt_lookup import lookup_continuation
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.sampling import SamplingParams

MAX_COPIED = 32  # the most drafts one lookup offers; a policy takes at most its own maximum of them


def hybrid_ngrams(options: DrafterOptions) -> tuple[int, int]:
    """(max, min) n-gram sizes the hybrid looks up: at least ``hybrid_min_ngram`` tokens long."""
    min_ngram = max(options.hybrid_min_ngram, options.prompt_lookup_min_ngram)
    return max(options.prompt_lookup_max_ngram, min_ngram), min_ngram


class ContextCopies:
    """What a hybrid copies after one request's committed tokens: the continuation of the latest earlier
    occurrence of their last ``min_ngram``..``max_ngram`` tokens. Looked up once per step and kept, since a
    step asks twice (the policy for the free drafts, then the drafter for the drafts)."""

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._key: tuple[int, int] = (0, -1)  # (context length, last token) of the copy kept
        self._copied: list[int] = []

    def after(self, context: list[int]) -> list[int]:
        """The drafts to copy after ``context`` ([T] committed ids); empty: no match, the draft model drafts."""
        key = (len(context), context[-1])
        if self._key != key:
            self._key, self._copied = key, lookup_continuation(context, MAX_COPIED, self.max_ngram, self.min_ngram)
        return self._copied


class HybridDrafter(Drafter):
    needs_draft_model = True
    offers_copies = True
    max_rows = 1  # the draft model's one conversation

    def __init__(self, model: DraftModelDrafter, max_ngram: int, min_ngram: int) -> None:
        self.model = model
        self.copies = ContextCopies(max_ngram, min_ngram)

    @classmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> HybridDrafter:
        return cls(DraftModelDrafter.create(target, draft, options), *hybrid_ngrams(options))

    def prefill(self, prompt_ids: list[list[int]]) -> None:
        self.model.prefill(prompt_ids)
        self.copies = ContextCopies(self.copies.max_ngram, self.copies.min_ngram)  # a new context: nothing kept

    def forget(self, keep: Sequence[int] = ()) -> None:
        self.model.forget(keep)

    def bind(self, target_cache: KVCache, cost_model: CostModel | None) -> None:
        self.model.bind(target_cache, cost_model)

    def free_drafts(self, context_ids: list[list[int]]) -> int:
        self.check_rows(context_ids)
        return len(self.copies.after(context_ids[0]))

    def backlog(self, context_ids: list[list[int]]) -> int:
        """What the draft model must read before it drafts (a policy may prefer its drafts to the copies)."""
        return self.model.backlog(context_ids)

    def propose(
        self,
        context_ids: list[list[int]],
        num_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
        copies: bool = True,
    ) -> DraftProposal:
        self.check_rows(context_ids)
        if copies and (copied := self.copies.after(context_ids[0])[:num_tokens]):  # else the policy chose the model
            return DraftProposal(token_ids=torch.tensor([copied], dtype=torch.long), probs=None)  # [1, γ]
        return self.model.propose(context_ids, num_tokens, sampling, generator, keep_drafting)
