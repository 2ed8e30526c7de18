"""goodput's decisions on synthetic cost curves and acceptance streams."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import DEFAULT_PAIR, EXPENSIVE_DRAFT, FLAT, MODERATE, READS_SLOWLY, STEEP

from quickdraft.costs import CostModel
from quickdraft.lossless.sampling import top_probability as top_probability_of
from quickdraft.policies import (
    UNKNOWN_STATE,
    AcceptanceRecord,
    AnswerLength,
    AnswerLengthRecord,
    BetaCounts,
    DraftStep,
    GoodputPolicy,
    Offer,
    StepOutcome,
    StepState,
    StepTimeRecord,
    best_gamma,
)
from quickdraft.policies.goodput import MEASURED_BACKLOG, FreeSource, GoodputBid
from quickdraft.policies.records import MIN_SAMPLES

BENCH_DRAFT = CostModel({1: 60.0, 2: 69.0, 3: 80.0, 4: 88.0, 5: 98.0}, draft_ms=18.0)  # the AVX-512 machine's steps


def state(
    remaining_tokens: int | None = None,
    backlog: int = 0,
    generated_tokens: int | None = None,
    copies: int | None = None,
    context_tokens: int = 0,
) -> StepState:
    """A step's state for a drafter whose model must read ``backlog`` tokens first; with ``copies``, a hybrid's,
    whose context offers that many free copies (0: a hybrid with nothing to copy this step)."""
    offers = (Offer("model", backlog=backlog),)
    if copies is not None:
        offers = (Offer("copy", max_tokens=copies, free=True), *offers)
    return StepState(remaining_tokens, generated_tokens, context_tokens, offers)


def step(
    policy: GoodputPolicy, at: StepState = UNKNOWN_STATE, accepted: int = 0, step_ms: float | None = None
) -> GoodputBid:
    """One step as the engine takes it: the policy bids, its drafts are proposed in full, the first ``accepted``
    of them are accepted (step_ms: the request had the step alone), and the policy observes the outcome."""
    bid = policy.bid(at)
    drafted = bid.num_draft_tokens
    policy.observe(StepOutcome(bid, drafted, drafted, min(accepted, drafted), step_ms))
    return bid


def blocks(
    policy: GoodputPolicy, proposed: int, accepted: int, at: StepState = UNKNOWN_STATE, bid: GoodputBid | None = None
) -> None:
    """A verified block of ``proposed`` drafts of which the first ``accepted`` were accepted, whatever the policy
    bid (``bid``: as if it had bid that)."""
    policy.observe(StepOutcome(bid or policy.bid(at), proposed, proposed, accepted))


def feed(policy: GoodputPolicy, alpha: float, steps: int, seed: int = 0, later: float | None = None) -> list[int]:
    """Run ``steps`` steps where each draft is accepted with probability ``alpha`` (with ``later``: a block's
    first draft with ``alpha``, each later one after an accepted one with ``later``); the γ chosen."""
    rng = random.Random(seed)
    chosen = []
    for _ in range(steps):
        bid = policy.bid()
        gamma = bid.num_draft_tokens
        chosen.append(gamma)
        accepted = 0
        while accepted < gamma and rng.random() < (later if accepted and later is not None else alpha):
            accepted += 1
        policy.observe(StepOutcome(bid, gamma, gamma, accepted))
    return chosen


def target_logits(top_probability: float, vocab: int = 8) -> torch.Tensor:
    """``[1, V]`` logits whose top probability is ``top_probability`` (the rest spread evenly)."""
    rest = (1.0 - top_probability) / (vocab - 1)
    return torch.tensor([[top_probability] + [rest] * (vocab - 1)]).log()


def observe_plain(policy: GoodputPolicy, probability: float) -> None:
    """A token chosen without drafts, as the engine tells a policy of it: the target's confidence, if it wants it."""
    if policy.wants_confidence():
        policy.observe_confidence(float(top_probability_of(target_logits(probability))))


def choose_plainly_observed(policy: GoodputPolicy, states: list[StepState], top_probability: float) -> list[int]:
    """A step for each state, nothing judged; after every plain step the policy sees the target's logits, as in
    the engine."""
    chosen = []
    for at in states:
        bid = policy.bid(at)
        policy.observe(StepOutcome(bid))  # nothing judged (the request ends, or no draft is accepted or rejected)
        chosen.append(bid.num_draft_tokens)
        if chosen[-1] == 0:
            observe_plain(policy, top_probability)
    return chosen


