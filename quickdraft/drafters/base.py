"""The drafter interface: propose up to γ tokens for each request of a step, for the target to verify.

A drafter serves any number of requests. :meth:`Drafter.start` makes a request's own drafting state (a draft
model's cache, a hybrid's copies, the exit layer early exit drafted with) and the drafter keeps what it learns
across requests (its :class:`DrafterRecords`, early exit's per-layer acceptance). Each step the engine hands it
one :class:`DraftTask` per request that drafts; :meth:`Drafter.propose` answers each with a
:class:`DraftProposal`, drafting for all of them together where it can (a draft model: one batched forward
per draft position). A request alone is a step of one task.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from quickdraft.drafters.records import DrafterRecords
from quickdraft.errors import ConfigError
from quickdraft.grammar import DraftCursor
from quickdraft.lossless.sampling import SamplingParams, is_int
from quickdraft.policies import MODEL_DRAFTS, KeepDrafting, Offer
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.vocabularies import VocabularyBridge


@dataclass(frozen=True)
class DraftProposal:
    """One request's drafted tokens and the distributions they were drawn from."""

    token_ids: torch.Tensor  # [1, γ] int64; γ may be smaller than asked (even 0)
    probs: torch.Tensor | None  # [1, γ, V] draft distribution q (unseeded sampling), or None: one-hot q, or not read
    predicted: bool = False  # copied from the request's predicted output (Drafter.expect)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[1])

    @classmethod
    def empty(cls) -> DraftProposal:
        return cls(token_ids=torch.empty(1, 0, dtype=torch.long), probs=None)

    @classmethod
    def copied(cls, token_ids: Sequence[int], predicted: bool = False) -> DraftProposal:
        """Drafts that are deterministic (copies from the context or the prediction): one-hot q."""
        if not token_ids:
            return cls.empty()
        return cls(token_ids=torch.tensor([list(token_ids)], dtype=torch.long), probs=None, predicted=predicted)


class DraftState:
    """One request's drafting state, made by :meth:`Drafter.start` and read only by its drafter (drafters with
    per-request state subclass it)."""


@dataclass(frozen=True, eq=False)
class DraftTask:
    """What one request asks of a step's drafting: everything a drafter may read of the request, none of it shared
    with the engine's state (a drafter may draft on another thread while the target runs)."""

    state: DraftState  # the request's, from the drafter's start()
    context: tuple[int, ...]  # [T] the committed tokens, prompt and answer so far: a snapshot, never changed
    num_tokens: int  # γ >= 1: the most to draft
    sampling: SamplingParams
    generator: torch.Generator  # unseeded sampling draws from it; seeded sampling from position noise
    keep_drafting: KeepDrafting  # the bid's judge, after each drafted token: False stops this request's drafting
    offer: Offer = MODEL_DRAFTS  # which of the drafter's offers (Drafter.offers) the policy bid on
    grammar: DraftCursor | None = None  # the drafter's own place in the request's grammar (a draft model drafts
    # only what it allows)


MAX_NGRAM = 16  # the largest n-gram size an option may give (prompt lookup's index holds each size up to it)


@dataclass(frozen=True)
class DrafterOptions:
    """Settings of the drafters; each drafter reads the ones it uses. N-gram sizes are at most ``MAX_NGRAM``: an
    index keeps every size's n-grams of the context."""

    prompt_lookup_max_ngram: int = 3
    prompt_lookup_min_ngram: int = 1
    hybrid_min_ngram: int = 2  # the hybrid copies only after a match this long (a 1-gram copy is a guess)
    draft_head: str | None = None  # the eagle drafter's trained head file (draft_head.file)
    # a draft model with another tokenizer: how its tokens become the target's (the pipeline sets it; None: the same
    # vocabulary)
    vocabulary_bridge: VocabularyBridge | None = None

    def __post_init__(self) -> None:
        for name in ("prompt_lookup_max_ngram", "prompt_lookup_min_ngram", "hybrid_min_ngram"):
            if not is_int(getattr(self, name)):
                raise ConfigError(f"{name} must be an integer, got {getattr(self, name)!r}", name)
            if getattr(self, name) > MAX_NGRAM:
                raise ConfigError(f"{name} is at most {MAX_NGRAM}, got {getattr(self, name)}", name)
        if self.draft_head is not None and not isinstance(self.draft_head, str | Path):
            raise ConfigError(f"draft_head must be a file's path, got {self.draft_head!r}", "draft_head")
        if self.vocabulary_bridge is not None and not isinstance(self.vocabulary_bridge, VocabularyBridge):
            raise ConfigError(f"vocabulary_bridge must be a VocabularyBridge, got {self.vocabulary_bridge!r}")
        if not 1 <= self.prompt_lookup_min_ngram <= self.prompt_lookup_max_ngram:
            wrong = "prompt_lookup_min_ngram" if self.prompt_lookup_min_ngram < 1 else "prompt_lookup_max_ngram"
            raise ConfigError(
                "prompt lookup n-gram sizes need 1 <= min <= max, got "
                f"min {self.prompt_lookup_min_ngram}, max {self.prompt_lookup_max_ngram}",
                wrong,
            )
        if self.hybrid_min_ngram < 1:
            message = f"the hybrid's n-gram size must be >= 1, got {self.hybrid_min_ngram}"
            raise ConfigError(message, "hybrid_min_ngram")


