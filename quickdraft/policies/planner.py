"""The one planner: how many of each request's bid drafts pay in a step, for a request alone and for a batch (a
batch of one is a batch). Goodput plans a request's own step with its corrected :class:`CostModel` and the engine
plans a shared step with the measured :class:`BatchCostModel`; both are :class:`StepCosts`."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from quickdraft.policies.base import DraftBid, Offer


class StepCosts(Protocol):
    """What a step costs, in milliseconds."""

    def target(self, num_tokens: int) -> float:
        """The target's forward over ``num_tokens`` new tokens of the step."""
        ...

    def draft(self, num_rows: int) -> float:
        """One draft forward over ``num_rows`` requests (one drafted token each)."""
        ...


def plan_step(bids: Sequence[DraftBid], costs: StepCosts, other_tokens: int = 0) -> list[int]:
    """SmartSpec's goodput for a step: the drafts per request, γ_i ≤ its bid, with the most expected tokens of the
    whole step per millisecond, Σ_i E[tokens_i | α_i, β_i, γ_i] ÷ t_step.

    t_step = t_target(Σ_i (γ_i + 1) + ``other_tokens``) + Σ_p t_draft(rows drafting a p-th token in the draft
    model's forwards: the bids whose offer is ``batched``) + each drafting request's reading and what its context
    adds (:class:`DraftBid`'s ``reading_ms``, ``context_ms``). A prompt token read (``other_tokens``) counts as a
    token of goodput: work every request needs done. A request's k-th draft adds α·β^(k−1) expected tokens
    (:meth:`DraftBid.gain`). Drafts are handed out one at a time, each to the request whose next draft adds the
    most expected tokens per millisecond it adds to the step; of the plans on the way, from no drafts to every bid
    in full, the one with the best goodput wins (ties: fewer drafts). A bid that is not negotiable keeps its γ
    (counted as one expected token). ``docs/serving.md`` gives the reasons.
    """
    target_ms, draft_ms = functools.cache(costs.target), functools.cache(costs.draft)  # few distinct arguments
    gammas = [0 if bid.negotiable else bid.num_draft_tokens for bid in bids]
    rows = Counter(position for i, gamma in enumerate(gammas) if bids[i].batched for position in range(1, gamma + 1))
    tokens, expected = len(bids) + other_tokens + sum(gammas), float(len(bids))
    drafting_ms = sum(draft_ms(count) for count in rows.values())  # and what the requests' contexts add:
    drafting_ms += sum(bid.context_ms + n * bid.context_ms_per_draft for bid, n in zip(bids, gammas, strict=True))
    expected += other_tokens  # prompt tokens read: work done, as generated tokens are
    best_goodput, best_gammas = expected / (target_ms(tokens) + drafting_ms), list(gammas)
    growing = [i for i, bid in enumerate(bids) if bid.negotiable and bid.num_draft_tokens > 0]

    def drafting_cost(i: int) -> float:  # what the next draft of request i adds to the step's drafting
        k = gammas[i] + 1
        model_ms = draft_ms(rows[k] + 1) - draft_ms(rows[k]) if bids[i].batched else 0.0
        return model_ms + bids[i].context_ms_per_draft + (bids[i].reading_ms if k == 1 else 0.0)

    while growing:
        verify_ms = target_ms(tokens + 1) - target_ms(tokens)
        i = max(growing, key=lambda i: bids[i].gain(gammas[i] + 1) / max(verify_ms + drafting_cost(i), 1e-9))
        drafting_ms += drafting_cost(i)
        gammas[i] += 1
        rows[gammas[i]] += bids[i].batched
        tokens, expected = tokens + 1, expected + bids[i].gain(gammas[i])
        if gammas[i] == bids[i].num_draft_tokens:
            growing.remove(i)
        goodput = expected / (target_ms(tokens) + drafting_ms)
        if goodput > best_goodput:
            best_goodput, best_gammas = goodput, list(gammas)
    return best_gammas


ALONE = Offer("alone", batched=True)  # a request planned alone: every draft it makes costs its costs' draft(1)


def best_gamma(costs: StepCosts, acceptance_rate: float, maximum: int, continuation_rate: float | None = None) -> int:
    """The γ in 0..``maximum`` a request alone plans at α and β (None: α) with its own ``costs``: a batch of one."""
    bid = DraftBid(maximum, acceptance_rate, continuation_rate, offer=ALONE)
    return plan_step([bid], costs)[0]


def step_reach(bids: Sequence[DraftBid], gammas: Sequence[int], other_tokens: int) -> list[int]:
    """How many tokens each request may draft in the step planned at ``gammas``: its γ, or, for a request alone in
    the step, as far as its bid's judged block may run (:attr:`DraftBid.reach`). A shared step keeps to the plan,
    whose cost the batch was planned with."""
    if alone_in_step(bids, other_tokens) and bids[0].reach is not None:
        return [max(gammas[0], bids[0].reach)]
    return list(gammas)


def alone_in_step(bids: Sequence[DraftBid], other_tokens: int) -> bool:
    """A step of one request and nothing else keeps its bid: its policy planned it already, with this planner and
    costs corrected by the request's measured steps."""
    return len(bids) == 1 and other_tokens == 0