def seen_plainly(policy: GoodputPolicy, count: int, top_probability: float) -> None:
    """The policy sees the target's logits of ``count`` plain tokens (the prefill's and plain steps')."""
    for _ in range(count):
        observe_plain(policy, top_probability)


def test_goodput_stops_drafting_when_nothing_is_accepted() -> None:
    policy = GoodputPolicy(MODERATE, maximum=16)
    chosen = feed(policy, alpha=0.0, steps=60)
    assert chosen[-30:].count(0) >= 28  # plain steps, apart from rare probes
    assert 1 in chosen[-30:]  # the probe re-measures α now and then
    assert max(chosen[-30:]) == 1


def test_goodput_drafts_long_for_a_predictable_request() -> None:
    chosen = feed(GoodputPolicy(FLAT, maximum=16), alpha=0.95, steps=40)
    assert min(chosen[-20:]) >= 10


def test_goodput_estimate_reaches_past_the_prior_when_every_draft_is_accepted() -> None:
    policy = GoodputPolicy(MODERATE, maximum=16, record=AcceptanceRecord.independent(50, 50))
    feed(policy, alpha=1.0, steps=60)
    assert policy.acceptance_rate() > 0.99  # the prior decays with the oldest evidence: one block's first draft
    assert policy.continuation_rate() > 0.99  # and every later draft, each its own observation
    blocks(policy, 4, 3)
    assert policy.acceptance_rate() > 0.99  # the block's first draft was accepted
    assert 0.9 < policy.continuation_rate() < 0.95  # one rejection among ~12 later drafts' worth of evidence


def test_goodput_drafts_long_blocks_when_a_good_start_keeps_being_right() -> None:
    """A cheap drafter whose first draft is right half the time, and then right on: a single per-draft
    rate (α = β = 0.5) keeps γ at 1; knowing that later drafts go on being accepted, γ grows."""
    cheap = CostModel({1: 60.0, 2: 69.0, 3: 80.0, 4: 88.0, 5: 98.0}, draft_ms=1.8)  # prompt lookup, measured shape
    assert best_gamma(cheap, 0.5, 16) == 1
    assert best_gamma(cheap, 0.5, 16, continuation_rate=0.95) >= 4
    chosen = feed(GoodputPolicy(cheap, maximum=16), alpha=0.5, later=0.97, steps=200)
    assert sum(chosen[-100:]) / 100 >= 4
    never = feed(GoodputPolicy(cheap, maximum=16), alpha=0.05, later=0.97, steps=200)
    assert never[-100:].count(0) >= 90  # a first draft that is never right: plain steps, however good the rest


def draft_step(top_probability: float, num_drafted: int) -> DraftStep:
    return DraftStep(target_logits(top_probability), None, num_drafted)


def test_goodput_without_evidence_on_later_drafts_takes_them_as_independent() -> None:
    """β without evidence of its own is α, and a pessimistic record of later drafts fades as blocks of one
    go on being accepted: the policy lengthens its blocks instead of staying at γ = 1."""
    fresh = GoodputPolicy(BENCH_DRAFT, 16)
    assert fresh.continuation_rate() == fresh.acceptance_rate()
    gloomy = AcceptanceRecord(first=BetaCounts(95, 5), later=BetaCounts(3, 2))  # three of five later drafts
    policy = GoodputPolicy(BENCH_DRAFT, 16, gloomy)
    chosen = feed(policy, alpha=1.0, steps=40)
    assert chosen[0] == 1 and max(chosen[-10:]) >= 4


def test_goodput_probes_a_second_draft_after_blocks_of_one() -> None:
    policy = GoodputPolicy(BENCH_DRAFT, 16)
    for _ in range(50):  # half the first drafts are accepted: one draft a block pays, two do not
        blocks(policy, 1, 1, bid=GoodputBid(2))  # as if bid at γ 2: no block of one in a row counted yet
        blocks(policy, 1, 0, bid=GoodputBid(2))
    chosen = choose_plainly_observed(policy, [UNKNOWN_STATE] * 34, top_probability=0.5)
    assert chosen == ([1] * 16 + [2]) * 2  # every 16 blocks of one, a block of two measures β


