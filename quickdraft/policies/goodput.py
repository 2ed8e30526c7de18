"""``goodput``: the γ with the most expected tokens per millisecond under measured costs (SmartSpec-style)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from quickdraft.costs import CostModel, expected_tokens
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import top_probability
from quickdraft.policies.base import (
    POLICIES,
    UNKNOWN_STATE,
    DraftBid,
    DraftStep,
    Offer,
    Policy,
    PolicyContext,
    PolicyKind,
    StepOutcome,
    StepState,
    no_argument,
)
from quickdraft.policies.planner import best_gamma
from quickdraft.policies.records import (
    AcceptanceRecord,
    AnswerLengthRecord,
    BetaCounts,
    StepTimeRecord,
    draft_outcomes,
)

MEASURED_BACKLOG = 2  # a drafter catching up on at most this many tokens: a draft model after a fully accepted block
# A shorter reading is not timed: its cost is a few ms within the target's noise, against a prefill curve measured
# at 128 and 512 tokens (a hybrid's draft model catching up on the tokens it copied, a probe after plain steps).
MIN_TIMED_READING = 64
CONTEXT_GRAIN = 64  # cached tokens: the costs a request plans with are made again when its context grows by this


@dataclass
class GoodputPolicy(Policy):
    """γ maximising expected tokens per millisecond for the request's estimated acceptance, on the drafter's offer
    that promises the most. The rules (``docs/policies.md`` gives the reasons and the measurements):

    1. Acceptance is α, that a block's first draft is accepted, and β, that a later one is when every draft
       before it was (:func:`expected_tokens`). α is the mean of a Beta posterior over first drafts, its evidence
       decaying by ``decay`` per block; β counts later drafts alike (the first rejected one is its failure),
       shrunk toward α with the weight of ``continuation_shrink`` observations, its evidence decaying per draft
       judged, so without evidence of its own β is α. The priors are the drafter's record across requests with
       the weight of ``prior_strength`` observations (α: Beta(1, 1) without one), and decay with the rest.
    2. Each free offer (copies) has its own α and β from Beta(1, 1) in every request, and is planned with no
       drafting cost; it is taken when it promises more tokens per millisecond than the drafter's measured drafts,
       and once after ``probe_after`` declines in a row.
    3. After ``probe_after`` plain steps in a row it drafts one token (a probe of α, paying at most the reading
       those steps cost); after ``probe_after`` blocks of one, up to two (a probe of β). A step the request had
       alone that drafted after reading a backlog (a probe, the prompt) times the reading, not a drafted token, so
       the next plain bid with the drafter caught up (at most ``MEASURED_BACKLOG``) drafts one token instead: the
       drafted token's cost is measured while drafting does not look worth it, and not only assumed (rule 6).
       Copies, when they promise more, come first.
    4. A drafter's backlog (a draft model reading the prompt lazily) is paid for only when drafting over the
       tokens the answer is expected still to run saves more (:meth:`horizon`: ski rental, as many as it has
       run, blended with the drafter's earlier answers that ran longer; for a drafter with a free offer, ski
       rental alone less the share of steps the free offer served, :meth:`model_horizon`). Until its first drafts
       are judged, the target's top probability on each plain token counts as that fraction of an accepted draft.
    5. The bid's judge (:class:`BlockJudge`) stops drafting once the next token is expected to add fewer tokens
       per millisecond than the plan's γ promised; a plan (not a probe) of a judged offer may run on to ``maximum``
       while the judge says so, when the request has the step alone (:attr:`DraftBid.reach`).
    6. Costs are the calibration's (or the offer's own drafted-token cost), corrected by what the engine's steps
       this drafter had alone took (:class:`StepTimeRecord`: plain steps give t(1); steps with at most
       ``MEASURED_BACKLOG`` tokens to catch up give a drafted token's cost, kept as a share of the plain step, each
       a median of recent steps; a longer reading is timed against
       the prefill curve), at the request's context to within ``CONTEXT_GRAIN`` tokens; step times are recorded
       less what the context added, so requests of every length share one record.
    """

    cost_model: CostModel
    maximum: int
    record: AcceptanceRecord | None = None
    decay: float = 0.92
    prior_strength: float = 8.0
    probe_after: int = 16
    continuation_shrink: float = 2.0
    step_times: StepTimeRecord | None = None  # shared by the engine's requests; None: this request's own
    answer_lengths: AnswerLengthRecord | None = None  # shared by the engine's requests; None: ski rental only
    # What it learns (only observe and observe_confidence change these):
    first: BetaCounts = field(default_factory=lambda: BetaCounts(1.0, 1.0), init=False)  # α's decayed evidence
    later: BetaCounts = field(default_factory=BetaCounts, init=False)  # β's, the record's prior included
    drafted: bool = field(default=False, init=False)  # has this request had a step with drafts?
    top_probability_sum: float = field(default=0.0, init=False)  # decayed sums of their top probabilities
    rest_probability_sum: float = field(default=0.0, init=False)  # and of 1 - those
    plain_steps: int = field(default=0, init=False)  # bids of γ 0 in a row
    single_steps: int = field(default=0, init=False)  # bids of one draft in a row that drafted at most one
    timing_due: bool = field(default=False, init=False)  # the last drafting step read a backlog: time the next
    free: dict[str, FreeSource] = field(default_factory=dict, init=False)  # estimates of each free offer's drafts
    free_offered: BetaCounts = field(default_factory=BetaCounts, init=False)  # steps with free drafts on offer
    # A memo, not knowledge: the corrected costs at the step times and context they were made for (see costs()).
    corrected: tuple[tuple[float | None, float | None, int, float | None], CostModel, CostModel] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        if self.step_times is None:
            self.step_times = StepTimeRecord()
        record = self.record
        if record is not None and record.first.total > 0:  # a snapshot: this request's own outcomes only count once
            self.first = BetaCounts.prior(record.first.mean(), self.prior_strength)
        if record is not None and record.later.total > 0:
            mean = record.later.mean()
            self.later = BetaCounts(self.prior_strength * mean, self.prior_strength * (1.0 - mean))

    def acceptance_rate(self, partially_accepted: float = 0.0, partially_rejected: float = 0.0) -> float:
        """α, that a block's first draft is accepted: the posterior mean, with optional extra pseudo-counts
        (the target's confidence before a first draft)."""
        return self.first.mean(partially_accepted, partially_rejected)

    def continuation_rate(self, acceptance_rate: float | None = None) -> float:
        """β, that a later draft is accepted when the drafts before it in its block were: the later drafts'
        evidence shrunk toward α (``acceptance_rate``; None: :meth:`acceptance_rate`)."""
        alpha = self.acceptance_rate() if acceptance_rate is None else acceptance_rate
        return self.later.mean(self.continuation_shrink * alpha, self.continuation_shrink * (1.0 - alpha))

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.bid(state).num_draft_tokens

    def bid(self, state: StepState = UNKNOWN_STATE) -> GoodputBid:
        """γ as the most this request plans to draft, planned alone (:func:`best_gamma`), with the estimates it was
        chosen by, so that :func:`plan_step` may trim it to what pays in the whole batch (:meth:`choose`: the γ alone),
        and the reach a judged block may run to when the request is alone: on a free offer (copies) or the drafter's
        measured drafts, whichever promise more tokens per millisecond."""
        priced = next((offer for offer in state.offers if not offer.free), None)
        backlog, token_ms = (0, None) if priced is None else (priced.backlog, priced.token_ms)
        model = reading_ms, acceptance_rate, continuation_rate, costs = self._model_estimates(state, backlog, token_ms)
        gamma = planned = 0 if priced is None else best_gamma(costs, acceptance_rate, self.maximum, continuation_rate)
        for offer in state.offers:
            if offer.free and offer.available and (free_bid := self._free_bid(state, offer, model, gamma)) is not None:
                return free_bid
        if gamma > 0 and reading_ms > 0 and (horizon := self.model_horizon(state)) is not None:
            # is drafting worth the drafter's backlog over the tokens its drafts are expected still to serve?
            if costs.saving_ms(acceptance_rate, gamma, horizon, continuation_rate) <= reading_ms:
                gamma = 0
        elif gamma == 0 and self.timing_due and priced is not None and backlog <= MEASURED_BACKLOG:
            gamma = 1  # the drafting step before read a backlog: this one is timed
        elif gamma == 0 and self.plain_steps >= self.probe_after and priced is not None:
            # a probe may cost as much reading as the plain steps before it took
            gamma = 1 if reading_ms <= self.probe_after * costs.step_ms(0) else 0
        elif gamma == 1 and self.single_steps >= self.probe_after:
            gamma = min(2, self.maximum)  # a probe of β
        judge = BlockJudge(costs, continuation_rate, costs.goodput(acceptance_rate, planned, continuation_rate))
        # a plan (not a probe) of judged drafts may run on while the judge finds them paying, when the request is alone
        reach = self.maximum if gamma == planned > 0 and priced is not None and priced.judged else None
        context_ms = self._context_costs(state.context_tokens, drafts_with_model=True)
        return GoodputBid(
            gamma, acceptance_rate, continuation_rate, reading_ms, priced if gamma > 0 else None, *context_ms,
            keep_drafting=judge, reach=reach, state=state, costs=costs,
        )  # fmt: skip

    def _model_estimates(
        self, state: StepState, backlog: int, token_ms: float | None
    ) -> tuple[float, float, float, CostModel]:
        """(reading ms, α, β, corrected costs) of the drafter's measured drafts (``token_ms``: what its offer says a
        drafted token costs; None: the calibration's)."""
        assert self.step_times is not None
        # the catch-up beyond the one token every step's draft cost already includes (the profiled prefill curve,
        # scaled by what earlier readings took against it)
        reading_ms = self.step_times.reading_scale * self.cost_model.draft_read(backlog - 1)
        acceptance_rate = self.acceptance_rate()
        if not self.drafted and reading_ms > 0:  # what the target's confidence so far says, before the reading
            acceptance_rate = self.acceptance_rate(self.top_probability_sum, self.rest_probability_sum)
        costs = self._corrected_costs(state.context_tokens, token_ms)[0]
        return reading_ms, acceptance_rate, self.continuation_rate(acceptance_rate), costs

    def _free_bid(
        self, state: StepState, offer: Offer, model: tuple[float, float, float, CostModel], model_gamma: int
    ) -> GoodputBid | None:
        """The bid for a free offer (copies: no drafting cost, their own α and β), or None when the measured drafts
        (``model_gamma`` of them, by ``model``'s estimates) promise more tokens per millisecond, their reading
        included. An offer declined ``probe_after`` times in a row is taken once, so that its estimates can
        recover."""
        reading_ms, model_alpha, model_beta, costs = model
        source = self.free.get(offer.source, FreeSource())
        alpha = source.first.mean()
        beta = source.later.mean(self.continuation_shrink * alpha, self.continuation_shrink * (1.0 - alpha))
        free_costs = self._corrected_costs(state.context_tokens, None)[1]
        gamma = best_gamma(free_costs, alpha, self.maximum, beta)
        if offer.max_tokens is not None:
            gamma = min(gamma, offer.max_tokens)
        model_ms = costs.step_ms(model_gamma) + (reading_ms if model_gamma > 0 else 0.0)
        model_goodput = expected_tokens(model_alpha, model_gamma, model_beta) / model_ms
        if source.declined >= self.probe_after:
            gamma = max(gamma, 1)
        elif gamma == 0 or free_costs.goodput(alpha, gamma, beta) < model_goodput:
            return None
        context_ms = self._context_costs(state.context_tokens, drafts_with_model=False)
        return GoodputBid(gamma, alpha, beta, 0.0, offer, *context_ms, state=state, costs=free_costs)

    def _context_costs(self, context: int, drafts_with_model: bool) -> tuple[float, float]:
        """What this request's context adds to a shared step (:class:`DraftBid`'s ``context_ms`` and
        ``context_ms_per_draft``), by the cost model's context costs."""
        model = self.cost_model
        one_token_ms = model.context_ms(1, context)
        per_draft_ms = max(0.0, model.context_ms(2, context) - one_token_ms)
        return one_token_ms, per_draft_ms + (model.draft_context_extra_ms(context) if drafts_with_model else 0.0)

    def horizon(self, state: StepState) -> float | None:
        """How many more tokens the answer is expected to run: the ski-rental guess, blended with the
        drafter's earlier answers that ran longer than this one so far (None: unbounded, unknown)."""
        ski_rental = state.expected_remaining_tokens()
        if ski_rental is None or self.answer_lengths is None or state.generated_tokens is None:
            return ski_rental
        return self.answer_lengths.expected_remaining(state.generated_tokens, state.remaining_tokens, ski_rental)

    def model_horizon(self, state: StepState) -> float | None:
        """The tokens a drafter's measured drafts are expected still to serve. For a drafter that offers free
        drafts (a hybrid's copies) the ski-rental guess alone, not earlier answers' lengths, less the share of
        steps where free drafts were on offer (decayed per step, this one included), which they serve for free:
        an answer from a long document starts copying a few tokens in."""
        if not any(offer.free for offer in state.offers):
            return self.horizon(state)
        ski_rental = state.expected_remaining_tokens()
        share = self.free_offered.plus(int(offers_free_drafts(state)), self.decay).mean()
        return None if ski_rental is None else ski_rental * (1.0 - share)

    def costs(self, context_tokens: int = 0, token_ms: float | None = None) -> CostModel:
        """The profiled cost model (a drafted token at ``token_ms`` where the drafter's offer says so), corrected by
        the step times measured so far, at ``context_tokens``."""
        return self._corrected_costs(context_tokens, token_ms)[0]

    def _corrected_costs(self, context_tokens: int, token_ms: float | None) -> tuple[CostModel, CostModel]:
        """:meth:`costs`, and the same for drafts that cost no drafting (free offers); made again only when a step
        time measured since, the context or the offer's token cost changes them (under batching step times rarely
        do, and every request bids at every step)."""
        assert self.step_times is not None
        context = context_tokens // CONTEXT_GRAIN * CONTEXT_GRAIN
        draft_ms = self.step_times.draft_token_cost(self._share_base_ms())
        measured = (self.step_times.plain_step_ms, draft_ms, context, token_ms)
        if self.corrected is None or self.corrected[0] != measured:
            profiled = self.cost_model if token_ms is None else replace(self.cost_model, draft_ms=token_ms)
            costs = profiled.with_measurements(*measured[:2]).at_context(context)
            self.corrected = (measured, costs, replace(costs, draft_ms=0.0))
        return self.corrected[1], self.corrected[2]

    def _share_base_ms(self) -> float:
        """The plain step a drafted token's cost is a share of: the measured one, else the profile's t(1)."""
        assert self.step_times is not None
        return self.step_times.plain_step_ms or self.cost_model.target(1)

    def wants_confidence(self) -> bool:
        return not self.drafted  # the target's confidence stands in for α until the first drafts are judged

    def observe_confidence(self, probability: float) -> None:
        self.top_probability_sum = self.decay * self.top_probability_sum + probability
        self.rest_probability_sum = self.decay * self.rest_probability_sum + 1.0 - probability

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a step of this policy's bid: the probe counters (and whether the next step must be timed),
        the acceptance of the offer it drafted from, and, when the request had the step alone, what the step
        took."""
        bid = outcome.bid
        assert isinstance(bid, GoodputBid), "a goodput policy observes the steps of its own bids"
        state, offer = bid.state, bid.offer
        self.free_offered.add(int(offers_free_drafts(state)), self.decay)
        if offer is not None and offer.free:
            self.free.setdefault(offer.source, FreeSource()).declined = 0
        else:
            for free in (offer for offer in state.offers if offer.free and offer.available):
                self.free.setdefault(free.source, FreeSource()).declined += 1
            self.plain_steps = self.plain_steps + 1 if bid.num_draft_tokens == 0 else 0
            blocks_of_one = bid.num_draft_tokens == 1 and outcome.num_drafted <= 1  # not one that ran on
            self.single_steps = self.single_steps + 1 if blocks_of_one else 0
            if outcome.num_drafted > 0 and offer is not None and outcome.step_ms is not None:
                self.timing_due = offer.backlog > MEASURED_BACKLOG  # (a shared step is never timed)
        if outcome.num_judged > 0:
            if offer is not None and offer.free:  # free drafts have their own estimates; the record is of the rest
                source = self.free[offer.source]
                learn(source.first, source.later, outcome.num_judged, outcome.num_accepted, self.decay)
            else:
                self.drafted = True
                learn(self.first, self.later, outcome.num_judged, outcome.num_accepted, self.decay)
                if self.record is not None:
                    self.record.add(outcome.num_judged, outcome.num_accepted)
        if outcome.step_ms is not None:
            self._observe_step_time(bid, outcome.num_drafted, outcome.step_ms)

    def _observe_step_time(self, bid: GoodputBid, proposed: int, elapsed_ms: float) -> None:
        """A step this request had alone took ``elapsed_ms``: a plain step's time, a drafted token's, or a reading's,
        recorded less what the request's context added."""
        assert self.step_times is not None
        if bid.offer is not None and bid.offer.free and proposed > 0:  # free drafts cost no drafting to measure
            return
        model, context = self.cost_model, bid.state.context_tokens
        if proposed == 0:
            self.step_times.add_plain_step(max(0.0, elapsed_ms - model.context_ms(1, context)))
            return
        backlog, token_ms = (0, None) if bid.offer is None else (bid.offer.backlog, bid.offer.token_ms)
        costs = self.costs(context, token_ms)
        drafting_ms = max(0.0, elapsed_ms - costs.target(proposed + 1))  # the drafter's share of the step
        if backlog <= MEASURED_BACKLOG:
            per_draft_ms = drafting_ms / proposed - model.draft_context_extra_ms(context)
            self.step_times.add_draft_token_cost(max(0.0, per_draft_ms), self._share_base_ms())
        elif backlog - 1 >= MIN_TIMED_READING and (profiled_ms := self.cost_model.draft_read(backlog - 1)) > 0:
            self.step_times.add_reading(max(0.0, drafting_ms - proposed * costs.draft_ms), profiled_ms)

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:
        if self.answer_lengths is not None:
            self.answer_lengths.add(num_tokens, cut_by_budget)


@dataclass
class FreeSource:
    """What a request learned of one free offer's drafts: α's and β's decayed evidence, and how many steps in a
    row it was on offer and declined."""

    first: BetaCounts = field(default_factory=lambda: BetaCounts(1.0, 1.0))
    later: BetaCounts = field(default_factory=BetaCounts)
    declined: int = 0


@dataclass(frozen=True)
class GoodputBid(DraftBid):
    """A goodput bid and what it was chosen by, for the policy to learn from its step."""

    state: StepState = UNKNOWN_STATE
    costs: CostModel | None = None  # the corrected costs at the request's context


class BlockJudge:
    """One block's judge (:meth:`GoodputPolicy.bid`'s ``keep_drafting``): draft one more token only if it is
    expected to add tokens at least at the rate the step was planned at (``planned_goodput``, tokens per ms). It
    adds a token if it and every draft before it are accepted (the draft's top probabilities so far, times β for
    the next one), and it costs a drafted token plus what one more token adds to the verify forward. Stopping a
    block where its next token falls below the plan's rate maximises tokens per ms (a ratio: Dinkelbach), where
    the plain rate 1 / t(1) would draft on while a token adds less than the step already averages. It keeps the
    block's survival, never the policy's state."""

    def __init__(self, costs: CostModel, continuation_rate: float, planned_goodput: float) -> None:
        self.costs, self.continuation_rate, self.planned_goodput = costs, continuation_rate, planned_goodput
        self.block_survival = 1.0  # P(every draft of this block so far is accepted)

    def __call__(self, step: DraftStep) -> bool:
        confidence = top_probability(step.logits).min()  # the least sure row
        self.block_survival *= float(confidence)
        costs, k = self.costs, step.num_drafted
        next_token_ms = costs.draft_ms + costs.target(k + 2) - costs.target(k + 1)
        return self.block_survival * self.continuation_rate > self.planned_goodput * next_token_ms


def offers_free_drafts(state: StepState) -> bool:
    """Some free offer has drafts this step."""
    return any(offer.free and offer.available for offer in state.offers)


def learn(first: BetaCounts, later: BetaCounts, proposed: int, accepted: int, decay: float) -> None:
    """Add a verified block to α's (``first``) and β's (``later``) decayed evidence: a block's first draft
    discounts both, each later draft discounts β's."""
    first_outcomes, later_outcomes = draft_outcomes(proposed, accepted)
    for outcome in first_outcomes:
        first.add(outcome, decay)
        later.discount(decay)
    for outcome in later_outcomes:
        later.add(outcome, decay)


def _goodput(_: None, context: PolicyContext) -> Policy:
    if context.cost_model is None:
        raise ConfigError("the goodput policy needs a cost model (a saved `quickdraft profile` or a calibration)")
    return GoodputPolicy(
        context.cost_model,
        context.max_draft_tokens,
        context.acceptance,
        step_times=context.step_times,
        answer_lengths=context.answer_lengths,
    )


POLICIES.register("goodput")(PolicyKind(_goodput, no_argument("goodput"), needs_cost_model=True, learns_answers=True))
