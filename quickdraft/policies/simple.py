"""Policies that need no measurements: a fixed γ, transformers' heuristic, the draft's confidence."""

from __future__ import annotations

from quickdraft.lossless.sampling import top_probability
from quickdraft.policies.base import (
    MAX_DRAFT_TOKENS,
    POLICIES,
    UNKNOWN_STATE,
    DraftStep,
    Policy,
    PolicyContext,
    PolicyKind,
    StepOutcome,
    StepState,
    no_argument,
    number_argument,
)


class FixedPolicy(Policy):
    def __init__(self, num_draft_tokens: int) -> None:
        self.num_draft_tokens = num_draft_tokens

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.num_draft_tokens


class HeuristicPolicy(Policy):
    """transformers' schedule: +2 after a fully accepted block, −1 (down to 1) after a rejection."""

    def __init__(self, start: int, maximum: int) -> None:
        self.num_draft_tokens = max(1, min(start, maximum))
        self.maximum = maximum

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.num_draft_tokens

    def observe(self, outcome: StepOutcome) -> None:
        proposed, accepted = outcome.num_judged, outcome.num_accepted
        if proposed == 0:
            return
        if accepted == proposed:
            self.num_draft_tokens = min(self.maximum, self.num_draft_tokens + 2)
        else:
            self.num_draft_tokens = max(1, self.num_draft_tokens - 1)


class ConfidencePolicy(Policy):
    """Draft while the draft model's top probability (temperature 1) stays at or above the threshold."""

    def __init__(self, threshold: float, maximum: int) -> None:
        self.threshold = threshold
        self.maximum = maximum

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.maximum

    def keep_drafting(self, step: DraftStep) -> bool:
        return bool((top_probability(step.logits) >= self.threshold).all())  # every row sure enough


def _fixed(value: int | None, context: PolicyContext) -> Policy:
    return FixedPolicy(context.num_draft_tokens if value is None else value)


def _heuristic(_: None, context: PolicyContext) -> Policy:
    return HeuristicPolicy(context.num_draft_tokens, context.max_draft_tokens)


def _confidence(threshold: float | None, context: PolicyContext) -> Policy:
    return ConfidencePolicy(0.4 if threshold is None else threshold, context.max_draft_tokens)


POLICIES.register("fixed")(
    PolicyKind(
        _fixed,
        number_argument(int, "fixed:K", 0, MAX_DRAFT_TOKENS),
        uses_num_draft_tokens=True,
        uses_max_draft_tokens=False,
    )
)
POLICIES.register("heuristic")(PolicyKind(_heuristic, no_argument("heuristic"), uses_num_draft_tokens=True))
POLICIES.register("confidence")(PolicyKind(_confidence, number_argument(float, "confidence:T", 0.0, 1.0)))