def test_goodput_stops_a_block_when_the_next_draft_is_not_expected_to_pay() -> None:
    """MODERATE: a plain step 100 ms, a draft 5 ms, one more verified token 5-10 ms more. The plan (γ 8 at α 0.86,
    β 0.89) promises a token per 36.4 ms, and a next draft must add tokens at that rate: its survival times β against
    its 12.5-13.75 ms."""
    good = AcceptanceRecord.independent(900, 100)
    sure = GoodputPolicy(MODERATE, 16, good).bid()
    assert sure.num_draft_tokens == 8
    assert 1.0 / sure.keep_drafting.planned_goodput == pytest.approx(36.44, abs=0.01)  # type: ignore[attr-defined]
    assert all(sure.keep_drafting(draft_step(0.95, k)) for k in range(1, 9))  # 0.95^8 · 0.89 = 0.59 > 13.75 / 36.4
    unsure_policy = GoodputPolicy(MODERATE, 16, good)
    unsure = unsure_policy.bid()
    assert unsure.keep_drafting(draft_step(0.5, 1))  # 0.5 · 0.89 = 0.45 > 12.5 / 36.4 = 0.34
    assert not unsure.keep_drafting(draft_step(0.5, 2))  # 0.25 · 0.89 = 0.22 < 0.34 (at the plain rate, 1/100 ms: on)
    assert unsure.keep_drafting.block_survival == pytest.approx(0.25)  # type: ignore[attr-defined]
    again = unsure_policy.bid()  # a new block starts with nothing drafted, whatever the last one did
    assert again.keep_drafting.block_survival == 1.0 and not again.keep_drafting(draft_step(0.1, 1))  # type: ignore[attr-defined]
    expensive = GoodputPolicy(EXPENSIVE_DRAFT, 16, good).bid()  # a draft token costs 60 % of a plain step
    assert expensive.keep_drafting(draft_step(0.9, 1)) and not expensive.keep_drafting(draft_step(0.7, 2))


def test_goodput_lets_a_plan_of_judged_drafts_run_on_but_not_a_probe_or_unjudged_drafts() -> None:
    """A draft model's drafts are judged token by token, so a plan of them may run to the maximum (``reach``, taken
    when the request is alone); drafts nothing judges (prompt lookup's, MODEL_DRAFTS) and probes keep their γ."""
    good = AcceptanceRecord.independent(900, 100)
    judged = StepState(offers=(Offer("model", judged=True),))
    bid = GoodputPolicy(MODERATE, 16, good).bid(judged)
    assert bid.num_draft_tokens == 8 and bid.reach == 16
    assert bid.capped(5).num_draft_tokens == 5 and bid.capped(5).reach == 5  # the request's budget caps both
    assert GoodputPolicy(MODERATE, 16, good).bid().reach is None  # unjudged drafts: the plan is the most
    probing = GoodputPolicy(MODERATE, 16, AcceptanceRecord.independent(1, 99))
    for _ in range(16):
        probing.observe(StepOutcome(probing.bid(judged)))
    probe = probing.bid(judged)
    assert probe.num_draft_tokens == 1 and probe.reach is None  # a probe of α drafts one


def test_goodput_counts_only_blocks_that_stopped_at_one_toward_a_probe_of_beta() -> None:
    policy = GoodputPolicy(BENCH_DRAFT, 16)
    judged = StepState(offers=(Offer("model", judged=True),))
    for _ in range(50):  # half the first drafts are accepted: one draft a block pays, two do not
        blocks(policy, 1, 1, bid=GoodputBid(2))
        blocks(policy, 1, 0, bid=GoodputBid(2))
    for step in range(40):  # blocks planned at one that ran on to three: β is being measured, no probe needed
        bid = policy.bid(judged)
        assert bid.num_draft_tokens == 1  # counted by the plan alone, the 17th would probe with 2
        policy.observe(StepOutcome(bid, 3, 3, int(step % 4 != 3)))  # α about three quarters, β about 0


def test_goodput_drafts_short_when_verification_is_expensive() -> None:
    chosen = feed(GoodputPolicy(STEEP, maximum=16), alpha=0.8, steps=40)
    assert max(chosen[-20:]) <= 1


