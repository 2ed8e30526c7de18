"""``hybrid``: copy from the context when it repeats itself, otherwise draft with the draft model.

Prompt lookup costs nothing and is right most of the time where an answer quotes its prompt
(summaries, questions about a document, code edits); the draft model costs a forward per token
and is right about as often wherever the answer is new text. So each step first looks for the
last ``hybrid_min_ngram``..``prompt_lookup_max_ngram`` committed tokens earlier in the context:
with a match, the step's drafts are the tokens that followed it (one-hot q); without one, the draft
model drafts (its own q). The draft model follows the committed tokens lazily, so copied steps cost
it nothing until it drafts again, when it reads what it missed in one forward.

A request's predicted output (:meth:`HybridDrafter.expect`, OpenAI's Predicted Outputs) is copied first, where
the answer is on it (:mod:`quickdraft.drafters.prediction`).

``hybrid-suffix`` copies the suffix drafter's continuations instead (:mod:`quickdraft.drafters.suffix`: the
request's n-grams and those of earlier answers, scored by how often they were followed), as a free offer of its own
source, so a policy keeps their acceptance apart from the context copies'.

Before each step the drafter offers (:meth:`HybridDrafter.offers`) its copies, free, and its model's drafts: a
policy then chooses γ for copies with copies' own acceptance and no drafting cost, or for the draft model with its
acceptance and measured costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.drafters.prediction import PredictionCopies
from quickdraft.drafters.prompt_lookup import NgramIndex
from quickdraft.drafters.records import DrafterRecords
from quickdraft.drafters.suffix import SuffixDrafter, SuffixState
from quickdraft.policies import Offer
from quickdraft.runtime.base import KVCache, Runtime

MAX_COPIED = 32  # the most drafts one lookup offers; a policy takes at most its own maximum of them
COPIES = "copy"  # the source of the context copies' offer
SUFFIX_COPIES = "suffix"  # the source of the suffix drafter's copies' offer


def hybrid_ngrams(options: DrafterOptions) -> tuple[int, int]:
    """(max, min) n-gram sizes the hybrid looks up: at least ``hybrid_min_ngram`` tokens long."""
    min_ngram = max(options.hybrid_min_ngram, options.prompt_lookup_min_ngram)
    return max(options.prompt_lookup_max_ngram, min_ngram), min_ngram


class ContextCopies:
    """What a hybrid copies after one request's committed tokens: the continuation of the latest earlier
    occurrence of their last ``min_ngram``..``max_ngram`` tokens. Looked up once per step and kept, since a
    step asks twice (the policy for the free drafts, then the drafter for the drafts)."""

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.index = NgramIndex(max_ngram, min_ngram)
        self._key: tuple[int, int] = (0, -1)  # (context length, last token) of the copy kept
        self._copied: list[int] = []

    def after(self, context: Sequence[int]) -> list[int]:
        """The drafts to copy after ``context`` ([T] committed ids); empty: no match, the draft model drafts."""
        key = (len(context), context[-1])
        if self._key != key:
            self._key = key
            self._copied = self.index.continuation(context, MAX_COPIED)
        return self._copied


class SuffixCopies:
    """What a ``hybrid-suffix`` copies after one request's committed tokens: the suffix drafter's continuation of
    them (its index of the request follows the context as it grows), looked up once per step and kept."""

    def __init__(self, suffix: SuffixDrafter, state: SuffixState) -> None:
        self.suffix, self.state = suffix, state
        self._key: tuple[int, int] = (0, -1)
        self._copied: list[int] = []

    def after(self, context: Sequence[int]) -> list[int]:
        key = (len(context), context[-1])
        if self._key != key:
            self._key = key
            self.state.catch_up(context)
            self._copied = self.suffix.continuation(self.state, MAX_COPIED)
        return self._copied


class Copies(Protocol):
    def after(self, context: Sequence[int]) -> list[int]: ...


@dataclass(eq=False)
class HybridState(DraftState):
    model: DraftState  # the draft model's state of the request
    copies: Copies  # what the request's context (or, hybrid-suffix, earlier answers too) offers to copy
    prompt_length: int
    prediction: PredictionCopies | None = None  # the request's predicted output, if it gave one

    def copied(self, context: Sequence[int]) -> tuple[list[int], bool]:
        """What to copy after ``context`` (prompt + answer so far): the prediction's next tokens where the answer
        is on it, else the context's; and whether they are the prediction's."""
        if self.prediction is not None and (predicted := self.prediction.after(context[self.prompt_length :])):
            return predicted, True
        return self.copies.after(context), False


class HybridDrafter(Drafter):
    needs_draft_model = True
    drafts_hidden_states = True
    follows_predictions = True
    copies_context = True
    copy_source = COPIES  # the source its copies are offered under

    def __init__(self, model: Drafter, max_ngram: int, min_ngram: int) -> None:
        super().__init__(model.records)
        self.model = model
        self.feature_layers = model.feature_layers
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> HybridDrafter:
        return cls(DraftModelDrafter.create(target, draft, options, records), *hybrid_ngrams(options))

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> HybridState:
        copies = self.new_copies(prompt_ids, target_cache)
        return HybridState(self.model.start(prompt_ids, target_cache), copies, len(prompt_ids))

    def new_copies(self, prompt_ids: Sequence[int], target_cache: KVCache) -> Copies:
        """What a new request copies from: its context's n-grams."""
        return ContextCopies(self.max_ngram, self.min_ngram)

    def expect(self, state: DraftState, prediction: Sequence[int]) -> None:
        assert isinstance(state, HybridState)
        state.prediction = PredictionCopies(prediction, self.max_ngram, self.min_ngram, MAX_COPIED)

    def finish(self, state: DraftState) -> None:
        assert isinstance(state, HybridState)
        self.model.finish(state.model)

    def focus(self, prompts: Sequence[Sequence[int]]) -> None:
        self.model.focus(prompts)

    def forget(self, keep: Sequence[int] = ()) -> None:
        self.model.forget(keep)

    def observe_features(self, state: DraftState, features: torch.Tensor) -> None:
        assert isinstance(state, HybridState)
        self.model.observe_features(state.model, features)

    def offers(self, state: DraftState, context: Sequence[int]) -> tuple[Offer, ...]:
        """The copies after ``context`` (free; listed with 0 tokens when there are none), then its model's drafts."""
        assert isinstance(state, HybridState)
        copies = Offer(self.copy_source, max_tokens=len(state.copied(context)[0]), free=True)
        return (copies, *self.model.offers(state.model, context))

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        """Copies for the tasks whose policy bid on them (and whose context offers some); the draft model drafts for
        the others, together."""
        proposals: dict[int, DraftProposal] = {}
        model_tasks: dict[int, DraftTask] = {}
        for i, task in enumerate(tasks):
            assert isinstance(task.state, HybridState)
            copying = task.offer.source == self.copy_source
            copied, predicted = task.state.copied(task.context) if copying else ([], False)
            if copied:
                proposals[i] = DraftProposal.copied(copied[: task.num_tokens], predicted)
            else:
                model_tasks[i] = replace(task, state=task.state.model)
        drafted = self.model.propose(list(model_tasks.values()), max_read_tokens)
        proposals.update(zip(model_tasks, drafted, strict=True))
        return [proposals[i] for i in range(len(tasks))]


