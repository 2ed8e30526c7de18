"""The one planner (SmartSpec's goodput for a step): plan_step on synthetic batch cost curves, and a request alone
as a batch of one."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import EXPENSIVE_DRAFT, FLAT, STEEP

from quickdraft.costs import BatchCostModel, CostModel, expected_tokens
from quickdraft.errors import ConfigError
from quickdraft.policies import (
    MODEL_DRAFTS,
    AcceptanceRecord,
    DraftBid,
    FixedPolicy,
    GoodputPolicy,
    Offer,
    StepState,
    alone_in_step,
    best_gamma,
    plan_step,
    step_reach,
)

# The default pair on a 2-core AVX-512 machine, roughly: a step is memory-bound up to a few tokens, then each
# token costs ~10 ms of compute; a draft forward ~15 ms for one request, a little more for many.
MEASURED_SHAPE = BatchCostModel(
    {1: 35.0, 2: 46.0, 4: 63.0, 8: 108.0, 16: 182.0, 32: 330.0, 64: 640.0, 128: 1270.0},
    {1: 15.0, 2: 16.0, 4: 18.0, 8: 24.0, 16: 36.0, 32: 60.0},
)
NEARLY_FREE_VERIFY = BatchCostModel({1: 100.0, 64: 101.0, 512: 110.0}, {1: 1.0, 64: 2.0})
COMPUTE_BOUND = BatchCostModel({1: 10.0, 128: 1280.0}, {1: 5.0, 128: 640.0})


BATCHED = Offer("model", batched=True)  # a draft model's drafts: rows of its forwards, shared by the step's requests


def drafting(bids_: list[DraftBid], uses_model: list[bool]) -> list[DraftBid]:
    """The bids on a draft model's batched drafts where ``uses_model`` says so, else on drafts of their own."""
    return [replace(bid, offer=BATCHED if m else MODEL_DRAFTS) for bid, m in zip(bids_, uses_model, strict=True)]


def bids(count: int, alpha: float, gamma: int = 8, beta: float | None = None) -> list[DraftBid]:
    return [DraftBid(gamma, alpha, alpha if beta is None else beta) for _ in range(count)]


def goodput(bids_: list[DraftBid], gammas: list[int], uses_model: list[bool], costs: BatchCostModel) -> float:
    """Expected tokens per ms of a plan (the quantity plan_step maximises), computed directly."""
    tokens = sum(gamma + 1 for gamma in gammas)
    expected = sum(
        expected_tokens(bid.acceptance_rate or 0.0, gamma, bid.continuation_rate)
        for bid, gamma in zip(bids_, gammas, strict=True)
    )
    positions = range(1, max(gammas, default=0) + 1)
    drafting = sum(costs.draft(sum(g >= p for g, m in zip(gammas, uses_model, strict=True) if m)) for p in positions)
    return expected / (costs.target(tokens) + drafting)


@pytest.mark.parametrize("count", [8, 32, 64])
def test_a_busy_batch_falls_to_plain_decoding(count: int) -> None:
    """Once the step is compute-bound a drafted token costs as much as any other token, and adds less than one."""
    assert plan_step(drafting(bids(count, 0.8), [True] * count), MEASURED_SHAPE) == [0] * count
    assert plan_step(drafting(bids(count, 0.95), [False] * count), COMPUTE_BOUND) == [0] * count


def test_verification_that_costs_a_step_per_token_is_never_worth_it() -> None:
    steep = BatchCostModel(dict(STEEP.target_ms), {1: 1.0})
    assert plan_step(drafting(bids(2, 0.9), [False, False]), steep) == [0, 0]


def test_a_small_batch_with_cheap_verification_keeps_speculating() -> None:
    gammas = plan_step(drafting(bids(2, 0.9), [True, True]), NEARLY_FREE_VERIFY)
    assert all(gamma >= 6 for gamma in gammas)
    assert plan_step(drafting(bids(2, 0.8), [True, True]), MEASURED_SHAPE)[0] >= 1  # memory-bound at two requests


def test_drafts_beside_a_prompt_chunk_pay_as_they_would_without_it() -> None:
    """A prompt chunk in the same forward makes the step compute-bound, and its tokens are work done: a draft
    there costs what a prompt token costs and adds less than one, so it does not pay; where the forward's cost
    hardly grows with its tokens, drafts pay beside a prompt as without it."""
    assert plan_step(drafting(bids(1, 0.6, 5), [True]), COMPUTE_BOUND, other_tokens=128) == [0]
    assert plan_step(drafting(bids(4, 0.8), [False] * 4), MEASURED_SHAPE, other_tokens=128) == [0] * 4
    assert plan_step(drafting(bids(2, 0.9), [False] * 2), NEARLY_FREE_VERIFY, other_tokens=128)[0] >= 6


def test_one_request_alone_keeps_its_policys_choice() -> None:
    """The single-request policy planned this step already, with costs corrected by its measured steps."""
    alone = drafting([DraftBid(5, 0.6, 0.6)], [True])
    assert alone_in_step(alone, other_tokens=0)
    assert not alone_in_step(alone, other_tokens=16) and not alone_in_step(alone * 2, other_tokens=0)


