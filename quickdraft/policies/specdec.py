"""``specdec++``: draft while a trained acceptance head expects the whole block to be accepted (SpecDec++)."""

from __future__ import annotations

from dataclasses import replace

from quickdraft.errors import ConfigError
from quickdraft.policies.acceptance_head import AcceptanceHead
from quickdraft.policies.base import (
    POLICIES,
    UNKNOWN_STATE,
    DraftBid,
    DraftStep,
    Policy,
    PolicyContext,
    PolicyKind,
    StepState,
    number_argument,
)


class SpecDecPolicy(Policy):
    """SpecDec++: draft up to the maximum while P(a rejection in the block so far) stays ≤ T (:class:`BlockJudge`)."""

    def __init__(self, head: AcceptanceHead, threshold: float, maximum: int) -> None:
        self.head = head
        self.threshold = threshold
        self.maximum = maximum

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.maximum

    def bid(self, state: StepState = UNKNOWN_STATE) -> DraftBid:
        """:meth:`Policy.bid`'s, judged by a :class:`BlockJudge` of its own."""
        return replace(super().bid(state), keep_drafting=BlockJudge(self.head, self.threshold))


class BlockJudge:
    """One block's judge: the chance that the block so far is accepted, the product of the head's predictions."""

    def __init__(self, head: AcceptanceHead, threshold: float) -> None:
        self.head, self.threshold = head, threshold
        self.all_accepted = 1.0

    def __call__(self, step: DraftStep) -> bool:
        if step.hidden is None:
            return True  # a drafter without hidden states: the head cannot judge, draft on to the maximum
        self.all_accepted *= float(self.head.predict(step.hidden, step.logits).min())
        return 1.0 - self.all_accepted <= self.threshold


def _specdec(threshold: float | None, context: PolicyContext) -> Policy:
    if context.acceptance_head is None:
        raise ConfigError(
            "the specdec++ policy needs an acceptance head and none was found: train one with `quickdraft "
            "train-acceptance-head` (by default written where generate, bench and serve look for it)"
        )
    return SpecDecPolicy(context.acceptance_head, 0.7 if threshold is None else threshold, context.max_draft_tokens)


POLICIES.register("specdec++")(
    PolicyKind(_specdec, number_argument(float, "specdec++:T", 0.0, 1.0), needs_acceptance_head=True)
)