def test_goodput_adapts_when_the_text_changes() -> None:
    policy = GoodputPolicy(MODERATE, maximum=16)
    feed(policy, alpha=0.95, steps=30)
    assert policy.choose() >= 6
    chosen = feed(policy, alpha=0.0, steps=40, seed=1)
    assert chosen[-10:].count(0) >= 9


def test_goodput_prior_comes_from_the_drafters_record() -> None:
    good, bad = AcceptanceRecord.independent(900, 100), AcceptanceRecord.independent(10, 990)
    assert GoodputPolicy(MODERATE, 16, good).choose() > GoodputPolicy(MODERATE, 16, bad).choose() == 0
    record = AcceptanceRecord()
    feed(GoodputPolicy(FLAT, 16, record), alpha=0.9, steps=20)
    assert record.first.accepted > record.first.rejected > 0 and record.later.accepted > record.later.rejected > 0


def test_goodput_weighs_what_reading_the_prompt_costs_the_drafter() -> None:
    good = AcceptanceRecord.independent(900, 100)
    policy = GoodputPolicy(READS_SLOWLY, 16, good)
    seen_plainly(policy, 4, top_probability=0.9)
    assert policy.choose(state(remaining_tokens=20, backlog=2000)) == 0  # long document, short answer
    assert policy.choose(state(remaining_tokens=5000, backlog=2000)) > 0  # a long answer repays it
    assert policy.choose(state(remaining_tokens=20, backlog=1)) > 0  # already read: just draft
    assert policy.choose(state(remaining_tokens=None, backlog=2000)) > 0  # no budget known: draft
    assert GoodputPolicy(MODERATE, 16, good).choose(state(20, 2000)) > 0  # reading is free in this model


def test_goodput_probes_unless_the_drafter_would_read_a_long_document_first() -> None:
    bad = AcceptanceRecord.independent(0, 100)
    short_prompt, long_prompt = GoodputPolicy(READS_SLOWLY, 16, bad), GoodputPolicy(READS_SLOWLY, 16, bad)
    chosen = choose_plainly_observed(short_prompt, [state(100, 120)] * 17, top_probability=0.1)
    assert chosen == [0] * 16 + [1]  # a one-token probe after 16 plain steps: reading 120 tokens is cheap enough
    assert choose_plainly_observed(long_prompt, [state(100, 2000)] * 40, top_probability=0.1) == [0] * 40


def test_goodput_times_a_drafted_token_after_a_step_that_read_a_backlog() -> None:
    """A profile that overstates the draft keeps the model to probes, which read a backlog and go untimed: the step
    after each drafts one token, caught up and timed, so the real (cheaper) cost is learned and drafting resumes."""
    overstated = CostModel({1: 60.0, 2: 69.0, 3: 80.0, 4: 88.0, 5: 98.0}, draft_ms=55.0)
    record = AcceptanceRecord.independent(70, 30)
    step_times = StepTimeRecord()
    policy = GoodputPolicy(overstated, 4, record, step_times=step_times)
    backlog, chosen = 1, []
    for _ in range(120):
        bid = policy.bid(state(backlog=backlog))
        drafted = bid.num_draft_tokens
        step_ms = 60.0 if drafted == 0 else overstated.target(drafted + 1) + drafted * 15.0  # drafts cost 15 ms
        if backlog > MEASURED_BACKLOG and drafted:
            step_ms += 40.0  # reading the backlog first
        policy.observe(StepOutcome(bid, drafted, drafted, drafted, step_ms))
        backlog = backlog + 1 if drafted == 0 else 1  # the draft model reads lazily
        chosen.append(drafted)
    assert chosen[:17] == [0] * 16 + [1]  # the first probe, after 16 plain steps
    assert chosen[17] == 1 and chosen[18] == 0  # its backlog made it untimed: the next step is timed, then plain
    assert step_times.draft_token_ms == pytest.approx(15.0)
    assert sum(chosen[-20:]) >= 20  # priced as measured, drafting pays
    shared = GoodputPolicy(overstated, 4, record)
    for backlog in range(1, 18):  # a probe in a shared step: no step of it is timed, so none is made up for
        bid = shared.bid(state(backlog=backlog))
        shared.observe(StepOutcome(bid, bid.num_draft_tokens, bid.num_draft_tokens, bid.num_draft_tokens))
    assert bid.num_draft_tokens == 1 and shared.choose(state(backlog=1)) == 0
    alone = GoodputPolicy(overstated, 4, record)
    for backlog in range(1, 18):
        bid = alone.bid(state(backlog=backlog))
        step_ms = 140.0 if bid.num_draft_tokens else 60.0  # the probe reads its backlog first
        alone.observe(StepOutcome(bid, bid.num_draft_tokens, bid.num_draft_tokens, bid.num_draft_tokens, step_ms))
    assert alone.choose(state(backlog=MEASURED_BACKLOG + 1)) == 0  # not caught up: a timed step would read first
    assert alone.choose(state(backlog=MEASURED_BACKLOG)) == 1