class HybridEagleDrafter(HybridDrafter):
    """``hybrid-eagle``: the same copies, with a trained draft head (:mod:`quickdraft.drafters.eagle`) drafting
    where the context offers none."""

    needs_draft_model = False
    drafts_hidden_states = False  # the head drafts: no draft model's states
    needs_draft_head = True

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> HybridEagleDrafter:
        return cls(EagleDrafter.create(target, draft, options, records), *hybrid_ngrams(options))


class HybridSuffixDrafter(HybridDrafter):
    """``hybrid-suffix``: the hybrid with the suffix drafter's copies (this request's and earlier answers'); each
    request's answer joins the suffix drafter's index of answers when it finishes."""

    copy_source = SUFFIX_COPIES

    copies_context = False  # its copies are the suffix drafter's: the n-gram sizes apply to predictions only

    def __init__(self, model: Drafter, max_ngram: int, min_ngram: int) -> None:
        super().__init__(model, max_ngram, min_ngram)
        self.suffix = SuffixDrafter(model.records)

    def new_copies(self, prompt_ids: Sequence[int], target_cache: KVCache) -> Copies:
        """What a new request copies from: the suffix drafter's continuations."""
        return SuffixCopies(self.suffix, self.suffix.start(prompt_ids, target_cache))

    def finish(self, state: DraftState) -> None:
        assert isinstance(state, HybridState) and isinstance(state.copies, SuffixCopies)
        self.suffix.finish(state.copies.state)
        super().finish(state)

    def forget(self, keep: Sequence[int] = ()) -> None:
        super().forget(keep)
        self.suffix.forget(keep)
