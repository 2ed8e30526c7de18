"""``eagle``: a draft head trained on the target's own features drafts (:mod:`quickdraft.draft_head`).

The target's forward gives, beside its logits, its hidden states after the head's feature layers at every
position it reads; the engine hands a request's drafter those of the positions it commits
(:meth:`Drafter.observe_features`). Before drafting, the head reads what it has not read yet: position p's
features with the token at p + 1, one row per position, in one forward of its single layer, into the request's
head cache. Its output at the last committed position p = T - 2 drafts the token at T; each further draft reads
the head's own previous output with the drafted token (a row appended to the cache, dropped after the step: the
target's features replace it once verified).

The head drafts on the native runtime's integer kernels where they build (:mod:`quickdraft.draft_head.native`).

Rules: the drafter never drafts a token outside the head's vocabulary (its q is 0 there); sampled drafts are
drawn as every drafter's are (``sampling.draw`` at the token's position), so seeded output does not change.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quickdraft.draft_head.file import load_head
from quickdraft.draft_head.model import DraftHead, HeadCache
from quickdraft.draft_head.native import to_native
from quickdraft.drafters.base import Drafter, DrafterOptions, DraftProposal, DraftState, DraftTask
from quickdraft.drafters.records import DrafterRecords
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import argmax, draw, logits_to_scores
from quickdraft.policies import MODEL_DRAFTS, DraftStep, Offer
from quickdraft.runtime.base import KVCache, Runtime
from quickdraft.runtime.native.kernels import native_kernels


@dataclass(eq=False)
class EagleState(DraftState):
    cache: HeadCache  # the head's keys and values of the positions it has read (0 .. cache.length - 1)
    unread: list[torch.Tensor] = field(default_factory=list)  # [K, C·H] target features of the next positions


class EagleDrafter(Drafter):
    needs_draft_head = True

    def __init__(
        self, head: DraftHead, feature_layers: tuple[int, ...], target: Runtime, records: DrafterRecords | None = None
    ) -> None:
        super().__init__(records)
        self.head = head
        self.feature_layers = feature_layers
        self.embed_tokens = target.embed_tokens  # token ids [n] -> [n, H]
        self.vocab_size = target.vocab_size
        self.vocabulary = head.vocabulary  # [Vd] target ids
        self.token_ms = self.measure_token_ms()  # a drafting step's cost: what its offers say a drafted token costs

    @classmethod
    def create(
        cls, target: Runtime, draft: Runtime | None, options: DrafterOptions, records: DrafterRecords | None = None
    ) -> EagleDrafter:
        if options.draft_head is None:
            raise ConfigError("the eagle drafter needs a trained draft head: train one with 'quickdraft train-draft'")
        head, layers, _ = load_head(Path(options.draft_head), target)
        return cls(to_native(head) if native_kernels() is not None else head, layers, target, records)

    def offers(self, state: DraftState, context: Sequence[int]) -> tuple[Offer, ...]:
        """Its drafts, each costing the head's measured drafting step (the calibration times no head)."""
        return (Offer(MODEL_DRAFTS.source, token_ms=self.token_ms, judged=True),)

    @torch.inference_mode()
    def measure_token_ms(self, context: int = 64, repeats: int = 5) -> float:
        """One greedy drafting step after ``context`` read positions (a row through the head, its logits, the
        argmax): the fastest of ``repeats`` after a warm-up, in ms."""
        cache = HeadCache(self.head.config)
        width = self.head.config.hidden_size
        self.head.decode(torch.zeros(1, context, width), torch.zeros(1, context, width), cache)
        times = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            output = self.head.decode(torch.zeros(1, 1, width), torch.zeros(1, 1, width), cache)
            argmax(self.head.logits(output)[0].float())
            times.append(time.perf_counter() - started)
            cache.truncate(context)
        return 1000 * min(times[1:])

    def start(self, prompt_ids: Sequence[int], target_cache: KVCache) -> EagleState:
        return EagleState(HeadCache(self.head.config))

    def observe_features(self, state: DraftState, features: torch.Tensor) -> None:
        assert isinstance(state, EagleState)
        state.unread.append(features.clone())

    def propose(self, tasks: Sequence[DraftTask], max_read_tokens: int | None = None) -> list[DraftProposal]:
        return [self._draft(task) for task in tasks]

    @torch.inference_mode()
    def _draft(self, task: DraftTask) -> DraftProposal:
        state, context = task.state, task.context
        assert isinstance(state, EagleState)
        read = state.cache.length
        features = torch.cat(state.unread) if state.unread else torch.empty(0)  # [n, C·H]
        if read + len(features) != len(context) - 1:
            known, needed = read + len(features), len(context) - 1
            raise RuntimeError(f"the eagle drafter has features of {known} positions; the context needs {needed}")
        state.unread = []
        # 1. Read the new positions p: their features and the token at p + 1.
        embeds = self.embed_tokens(torch.tensor(context[read + 1 :]))  # [n, H]
        output = self.head.decode(embeds[None], self.head.fuse(features)[None], state.cache)[:, -1:]  # [1, 1, H]
        # 2. Draft: each token from the last output; the next row reads that output and the drafted token.
        token_ids, probs = [], []
        while True:
            head_logits = self.head.logits(output)[0].float()  # [1, Vd]
            if task.sampling.is_greedy:  # the argmax, a one-hot q (the vocabulary is sorted: ties as over V)
                token = int(self.vocabulary[argmax(head_logits)[0]])
            else:
                logits = torch.full((1, self.vocab_size), -torch.inf)
                logits[:, self.vocabulary] = head_logits  # [1, V]
                scores = logits_to_scores(logits, task.sampling)  # [1, V]: what the token is drawn by
                tokens, token_probs = draw(scores, task.sampling, task.generator, len(context) + len(token_ids))
                token = int(tokens[0])
                if token_probs is not None:  # q, exactly what is drawn from (unseeded): what block verification reads
                    probs.append(token_probs)
            token_ids.append(token)
            drafted = len(token_ids)
            if drafted >= task.num_tokens or not task.keep_drafting(DraftStep(head_logits, None, drafted)):
                break
            output = self.head.decode(self.embed_tokens(torch.tensor([token]))[None], output, state.cache)
        # 3. Drop the drafted rows: the target's features take their positions once they are verified.
        state.cache.truncate(len(context) - 1)
        return DraftProposal(torch.tensor([token_ids], dtype=torch.long), torch.stack(probs, dim=1) if probs else None)