def test_goodput_without_history_probes_a_fresh_draft_model() -> None:
    """No record, costs where the prior α = 0.5 gives γ = 0: the draft model must still get a probe."""
    policy = GoodputPolicy(CostModel({1: 106.0, 2: 119.0, 4: 127.0}, draft_ms=50.0, draft_prefill_ms={128: 900.0}), 3)
    # a 100-token prompt the draft model has not read, and one more plain-decoded token per step
    states = [state(remaining_tokens=128 - n, backlog=100 + n) for n in range(20)]
    chosen = choose_plainly_observed(policy, states, top_probability=0.5)
    assert chosen[0] == 0 and 1 in chosen


def test_goodput_counts_the_targets_confidence_before_paying_for_the_reading() -> None:
    """A good record says draft; the target's confidence on the plain tokens so far decides the reading."""
    good = AcceptanceRecord.independent(800, 200)
    short_prompt = state(remaining_tokens=120, backlog=60)  # reading costs 277 ms
    unsure, sure = GoodputPolicy(DEFAULT_PAIR, 16, good), GoodputPolicy(DEFAULT_PAIR, 16, good)
    seen_plainly(unsure, 4, top_probability=0.4)
    seen_plainly(sure, 4, top_probability=0.98)
    assert unsure.choose(short_prompt) == 0 and sure.choose(short_prompt) > 0
    blocks(sure, 2, 2, short_prompt)  # it read and drafted: from now on only real acceptances count
    alpha = (0.92 * 6.9 + 1.0) / (0.92 * 9.0 + 1.0)  # the block's first draft was accepted
    later_accepted, later_rejected = 0.92**2 * 6.4 + 1.0, 0.92**2 * 1.6  # both drafts discount β's prior; one adds
    beta = (later_accepted + 2.0 * alpha) / (later_accepted + later_rejected + 2.0)  # shrunk toward α
    assert sure.acceptance_rate() == pytest.approx(alpha) and sure.continuation_rate() == pytest.approx(beta)
    seen = sure.top_probability_sum
    observe_plain(sure, 0.01)
    assert sure.top_probability_sum == seen  # a later plain step is not evidence
    assert sure.choose(state(remaining_tokens=100, backlog=30)) > 0
    at_once = GoodputPolicy(DEFAULT_PAIR, 16, good)
    seen_plainly(at_once, 1, top_probability=0.98)  # the prefill's token only: no forced plain steps to look
    assert at_once.choose(short_prompt) > 0
    no_reading = GoodputPolicy(DEFAULT_PAIR, 16, good)
    assert no_reading.choose(state(remaining_tokens=120, backlog=1)) > 0  # nothing to read
    assert GoodputPolicy(MODERATE, 16, good).choose(short_prompt) > 0  # reading is free in this model


def reading_steps(
    policy: GoodputPolicy, prompt_tokens: int, budget: int, top_probability: float, copies: int | None = None
) -> list[int]:
    """γ per step of a request whose drafter has not read its prompt, as the engine reports it (``copies``: a
    hybrid's, with that many copies on offer)."""
    chosen: list[int] = []
    for generated in range(1, budget):
        at = state(budget - generated, prompt_tokens + generated, generated, copies)
        chosen += choose_plainly_observed(policy, [at], top_probability)
        if chosen[-1] > 0:
            break
    return chosen