class Drafter(ABC):
    """Proposes continuations of requests' committed tokens; created by name from ``DRAFTERS``.

    Rules every drafter keeps: a proposal holds at most the task's γ tokens; a drafter that samples chooses
    each token with ``sampling.draw`` at the token's sequence position, with the task's generator (a
    seeded request's drafts then use the noise the target's tokens are chosen with there, so they agree as
    often as the models do), and after each token asks ``keep_drafting``; under unseeded sampling its ``probs``
    are exactly the q it sampled from (greedy and seeded verification never read them). The committed context
    may have dropped tokens it proposed earlier (rejections): a drafter with a cache rolls it back to the common
    prefix.
    """

    needs_draft_model: ClassVar[bool] = False
    needs_draft_head: ClassVar[bool] = False  # a trained draft head (DrafterOptions.draft_head; the target's default)
    proposes_drafts: ClassVar[bool] = True  # False: plain decoding, so no policy has a γ to choose
    follows_predictions: ClassVar[bool] = False  # True: it drafts from a request's predicted output (expect)
    copies_context: ClassVar[bool] = False  # True: it copies the context's n-grams (the n-gram sizes apply)
    drafts_hidden_states: ClassVar[bool] = False  # True: its draft steps carry the draft model's hidden states
    # (DraftStep.hidden), which SpecDec++'s acceptance head reads
    # A drafted token's cost as a fraction of a 1-token target step when the target drafts itself
    # (self-speculation); None: a draft model's measured step, or ~0 for model-free drafters.
    target_cost_fraction: ClassVar[float | None] = None
    # The target layers whose hidden states this drafter reads (observe_features); empty: none.
    feature_layers: tuple[int, ...] = ()

    def __init__(self, records: DrafterRecords | None = None) -> None:
        self.records = records if records is not None else DrafterRecords()  # across requests
        self.made_for: Runtime | None = None  # the target it drafts for, where a pipeline made it (engines check)

    @classmethod
    @abstractmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> Drafter:
        """Build the drafter for ``target`` (``draft`` is given when ``needs_draft_model``); ``records``: what its
        requests learn and measure, shared with other drafters of its name (None: its own)."""

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> DraftState:
        """A new request's drafting state; ``target_cache`` is its target cache (self-speculation drafts into it)."""
        return DraftState()

    def expect(self, state: DraftState, prediction: Sequence[int]) -> None:
        """The request's predicted output (OpenAI's Predicted Outputs) as token ids: a drafter that
        :attr:`follows_predictions` drafts from it where the answer follows it. Only those get one: the engine
        refuses a prediction for any other (``Engine.check_request``)."""
        raise NotImplementedError(f"{type(self).__name__} does not take a predicted output")

    def finish(self, state: DraftState) -> None:  # noqa: B027 - optional hook
        """The request ended: release or keep (for a later request) what its state holds."""

    def focus(self, prompts: Sequence[Sequence[int]]) -> None:  # noqa: B027 - optional hook
        """The prompts of every running request this drafter drafts for (a draft model whose LM head computes
        part of the vocabulary computes their tokens too)."""

    def forget(self, keep: Sequence[int] = ()) -> None:  # noqa: B027 - optional hook
        """Drop what is kept of earlier conversations (a draft model's caches) but the start they share with
        ``keep``, a prefix every request begins with (the chat template's system prompt); what was learned,
        such as acceptance statistics, stays."""

    def offers(self, state: DraftState, context: Sequence[int]) -> tuple[Offer, ...]:
        """What this drafter can draft for the request after ``context`` in the next step (:class:`Offer`; a policy
        bids on one and the task brings it back): by default its own drafts, with nothing to read first."""
        return (MODEL_DRAFTS,)

    @abstractmethod
    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        """Up to ``task.num_tokens`` drafts for each task, in the tasks' order. ``max_read_tokens``: the most a
        request's draft model may read before drafting in this step (a longer backlog is read in chunks over
        steps, drafting nothing until it is read; None: no limit)."""

    def observe(self, state: DraftState, proposed: int, accepted: int) -> None:  # noqa: B027 - optional hook
        """After verification: of ``proposed`` drafts of the request the target accepted the first ``accepted``."""

    def observe_features(self, state: DraftState, features: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """For a drafter with :attr:`feature_layers`: the target's features ``[K, C·H]`` of the request's next K
        committed positions, in order from the prompt's first (each position once)."""
