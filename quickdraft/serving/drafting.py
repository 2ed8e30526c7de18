"""Drafting for every decoding request of a step at once.

A draft model drafts for all its requests in batched forwards, one per draft position: the first forward
catches each request's draft cache up on what the target committed since (its prompt, at its first draft)
and gives every request's first draft; each later one feeds the requests still drafting their last draft.
Each request has its own draft cache, its own γ, sampling settings and policy (which may stop its drafting
early), and each of its drafts is chosen exactly as the single-request drafter chooses it. Prompt lookup
needs no model and drafts request by request; a hybrid request copies from its context when the context
repeats and drafts with the draft model otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.drafters import DRAFTERS
from quickdraft.drafters.base import DrafterOptions, DraftProposal, DraftStep
from quickdraft.drafters.draft_model import to_vocab
from quickdraft.drafters.hybrid import ContextCopies, hybrid_ngrams
from quickdraft.drafters.prompt_lookup import lookup_continuation
from quickdraft.runtime.base import BatchRow, Runtime
from quickdraft.sampling import choose_tokens, logits_to_probs
from quickdraft.serving.request import RequestState


@dataclass
class DraftingRow:
    """One request's drafting in this step: what it drafted so far and the distributions they came from."""

    state: RequestState
    num_tokens: int  # γ: the most it drafts
    token_ids: list[int]
    probs: list[torch.Tensor]  # [1, V] each
    feed: list[int]  # tokens to feed the draft model next

    def proposal(self) -> DraftProposal:
        if not self.token_ids:
            return DraftProposal.empty(1)
        probs = torch.stack(self.probs, dim=1) if self.probs else None  # [1, γ, V]
        return DraftProposal(torch.tensor([self.token_ids], dtype=torch.long), probs)


class BatchDrafter:
    """Drafts for a step's requests: a draft model in batched forwards, prompt lookup per request."""

    def __init__(
        self, draft: Runtime | None, target_vocab_size: int, options: DrafterOptions, max_read_tokens: int
    ) -> None:
        self.draft = draft
        self.target_vocab_size = target_vocab_size
        self.options = options
        self.max_read_tokens = max_read_tokens  # what a draft cache may catch up on in one step (a prompt's chunk)
        self.only_read: set[RequestState] = set()  # requests whose draft model read a chunk and drafted nothing

    def backlog(self, state: RequestState) -> int:
        """Committed tokens the request's drafter must read before its next draft (0 without a draft model)."""
        return 0 if state.draft_cache is None else state.draft_cache.backlog(state.committed)

    def focus(self, running: list[RequestState]) -> None:
        """A draft model whose LM head computes the frequent tokens only also computes the prompt tokens of every
        running request it drafts for (as the single-request drafter does for its one prompt)."""
        if self.draft is not None:
            prompts = [state.request.prompt_ids for state in running if state.draft_cache is not None]
            self.draft.focus_vocabulary(sorted({token for prompt in prompts for token in prompt}))

    def free_drafts(self, state: RequestState) -> int:
        """Drafts a hybrid request can copy from its context this step (0: none, or not a hybrid request)."""
        return len(self._copy(state))

    def _copy(self, state: RequestState) -> list[int]:
        if not DRAFTERS.get(state.request.drafter).offers_copies:
            return []
        if state.copies is None:
            state.copies = ContextCopies(*hybrid_ngrams(self.options))
        return state.copies.after(state.committed)

    def propose(
        self, gammas: dict[RequestState, int], copying: set[RequestState], alone: bool = False
    ) -> dict[RequestState, DraftProposal]:
        """Up to γ drafts for each request (``gammas``); requests with γ = 0 get an empty proposal, ``copying``
        ones their copies from the context (a hybrid's, where its policy took them). ``alone``: the
        step holds one request and nothing else, so its draft model reads its whole backlog and drafts at once
        (there is no one for the reading to stall)."""
        proposals = {state: DraftProposal.empty(1) for state in gammas}
        model_rows = []
        for state, gamma in gammas.items():
            if gamma <= 0:
                continue
            drafter = DRAFTERS.get(state.request.drafter)
            if not drafter.needs_draft_model:  # a served drafter without a model drafts from the context alone
                proposals[state] = self._look_up(state, gamma)
            elif state in copying and (copied := self._copy(state)[:gamma]):
                proposals[state] = DraftProposal(torch.tensor([copied], dtype=torch.long), None)  # [1, γ]
            elif state.draft_cache is not None and self.draft is not None:
                gamma = min(gamma, self.draft.max_context - len(state.committed))
                if gamma > 0:
                    model_rows.append(DraftingRow(state, gamma, [], [], state.draft_cache.catch_up(state.committed)))
        for row in self._draft_with_model(model_rows, None if alone else self.max_read_tokens):
            proposals[row.state] = row.proposal()
        return proposals

    def _look_up(self, state: RequestState, gamma: int) -> DraftProposal:
        options = self.options
        tokens = lookup_continuation(
            state.committed, gamma, options.prompt_lookup_max_ngram, options.prompt_lookup_min_ngram
        )
        if not tokens:
            return DraftProposal.empty(1)
        return DraftProposal(torch.tensor([tokens], dtype=torch.long), None)

    def _draft_with_model(self, rows: list[DraftingRow], max_read_tokens: int | None) -> list[DraftingRow]:
        """Draft autoregressively for every row, one batched forward per draft position; a backlog longer than
        ``max_read_tokens`` (None: no limit) is read in chunks, and the row drafts once it is read."""
        assert self.draft is not None or not rows
        self.only_read = set()
        for row in rows:
            if max_read_tokens is not None and len(row.feed) > max_read_tokens:
                row.feed, row.num_tokens = row.feed[:max_read_tokens], 0
                self.only_read.add(row.state)
        feeding = rows
        while feeding:
            batch = [BatchRow(row.state.draft_cache.cache, row.feed, last_only=True) for row in feeding]  # type: ignore[union-attr]
            logits = self.draft.forward_batch(batch)  # type: ignore[union-attr]  # per row [1, V_draft]
            next_feeding = []
            for row, row_logits in zip(feeding, logits, strict=True):
                row.state.draft_cache.cached_ids.extend(row.feed)  # type: ignore[union-attr]
                if row.num_tokens > 0 and self._draft_one(row, row_logits):
                    next_feeding.append(row)
            feeding = next_feeding
        return rows

    def _draft_one(self, row: DraftingRow, logits: torch.Tensor) -> bool:
        """Choose the row's next draft from the draft model's ``[1, V_draft]`` logits; True to draft another."""
        state, sampling = row.state, row.state.request.config.sampling
        probs = to_vocab(logits_to_probs(logits, sampling), self.target_vocab_size)  # [1, V]
        position = len(state.committed) + len(row.token_ids)
        token = int(choose_tokens(probs, sampling, state.generator, position)[0])
        row.token_ids.append(token)
        row.probs.append(probs)
        keep_drafting = state.policy.keep_drafting(DraftStep(logits, None, len(row.token_ids)))
        row.feed = [token]
        return keep_drafting and len(row.token_ids) < row.num_tokens