def test_goodput_pays_for_the_reading_once_the_answer_has_run_as_long_as_it_costs() -> None:
    """Ski rental: read once the plain tokens so far, drafted, would have saved what the reading costs."""
    good = AcceptanceRecord.independent(800, 200)
    chosen = reading_steps(GoodputPolicy(DEFAULT_PAIR, 16, good), prompt_tokens=60, budget=1000, top_probability=0.95)
    generated = len(chosen)  # the request's tokens before its first draft: the prefill's and the plain steps'
    policy = GoodputPolicy(DEFAULT_PAIR, 16, good)
    chosen_again = reading_steps(policy, prompt_tokens=60, budget=1000, top_probability=0.95)
    assert chosen_again == chosen and chosen[:-1] == [0] * (generated - 1) and chosen[-1] > 0
    alpha = policy.acceptance_rate(policy.top_probability_sum, policy.rest_probability_sum)
    reading_ms = DEFAULT_PAIR.draft_read(60 + generated - 1)
    beta = policy.continuation_rate(alpha)
    assert DEFAULT_PAIR.saving_ms(alpha, chosen[-1], generated, beta) > reading_ms  # it has paid for itself by now
    assert DEFAULT_PAIR.saving_ms(alpha, chosen[-1], generated - 1, beta) <= DEFAULT_PAIR.draft_read(60 + generated - 2)
    assert 1 < generated < 128
    unsure = GoodputPolicy(DEFAULT_PAIR, 16, good)  # a translation's confidence: the reading never pays
    assert reading_steps(unsure, prompt_tokens=60, budget=128, top_probability=0.65) == [0] * 127
    no_length = GoodputPolicy(DEFAULT_PAIR, 16, good)  # without the answer's length, the budget is the horizon
    seen_plainly(no_length, 4, top_probability=0.95)
    assert no_length.choose(state(remaining_tokens=1000, backlog=64)) > 0
    assert StepState(100, generated_tokens=30).expected_remaining_tokens() == 30
    assert StepState(10, generated_tokens=30).expected_remaining_tokens() == 10
    assert StepState(None, generated_tokens=30).expected_remaining_tokens() == 30
    unbounded = GoodputPolicy(DEFAULT_PAIR, 16, good)  # no budget, a known length: ski rental, and what it saw counts
    looks = [state(None, backlog=60 + generated, generated_tokens=generated) for generated in range(1, 5)]
    assert choose_plainly_observed(unbounded, looks, top_probability=0.3) == [0] * 4
    assert unbounded.choose(state(None, backlog=260, generated_tokens=200)) == 0


def test_goodput_reads_at_once_where_answers_have_run_long_enough_to_repay_it() -> None:
    """With the drafter's earlier answers known, a short prompt is read at the first step if answers
    usually repay it, and a prompt is never read if they usually end before they could."""
    good = AcceptanceRecord.independent(800, 200)
    long_answers = AnswerLengthRecord([AnswerLength(128, cut_by_budget=True)] * 10)
    short_answers = AnswerLengthRecord([AnswerLength(12)] * 20)
    ski_rental = GoodputPolicy(DEFAULT_PAIR, 16, good)
    informed = GoodputPolicy(DEFAULT_PAIR, 16, good, answer_lengths=long_answers)
    assert informed.horizon(state(127, 61, generated_tokens=1)) == pytest.approx((2 * 1 + 10 * 127) / 12)
    chosen = reading_steps(informed, prompt_tokens=60, budget=128, top_probability=0.95)
    assert len(chosen) == 1 and chosen[0] > 0  # it drafts at the first step
    assert len(reading_steps(ski_rental, prompt_tokens=60, budget=128, top_probability=0.95)) > 1  # it waits
    wary = GoodputPolicy(DEFAULT_PAIR, 16, good, answer_lengths=short_answers)
    assert reading_steps(wary, prompt_tokens=60, budget=128, top_probability=0.95)[:11] == [0] * 11
    informed.observe_end(40, cut_by_budget=False)
    assert long_answers.answers[-1] == AnswerLength(40, cut_by_budget=False)


