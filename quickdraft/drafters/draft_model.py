"""``draft-model``: a separate small LM with the same tokenizer drafts autoregressively.

Its KV cache follows the committed tokens lazily: before drafting, the cache is rolled back
to the longest prefix it shares with the committed context (dropping rejected drafts) and
the tokens it has not seen yet are fed in one forward (catching up on the target's token).
The prompt, too, is read only at the first draft: a request a policy decodes plainly (γ = 0
throughout, e.g. a long document with a short answer) never pays the draft model's prefill.
The cache outlives a request: the next one rolls it back to their common prefix, so a chat's
next turn reads only what is new (the user's message), not the whole conversation again.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftStep, KeepDrafting
from quickdraft.errors import ConfigError
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.sampling import SamplingParams, choose_tokens, logits_to_probs
from quickdraft.tokens import common_prefix_length


class DraftModelDrafter(Drafter):
    needs_draft_model = True
    max_rows = 1  # one conversation's cache

    def __init__(self, draft: Runtime, target_vocab_size: int) -> None:
        self.draft = draft
        self.target_vocab_size = target_vocab_size
        self.conversation = DraftCache(draft.new_cache(1))

    @property
    def cache(self) -> KVCache:
        return self.conversation.cache

    @property
    def cached_ids(self) -> list[int]:
        return self.conversation.cached_ids

    @classmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> DraftModelDrafter:
        if draft is None:
            raise ConfigError("the draft-model drafter needs a draft model (--draft)")
        return cls(draft, target.vocab_size)

    def prefill(self, prompt_ids: list[list[int]]) -> None:
        """Start a request; the prompt is read at the first draft, after the prefix still cached. A draft model
        whose LM head computes the frequent tokens only also computes the prompt's."""
        self.check_rows(prompt_ids)
        self.draft.focus_vocabulary(prompt_ids[0])

    def forget(self, keep: Sequence[int] = ()) -> None:
        self.conversation.roll_back(common_prefix_length(self.cached_ids, list(keep)))

    def backlog(self, context_ids: list[list[int]]) -> int:
        self.check_rows(context_ids)
        (context,) = context_ids  # [T]
        return self.conversation.backlog(context)

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
        (context,) = context_ids  # [T]
        num_tokens = min(num_tokens, self.draft.max_context - len(context))
        if num_tokens <= 0:
            return DraftProposal.empty(1)
        # 1. roll back to the prefix shared with the committed tokens (keeping >= 1 token to feed), then
        # 2. catch up on the committed tokens the cache has not seen
        logits, hidden = self._feed(self.conversation.catch_up(context))  # [1, V_draft], [1, H] or None
        # 3. draft autoregressively
        drafted: list[torch.Tensor] = []
        draft_probs: list[torch.Tensor] = []
        for step in range(num_tokens):
            probs = to_vocab(logits_to_probs(logits, sampling), self.target_vocab_size)  # [1, V]
            token = choose_tokens(probs, sampling, generator, position=len(context) + step)  # [1]
            drafted.append(token)
            draft_probs.append(probs)
            if keep_drafting is not None and not keep_drafting(DraftStep(logits, hidden, step + 1)):
                break
            if step + 1 < num_tokens:
                logits, hidden = self._feed(token.tolist())
        token_ids = torch.stack(drafted, dim=1)  # [1, γ]
        return DraftProposal(token_ids=token_ids, probs=torch.stack(draft_probs, dim=1))  # probs [1, γ, V]

    def _feed(self, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append tokens to the draft cache: the last position's logits ``[1, V_draft]`` and hidden state."""
        token_tensor = torch.tensor([token_ids], dtype=torch.long)
        if self.draft.provides_hidden:
            logits, hidden = self.draft.forward_with_hidden(token_tensor, self.cache, last_only=True)
            hidden = hidden[:, -1]  # [1, H]
        else:
            logits, hidden = self.draft.forward(token_tensor, self.cache, last_only=True), None
        self.cached_ids.extend(token_ids)
        return logits[:, -1], hidden


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


def to_vocab(probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft and target logits may be padded to different widths; ids beyond either are never drawn."""
    width = probs.shape[-1]
    if width >= vocab_size:
        return probs[..., :vocab_size]
    return torch.nn.functional.pad(probs, (0, vocab_size - width))
