"""Policies without measurements: transformers' heuristic and the draft's confidence."""

from __future__ import annotations

import torch

from quickdraft.policies import (
    DraftStep,
    PolicyContext,
    StepOutcome,
    make_policy,
)


def test_heuristic_grows_after_full_acceptance_and_shrinks_after_rejection() -> None:
    policy = make_policy("heuristic", PolicyContext(num_draft_tokens=4, max_draft_tokens=9))

    def judged(proposed: int, accepted: int) -> None:
        policy.observe(StepOutcome(policy.bid(), proposed, proposed, accepted))

    assert policy.choose() == 4
    judged(4, 4)
    assert policy.choose() == 6
    judged(6, 6)
    judged(8, 8)
    assert policy.choose() == 9  # capped
    for _ in range(12):
        judged(policy.choose(), 0)
    assert policy.choose() == 1  # never below 1
    judged(0, 0)  # nothing proposed: no change
    assert policy.choose() == 1


def test_confidence_stops_drafting_below_the_threshold() -> None:
    policy = make_policy("confidence:0.6", PolicyContext(max_draft_tokens=12))
    assert policy.choose() == 12
    assert policy.keep_drafting(DraftStep(torch.tensor([[4.0, 0.0, 0.0]]), None, 1))  # top probability 0.96
    assert not policy.keep_drafting(DraftStep(torch.tensor([[1.0, 1.0, 0.0]]), None, 2))  # top probability 0.42