def test_a_hybrids_model_reads_only_once_plain_steps_repay_it_for_the_steps_copies_leave() -> None:
    """A drafter that offers copies may copy most of the answer (from a document it answers about): earlier answers'
    lengths do not make its model read at once, and steps with copies on offer shrink what the model's reading
    could still repay."""
    good = AcceptanceRecord.independent(800, 200)
    long_answers = AnswerLengthRecord([AnswerLength(128, cut_by_budget=True)] * 10)
    hybrid = GoodputPolicy(DEFAULT_PAIR, 16, good, answer_lengths=long_answers)
    model_only = GoodputPolicy(DEFAULT_PAIR, 16, good, answer_lengths=long_answers)
    assert len(reading_steps(model_only, prompt_tokens=60, budget=128, top_probability=0.95)) == 1  # reads at once
    chosen = reading_steps(hybrid, prompt_tokens=60, budget=128, top_probability=0.95, copies=0)
    assert 1 < len(chosen) < 128 and chosen[-1] > 0  # ski rental: it waits, then reads
    now = state(100, backlog=90, generated_tokens=28, copies=0)
    assert hybrid.model_horizon(now) == pytest.approx(28 * (1 - hybrid.free_offered.plus(0, hybrid.decay).mean()))
    copying = GoodputPolicy(DEFAULT_PAIR, 16, good, answer_lengths=long_answers)
    for generated in range(1, 40):  # copies on offer at every step: the model is left no steps to repay a reading
        step(copying, state(128 - generated, backlog=60 + generated, generated_tokens=generated, copies=8))
    assert copying.model_horizon(state(88, backlog=100, generated_tokens=40, copies=8)) < 1


def test_goodput_plans_with_what_the_engines_steps_took() -> None:
    """A profile that overstates the draft (or understates a plain step) must not stop drafting for good."""
    profiled = CostModel({1: 60.0, 2: 75.0, 4: 105.0}, draft_ms=35.0)
    good = AcceptanceRecord.independent(80, 20)
    assert GoodputPolicy(profiled, 4, good).choose() == 0  # on the profile alone a draft token costs too much
    shared = StepTimeRecord()
    measured = GoodputPolicy(profiled, 4, good, step_times=shared)
    for _ in range(8):
        measured.observe(StepOutcome(GoodputBid(0), step_ms=90.0))  # real plain steps take 90 ms
    assert shared.plain_step_ms == pytest.approx(90.0)
    assert measured.choose() > 0
    assert GoodputPolicy(profiled, 4, good, step_times=shared).choose() > 0  # the next request starts knowing it
    for _ in range(MIN_SAMPLES):
        two = measured.bid(state(backlog=2))
        measured.observe(StepOutcome(two, 2, 2, 2, 90.0 + 30.0 + 2 * 20.0))  # t(3) = t(1) + 30 ms, drafts of 20 ms
    assert shared.draft_token_ms == pytest.approx(20.0)
    reads_slowly = GoodputPolicy(READS_SLOWLY, 4, good, step_times=shared)
    for _ in range(MIN_SAMPLES):
        reading = reads_slowly.bid(state(backlog=101))  # 100 tokens to read first: profiled at 1000 ms
        reads_slowly.observe(StepOutcome(reading, 1, 1, 1, 90.0 + 10.0 + 20.0 + 1500.0))  # t(2), a draft, the reading
    assert shared.draft_token_ms == pytest.approx(20.0)  # a step that read a prompt first says nothing of a draft
    assert shared.reading_scale == pytest.approx(1.5)


def test_goodput_drafts_copies_with_their_own_acceptance_at_no_drafting_cost() -> None:
    policy = GoodputPolicy(EXPENSIVE_DRAFT, maximum=8)  # a drafted token costs 60% of a step: the model rarely pays
    copies, nothing_to_copy = state(copies=5), state(copies=0)
    for _ in range(20):  # copies are always right; the model's drafts never
        blocks(policy, 1, 0, nothing_to_copy)
    assert policy.choose(nothing_to_copy) == 0
    gamma = policy.choose(copies)
    assert 1 <= gamma <= 5  # no more than the copy offers
    for _ in range(10):
        assert policy.bid(copies).offer == copies.offers[0]
        step(policy, copies, accepted=5)
    assert policy.choose(copies) == 5
    assert policy.choose(nothing_to_copy) == 0  # the copies' success says nothing of the model's drafts
    assert policy.free["copy"].first.mean() > 0.9 and policy.acceptance_rate() < 0.2


