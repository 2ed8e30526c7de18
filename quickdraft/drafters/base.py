"""The drafter interface: propose γ tokens that the target will verify in one pass."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from quickdraft.costs import CostModel
from quickdraft.errors import ConfigError
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.sampling import SamplingParams


@dataclass(frozen=True)
class DraftStep:
    """What a drafter knows right after drafting a token: what a policy may stop drafting on."""

    logits: torch.Tensor  # [B, V] the draft distribution's logits (temperature 1)
    hidden: torch.Tensor | None  # [B, H] the draft model's last hidden state, if the runtime gives it
    num_drafted: int  # tokens drafted so far in this step, this one included


# Called after each drafted token with what the drafter knows about it; False stops drafting
# (confidence-based policies). Drafters without a model never call it.
KeepDrafting = Callable[[DraftStep], bool]


@dataclass(frozen=True)
class DraftProposal:
    """Drafted tokens and the distributions they were drawn from."""

    token_ids: torch.Tensor  # [B, γ] int64; γ may be smaller than asked (even 0)
    probs: torch.Tensor | None  # [B, γ, V] draft distribution q, or None: deterministic (one-hot q)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[1])

    @classmethod
    def empty(cls, batch_size: int) -> DraftProposal:
        return cls(token_ids=torch.empty(batch_size, 0, dtype=torch.long), probs=None)


@dataclass(frozen=True)
class DrafterOptions:
    """Settings of the drafters; each drafter reads the ones it uses."""

    prompt_lookup_max_ngram: int = 3
    prompt_lookup_min_ngram: int = 1
    hybrid_min_ngram: int = 2  # the hybrid copies only after a match this long (a 1-gram copy is a guess)

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_lookup_min_ngram <= self.prompt_lookup_max_ngram:
            raise ConfigError(
                "prompt lookup n-gram sizes need 1 <= min <= max, got "
                f"min {self.prompt_lookup_min_ngram}, max {self.prompt_lookup_max_ngram}"
            )
        if self.hybrid_min_ngram < 1:
            raise ConfigError(f"the hybrid's n-gram size must be >= 1, got {self.hybrid_min_ngram}")


class Drafter(ABC):
    """Proposes continuations of the committed tokens; created by name from ``DRAFTERS``."""

    needs_draft_model: ClassVar[bool] = False
    proposes_drafts: ClassVar[bool] = True  # False: plain decoding, so no policy has a γ to choose
    offers_copies: ClassVar[bool] = False  # True: besides its model's drafts it may offer free copies (free_drafts)
    # A drafted token's cost as a fraction of a 1-token target step when the target drafts itself
    # (self-speculation); None: a draft model's measured step, or ~0 for model-free drafters.
    target_cost_fraction: ClassVar[float | None] = None
    # Rows (requests) one call may draft for: model-free drafters take any number; a drafter that keeps one
    # conversation's cache (a draft model, early exit into the target's cache) takes one.
    max_rows: ClassVar[int | None] = None

    @classmethod
    @abstractmethod
    def create(cls, target: Runtime, draft: Runtime | None, options: DrafterOptions) -> Drafter:
        """Build the drafter for ``target`` (``draft`` is given when ``needs_draft_model``)."""

    def prefill(self, prompt_ids: list[list[int]]) -> None:
        """Start new requests (``prompt_ids``: [B][T_b], B rows of prompt ids); drafters with per-request
        state reset it here."""
        self.check_rows(prompt_ids)

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        """Fail clearly when a call brings more rows than this drafter drafts for."""
        if self.max_rows is not None and len(rows) > self.max_rows:
            raise NotImplementedError(
                f"{type(self).__name__} drafts for {self.max_rows} row(s) at a time, got {len(rows)}"
            )

    def forget(self, keep: Sequence[int] = ()) -> None:  # noqa: B027 - optional hook
        """Drop the previous conversation (a draft model's cache of it) but the start it shares with
        ``keep``, a prefix every request begins with (the chat template's system prompt); what was
        learned, such as acceptance statistics, stays."""

    def bind(self, target_cache: KVCache, cost_model: CostModel | None) -> None:  # noqa: B027 - optional hook
        """The request's target cache (self-speculation drafts into it) and the measured costs, if any."""

    def observe(self, proposed: int, accepted: int) -> None:  # noqa: B027 - optional hook
        """After verification: of ``proposed`` drafts the target accepted the first ``accepted``."""

    def backlog(self, context_ids: list[list[int]]) -> int:
        """Committed tokens this drafter must read before it can draft after ``context_ids`` ([B][T_b]; policies
        weigh that cost); 0 for drafters without a model of their own."""
        return 0

    def free_drafts(self, context_ids: list[list[int]]) -> int:
        """Drafts the next proposal after ``context_ids`` ([B][T_b]) can copy at no cost, with an acceptance of
        their own (a hybrid's prompt lookup); 0: its drafts cost what the cost model says."""
        return 0

    @abstractmethod
    def propose(
        self,
        context_ids: list[list[int]],
        num_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        keep_drafting: KeepDrafting | None = None,
        copies: bool = True,
    ) -> DraftProposal:
        """Propose up to ``num_tokens`` tokens following each row of committed ``context_ids``.

        ``copies``: a drafter that offers free drafts (:meth:`free_drafts`) proposes them; False: the policy
        chose its model's drafts instead.

        ``context_ids``: [B][T_b], the committed tokens of B requests (at most :attr:`max_rows`); the
        proposal's ``token_ids`` are ``[B, γ]`` and its ``probs`` ``[B, γ, V]``. The committed context may
        have dropped tokens this drafter proposed earlier (rejections): a drafter with a cache rolls it
        back to the common prefix. A drafter that samples chooses each token with
        ``sampling.choose_tokens`` at the token's sequence position: a seeded request's drafts then use the
        noise the target's tokens are chosen with there (so they agree as often as the models do);
        ``generator`` is for unseeded requests.
        """
