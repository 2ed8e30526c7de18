"""``draft-model``: a separate small LM with the same tokenizer drafts autoregressively, for every request of a
step together.

Each request has its own draft cache, which follows the committed tokens lazily: before drafting, it is rolled
back to the longest prefix it shares with the committed context (dropping rejected drafts) and the tokens it
has not seen yet are fed (catching up on the target's token). The prompt, too, is read only at the first draft:
a request a policy decodes plainly (γ = 0 throughout, e.g. a long document with a short answer) never pays the
draft model's prefill. One batched forward per draft position drafts for all the step's requests: the first
catches every cache up and gives each request its first draft, each later one feeds the requests still
drafting. A request's caches outlive it: the next request that starts with the same tokens (a chat's next turn,
the chat template's system prompt) takes the cache over and reads only what is new.

A draft model with another tokenizer (``DrafterOptions.vocabulary_bridge``) drafts through
:mod:`quickdraft.vocabularies`: its cache follows the committed tokens translated into its own, greedy requests take
its own tokens re-tokenized as text (string-level), and sampled ones, and any under a grammar, its distribution over
the tokens both vocabularies share (TLI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.errors import ConfigError
from quickdraft.grammar import masked
from quickdraft.lossless.sampling import any_finite, argmax, draw, logits_to_scores
from quickdraft.policies import MODEL_DRAFTS, DraftStep, Offer
from quickdraft.runtime.base import BatchRow, KVCache, Runtime
from quickdraft.tokens import common_prefix_length
from quickdraft.vocabularies import TranslatedContext, VocabularyBridge

KEPT_CACHES = 4  # draft caches of finished requests kept for later ones (the most recent)


class DraftCache:
    """A draft model's cache of one conversation and the tokens in it, following the committed tokens lazily."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.cached_ids: list[int] = []  # the tokens whose keys/values are in the cache

    def reusable_length(self, context: Sequence[int]) -> int:
        """Cached tokens that stay: the prefix shared with ``context``, leaving at least one token to feed."""
        return min(common_prefix_length(self.cached_ids, context), len(context) - 1)

    def backlog(self, context: Sequence[int]) -> int:
        """Tokens of ``context`` to feed before the next draft (the last committed one at least)."""
        return len(context) - self.reusable_length(context)

    def roll_back(self, length: int) -> None:
        self.cache.truncate(length)
        del self.cached_ids[length:]

    def catch_up(self, context: Sequence[int]) -> list[int]:
        """Roll back to the prefix shared with ``context``; the tokens to feed next (at least one)."""
        keep = self.reusable_length(context)
        self.roll_back(keep)
        return list(context[keep:])


@dataclass(eq=False)
class DraftModelState(DraftState):
    conversation: DraftCache  # the request's draft cache
    translation: TranslatedContext | None = None  # a foreign draft's: the committed tokens in its own

    def draft_context(self, context: Sequence[int]) -> Sequence[int]:
        """The committed tokens as the draft model reads them."""
        return context if self.translation is None else self.translation.update(context)


@dataclass(eq=False)
class DraftingRow:
    """One request's drafting in this step: what it drafted so far and the distributions they came from."""

    task: DraftTask
    conversation: DraftCache
    num_tokens: int  # γ: the most it drafts (0: it only reads its backlog this step)
    feed: list[int]  # tokens to feed the draft model next (the draft's ids)
    by_text: bool = False  # a foreign draft drafting greedily: its own tokens, re-tokenized at the end
    token_ids: list[int] = field(default_factory=list)  # the target's ids (by_text: the draft's, until proposed)
    probs: list[torch.Tensor] = field(default_factory=list)  # [1, V] each: q, kept for unseeded sampling only

    def proposal(self, bridge: VocabularyBridge | None) -> DraftProposal:
        if self.by_text and bridge is not None:  # string-level: the drafted text in the target's tokens
            token_ids = bridge.retokenize(self.task.context, self.token_ids)[: self.num_tokens]
            return DraftProposal.copied(token_ids)
        if not self.token_ids:
            return DraftProposal.empty()
        probs = torch.stack(self.probs, dim=1) if self.probs else None  # [1, γ, V]: unseeded sampling's q only
        return DraftProposal(torch.tensor([self.token_ids], dtype=torch.long), probs)