def test_goodput_does_not_time_copies_as_drafted_tokens() -> None:
    step_times = StepTimeRecord()
    policy = GoodputPolicy(BENCH_DRAFT, maximum=4, step_times=step_times)
    copied = policy.bid(state(copies=3))
    assert copied.offer is not None and copied.offer.free
    policy.observe(StepOutcome(copied, 3, 3, 3, BENCH_DRAFT.target(4) + 0.5))
    assert step_times.draft_token_ms is None
    catching_up = policy.bid(state(backlog=9, copies=0))  # the draft model catches up on 8 copied tokens, drafts
    policy.observe(StepOutcome(catching_up, 2, 2, 2, BENCH_DRAFT.target(3) + 2 * 18.0 + 6.0))
    assert step_times.num_drafting_steps == 0 and step_times.num_readings == 0  # too short a reading to time


def test_goodput_probes_copies_that_stopped_paying() -> None:
    policy = GoodputPolicy(BENCH_DRAFT, maximum=8)
    copies = state(copies=4)
    for _ in range(30):  # every copy is rejected
        bid = policy.bid(copies)
        copying = bid.offer is not None and bid.offer.free
        policy.observe(StepOutcome(bid, int(copying), int(copying), 0))
    taken = []
    for _ in range(2 * 16 + 2):
        bid = policy.bid(copies)
        policy.observe(StepOutcome(bid))  # nothing judged
        taken.append(bid.offer is not None and bid.offer.free)
    assert 2 <= taken.count(True) <= 3  # one copy probe after 16 declined offers


def test_goodput_takes_the_models_drafts_when_they_promise_more_than_the_copies() -> None:
    good_model = AcceptanceRecord.independent(90, 10)
    policy = GoodputPolicy(BENCH_DRAFT, maximum=8, record=good_model)
    copies = policy.free["copy"] = FreeSource()
    for n in range(20):  # copies right a third of the time, one at a time
        copies.first.add(int(random.Random(n).random() < 0.33), policy.decay)
    bid = policy.bid(state(backlog=1, copies=4))
    assert bid.offer == Offer("model", backlog=1) and bid.num_draft_tokens > 0
    for _ in range(10):
        copies.first.add(1, policy.decay)
        copies.later.add(1, policy.decay)
    bid = policy.bid(state(backlog=1, copies=8))
    assert bid.offer == Offer("copy", 8, free=True) and bid.num_draft_tokens == 8  # copies that keep being right
    assert policy.bid(state(backlog=1, copies=0)).offer == Offer("model", backlog=1)  # nothing to copy: the model


KV_HEAVY = CostModel(
    {1: 25.0, 9: 50.0}, 7.0, context_tokens=64, target_context_ms={1: 0.004, 9: 0.04}, draft_context_ms=0.001
)  # every further row attends to the whole cache again: long contexts make drafts dear
LONG = 64 + 16384  # cached tokens: 16,384 past the measured context


def test_goodput_plans_with_the_costs_at_the_requests_context() -> None:
    policy = GoodputPolicy(KV_HEAVY, 8, AcceptanceRecord.independent(60, 40))
    assert policy.choose(state(context_tokens=64)) >= 1
    assert policy.choose(state(context_tokens=LONG)) == 0
    assert policy.costs(LONG).target(1) == pytest.approx(25.0 + 16384 * 0.004)


def test_goodput_records_step_times_less_what_the_context_added() -> None:
    """Requests of every length share one record of step times: a long request's slow steps are its context's."""
    shared, good = StepTimeRecord(), AcceptanceRecord.independent(60, 40)
    long = GoodputPolicy(KV_HEAVY, 8, good, step_times=shared)
    plain = long.bid(state(context_tokens=LONG))
    assert plain.num_draft_tokens == 0
    for _ in range(MIN_SAMPLES):
        long.observe(StepOutcome(plain, step_ms=30.0 + 16384 * 0.004))  # a plain step at 16k: 5 ms over the profile
    assert shared.plain_step_ms == pytest.approx(30.0)
    short = GoodputPolicy(KV_HEAVY, 8, good, step_times=shared)
    assert short.costs(64).target(1) == pytest.approx(30.0)
    drafting = long.bid(state(context_tokens=LONG))
    verify_ms = long.costs(LONG).target(3)
    for _ in range(MIN_SAMPLES):
        long.observe(StepOutcome(drafting, 2, 2, 2, verify_ms + 2 * (10.0 + 16.384)))  # drafts of 10 ms, 16k each
    assert shared.draft_token_ms == pytest.approx(10.0)
    assert long.costs(LONG).draft_ms == pytest.approx(10.0 + 16.384)