@pytest.mark.parametrize("costs", [FLAT, STEEP, EXPENSIVE_DRAFT])
def test_a_request_alone_is_planned_as_a_batch_of_one(costs: CostModel) -> None:
    """The planner's γ for one request is the argmax of its own goodput over 0..max (ties: the smaller γ): the
    obvious search is the oracle."""
    for alpha in (0.0, 0.3, 0.6, 0.8, 0.95, 1.0):
        for beta in (None, 0.5, 0.9):
            goodputs = [costs.goodput(alpha, gamma, beta) for gamma in range(17)]
            oracle = max(range(17), key=lambda gamma: (round(goodputs[gamma], 12), -gamma))
            assert best_gamma(costs, alpha, 16, beta) == oracle, (alpha, beta)


def test_drafts_go_where_they_are_accepted() -> None:
    mixed = [DraftBid(8, 0.95, 0.95), DraftBid(8, 0.2, 0.2), DraftBid(8, 0.7, 0.7)]
    gammas = plan_step(drafting(mixed, [False] * 3), MEASURED_SHAPE)
    assert gammas[0] > gammas[2] > gammas[1] == 0


def test_a_fixed_bid_keeps_its_gamma() -> None:
    fixed = [DraftBid(4), DraftBid(8, 0.9, 0.9)]
    assert plan_step(drafting(fixed * 16, [True] * 32), MEASURED_SHAPE)[::2] == [4] * 16
    assert plan_step(drafting([DraftBid(4)] * 32, [True] * 32), MEASURED_SHAPE) == [4] * 32


def test_the_plan_is_the_best_of_its_kind() -> None:
    """No plan that moves one draft between requests, or adds or removes one, does better."""
    requests = [DraftBid(6, 0.9, 0.95), DraftBid(6, 0.6, 0.8), DraftBid(6, 0.75, 0.5), DraftBid(3, 0.99, 0.99)]
    uses_model = [True, True, False, True]
    gammas = plan_step(drafting(requests, uses_model), MEASURED_SHAPE)
    best = goodput(requests, gammas, uses_model, MEASURED_SHAPE)
    for i in range(4):
        for delta in (-1, 1):
            other = list(gammas)
            other[i] += delta
            if 0 <= other[i] <= requests[i].num_draft_tokens:
                assert goodput(requests, other, uses_model, MEASURED_SHAPE) <= best + 1e-12, other


def test_reading_a_prompt_first_counts_against_drafting() -> None:
    reading = [DraftBid(4, 0.8, 0.8, reading_ms=1e6), DraftBid(4, 0.8, 0.8)]
    gammas = plan_step(drafting(reading, [True, True]), NEARLY_FREE_VERIFY)
    assert gammas[0] == 0 < gammas[1]


def test_a_goodput_policy_bids_what_it_would_choose_with_its_estimates() -> None:
    policy = GoodputPolicy(FLAT, 8, AcceptanceRecord.independent(90, 10))
    twin = GoodputPolicy(FLAT, 8, AcceptanceRecord.independent(90, 10))
    state = StepState(remaining_tokens=50, generated_tokens=5)
    bid = policy.bid(state)
    assert bid.num_draft_tokens == twin.choose(state) > 0
    assert bid.acceptance_rate == pytest.approx(twin.acceptance_rate())
    assert bid.continuation_rate == pytest.approx(twin.continuation_rate())
    assert not FixedPolicy(3).bid(state).negotiable and FixedPolicy(3).bid(state).num_draft_tokens == 3


def test_batch_cost_models_validate_and_round_trip() -> None:
    assert BatchCostModel.from_dict(MEASURED_SHAPE.to_dict()) == MEASURED_SHAPE
    assert MEASURED_SHAPE.target(0) == MEASURED_SHAPE.draft(0) == 0.0
    assert MEASURED_SHAPE.target(256) > MEASURED_SHAPE.target(128)  # extrapolated at the mean slope
    assert BatchCostModel({1: 10.0}).draft(8) == 0.0  # no draft model
    for bad in ({}, {0: 1.0}, {1: float("nan")}, {1: -1.0}):
        with pytest.raises(ConfigError):
            BatchCostModel(bad)
    with pytest.raises(ConfigError, match="not a saved batch cost model"):
        BatchCostModel.from_dict({"target_ms": 3})


def test_a_long_context_makes_its_requests_drafts_dearer_in_a_shared_step() -> None:
    """The batch curve is timed with few cached tokens: what a request's context adds comes with its bid."""
    short = bids(2, 0.8, 4)
    assert plan_step(drafting(short, [True, True]), MEASURED_SHAPE)[0] >= 1
    long = [replace(bid, context_ms=60.0, context_ms_per_draft=80.0) for bid in short]  # 16k tokens each
    assert plan_step(drafting(long, [True, True]), MEASURED_SHAPE) == [0, 0]
    mixed = plan_step(drafting([short[0], long[1]], [True, True]), MEASURED_SHAPE)
    assert mixed[0] >= 1 and mixed[1] == 0


def test_a_request_alone_may_run_to_its_reach_and_a_shared_step_keeps_to_the_plan() -> None:
    """A judged block runs past its plan only when its request has the step alone: a shared step's plan priced
    every request's drafts together."""
    reaching = DraftBid(3, 0.8, offer=MODEL_DRAFTS, reach=16)
    assert step_reach([reaching], [3], other_tokens=0) == [16]
    assert step_reach([reaching], [3], other_tokens=5) == [3]  # a prompt chunk shares the step
    assert step_reach([reaching, DraftBid(2, 0.8, offer=MODEL_DRAFTS)], [3, 2], other_tokens=0) == [3, 2]
    assert step_reach([DraftBid(3, 0.8, offer=MODEL_DRAFTS)], [3], other_tokens=0) == [3]  # no reach: the plan
    with pytest.raises(ValueError, match="reach"):
        DraftBid(4, reach=3)