class DraftModelDrafter(Drafter):
    needs_draft_model = True
    drafts_hidden_states = True

    def __init__(
        self,
        draft: Runtime,
        target_vocab_size: int,
        records: DrafterRecords | None = None,
        bridge: VocabularyBridge | None = None,
    ) -> None:
        super().__init__(records)
        self.draft = draft
        self.target_vocab_size = target_vocab_size
        self.bridge = bridge  # None: the draft model shares the target's vocabulary
        self.kept: list[DraftCache] = []  # caches of finished requests, the most recent last

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> DraftModelDrafter:
        if draft is None:
            raise ConfigError("the draft-model drafter needs a draft model", "draft")
        return cls(draft, target.vocab_size, records, options.vocabulary_bridge)

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> DraftModelState:
        """A request takes over the kept cache that shares the longest start with its prompt (the most recent of
        equals), or a new one; its prompt is read at its first draft."""
        translation = None if self.bridge is None else TranslatedContext(self.bridge)
        prompt = prompt_ids if translation is None else translation.update(prompt_ids)
        shared = [common_prefix_length(cache.cached_ids, prompt) for cache in self.kept]
        if shared and max(shared) > 0:
            best = max(range(len(shared)), key=lambda i: (shared[i], i))
            return DraftModelState(self.kept.pop(best), translation)
        return DraftModelState(DraftCache(self.draft.new_cache(1)), translation)

    def finish(self, state: DraftState) -> None:
        assert isinstance(state, DraftModelState)
        self.kept = [*self.kept, state.conversation][-KEPT_CACHES:]

    def focus(self, prompts: Sequence[Sequence[int]]) -> None:
        """A draft model whose LM head computes the frequent tokens only also computes the prompts' tokens."""
        prompts = prompts if self.bridge is None else [self.bridge.to_draft(prompt) for prompt in prompts]
        self.draft.focus_vocabulary(sorted({token for prompt in prompts for token in prompt}))

    def forget(self, keep: Sequence[int] = ()) -> None:
        kept = list(keep) if self.bridge is None else self.bridge.to_draft(keep)
        for conversation in self.kept:
            conversation.roll_back(common_prefix_length(conversation.cached_ids, kept))

    def offers(self, state: DraftState, context: Sequence[int]) -> tuple[Offer, ...]:
        """Its drafts, as rows of batched forwards, after reading what its cache lacks of ``context``."""
        assert isinstance(state, DraftModelState)
        backlog = state.conversation.backlog(state.draft_context(context))
        return (Offer(MODEL_DRAFTS.source, backlog=backlog, batched=True, judged=True),)

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        rows = [self._row(task, max_read_tokens) for task in tasks]
        feeding = [row for row in rows if row.feed]
        while feeding:  # one batched forward per draft position
            batch = [BatchRow(row.conversation.cache, row.feed, last_only=True) for row in feeding]
            logits, hidden = self._forward(batch)  # per row [1, V_draft], [1, H] or None
            still_drafting = []
            for i, row in enumerate(feeding):
                row.conversation.cached_ids.extend(row.feed)
                if row.num_tokens > 0 and self._draft_one(row, logits[i], None if hidden is None else hidden[i]):
                    still_drafting.append(row)
            feeding = still_drafting
        return [row.proposal(self.bridge) for row in rows]

    def _row(self, task: DraftTask, max_read_tokens: int | None) -> DraftingRow:
        """The task's drafting: catch up on the committed tokens, then draft up to γ (what the context holds); a
        backlog longer than ``max_read_tokens`` is read in part, drafting nothing this step."""
        assert isinstance(task.state, DraftModelState)
        conversation = task.state.conversation
        context = task.state.draft_context(task.context)
        num_tokens = min(task.num_tokens, self.draft.max_context - len(context))
        if num_tokens <= 0:
            return DraftingRow(task, conversation, 0, [])
        feed = conversation.catch_up(context)
        if max_read_tokens is not None and len(feed) > max_read_tokens:
            return DraftingRow(task, conversation, 0, feed[:max_read_tokens])
        by_text = self.bridge is not None and task.sampling.is_greedy and task.grammar is None
        return DraftingRow(task, conversation, num_tokens, feed, by_text)

    def _forward(self, batch: list[BatchRow]) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        if self.draft.provides_hidden:  # for policies that stop on the draft's hidden state (specdec++)
            return self.draft.forward_batch_with_hidden(batch)
        return self.draft.forward_batch(batch), None

    def _draft_one(self, row: DraftingRow, logits: torch.Tensor, hidden: torch.Tensor | None) -> bool:
        """Choose the row's next draft from the draft model's ``[1, V_draft]`` logits; True to draft another."""
        task = row.task
        if row.by_text:  # string-level: the draft's own greedy token, its text re-tokenized when the row is done
            token = int(argmax(logits)[0])
            row.token_ids.append(token)
            row.feed = [token]
            if self.bridge.ends_text(token):  # (a by_text row has a bridge)
                return False  # its text ends there
            return (
                task.keep_drafting(DraftStep(logits, hidden, len(row.token_ids)))
                and len(row.token_ids) < row.num_tokens
            )
        if self.bridge is not None:  # TLI: its distribution over the tokens both vocabularies have, in target ids
            logits = self.bridge.target_scores(logits)  # [1, V]
        if task.grammar is not None:  # drafts from its distribution under the grammar
            allowed = task.grammar.draft_mask()  # [V] bool, None: the grammar is complete
            if allowed is not None:
                logits = masked(logits, to_vocab(allowed, logits.shape[-1]))  # [1, V_draft]
            if allowed is None or not any_finite(logits).any():  # nothing it allows can be drafted
                row.feed = []
                return False
        scores = logits_to_scores(logits, task.sampling)[..., : self.target_vocab_size]  # [1, ≤ V]
        if not any_finite(scores).any():  # ids the target lacks are never proposed: all its mass was there
            row.feed = []
            return False
        scores = to_vocab(scores, self.target_vocab_size)  # [1, V]
        position = len(task.context) + len(row.token_ids)
        tokens, probs = draw(scores, task.sampling, task.generator, position)  # q over the target's ids, unseeded
        token = int(tokens[0])
        if task.grammar is not None:
            task.grammar.take_draft(token)
        row.token_ids.append(token)
        if probs is not None:
            row.probs.append(probs)
        row.feed = [token if self.bridge is None else self.bridge.draft_of[token]]
        keep_drafting = task.keep_drafting(DraftStep(logits, hidden, len(row.token_ids)))
        return keep_drafting and len(row.token_ids) < row.num_tokens


def to_vocab(scores: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft and target logits may be padded to different widths; ids beyond either are never drawn (a boolean
    mask of allowed ids: never allowed; scores: −inf)."""
    width = scores.shape[-1]
    if width >= vocab_size:
        return scores[..., :vocab_size]
    fill = False if scores.dtype == torch.bool else float("-inf")
    return torch.nn.functional.pad(scores, (0, vocab_size - width), value=fill)
