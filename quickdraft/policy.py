"""How many tokens to draft: a policy chooses γ before every step (0 = a plain step).

A policy lives for one request. Before each step the engine asks :meth:`Policy.choose` for γ
(telling it, in a :class:`StepState`, how many tokens the request may still produce and how many
the drafter must read before it can draft);
while the drafter drafts, :meth:`Policy.keep_drafting` may stop it early (confidence-based
policies); after verification :meth:`Policy.observe` learns how many drafts were accepted.
Policies never affect which tokens are produced, only how fast: every γ is lossless.

Registry names (``NAME`` or ``NAME:ARG``):
- ``fixed:K`` — always K (``fixed`` alone uses the request's ``num_draft_tokens``);
- ``heuristic`` — transformers' rule: start at ``num_draft_tokens``, +2 after a fully accepted
  block, −1 otherwise (at least 1);
- ``confidence:T`` — draft up to the maximum, stopping when the draft's top probability < T;
- ``goodput`` — γ = argmax over 0..γmax of expected tokens per millisecond under the measured
  cost model and an online estimate of the acceptance rate α (SmartSpec-style);
- ``specdec++:T`` — draft up to the maximum, stopping when a trained acceptance head puts
  P(at least one rejection in the block) above T (SpecDec++).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch

from quickdraft.acceptance_head import AcceptanceHead
from quickdraft.errors import ConfigError
from quickdraft.registry import Registry


def interpolate(curve: Mapping[int, float], num_tokens: int) -> float:
    """A measured cost at ``num_tokens``, else linear between the nearest measured points
    (the first segment's slope below them, the last one's past them; one point: proportional)."""
    if num_tokens in curve:
        return float(curve[num_tokens])
    ks = sorted(curve)
    if len(ks) == 1:
        return float(curve[ks[0]]) * num_tokens / ks[0]
    below = max((k for k in ks[:-1] if k < num_tokens), default=ks[0])
    above = ks[ks.index(below) + 1]
    slope = (curve[above] - curve[below]) / (above - below)
    return float(curve[below] + slope * (num_tokens - below))


def monotone_fit(curve: Mapping[int, float]) -> dict[int, float]:
    """The closest non-decreasing curve (least squares; pool-adjacent-violators): a forward over
    more tokens does the same work and more, so a measured dip (t(5) < t(4)) is noise, and a
    policy trading on it would favour the dip's γ for no reason. Runs that fall are replaced by
    their mean; every other point is kept as measured."""
    pools: list[tuple[float, int]] = []  # (mean, points pooled), in order of k
    for k in sorted(curve):
        mean, count = float(curve[k]), 1
        while pools and pools[-1][0] > mean:
            pooled_mean, pooled_count = pools.pop()
            mean, count = (pooled_mean * pooled_count + mean * count) / (pooled_count + count), pooled_count + count
        pools.append((mean, count))
    values = [mean for mean, count in pools for _ in range(count)]
    return dict(zip(sorted(curve), values, strict=True))


@dataclass(frozen=True)
class CostModel:
    """Measured costs in milliseconds: a target forward over k new tokens, one drafted token, and
    the drafter reading n tokens before it can draft (a draft model's prefill; empty: free).

    The target curve is used through its :func:`monotone_fit`, so noise in the measurement cannot make
    a longer block look cheaper than a shorter one. A profile times bare forwards at one context
    length, and the machine's speed drifts; :meth:`with_measurements` corrects the model with what
    the engine's own steps took (:class:`StepTimeRecord`).
    """

    target_ms: Mapping[int, float]  # as measured
    draft_ms: float = 0.0
    draft_prefill_ms: Mapping[int, float] = field(default_factory=dict)  # n tokens read -> ms
    fitted_target_ms: Mapping[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if 1 not in self.target_ms or any(k < 1 or ms <= 0 for k, ms in self.target_ms.items()):
            raise ConfigError("a cost model needs positive target times including k = 1")
        if self.draft_ms < 0:
            raise ConfigError(f"the draft cost must be >= 0 ms, got {self.draft_ms}")
        if any(n < 1 or ms < 0 for n, ms in self.draft_prefill_ms.items()):
            raise ConfigError("a draft prefill curve needs n >= 1 tokens and times >= 0 ms")
        object.__setattr__(self, "fitted_target_ms", monotone_fit(self.target_ms))

    def to_dict(self) -> dict[str, Any]:
        """The measured costs as JSON-ready data (curve keys become strings)."""
        return {
            "target_ms": {str(k): ms for k, ms in sorted(self.target_ms.items())},
            "draft_ms": self.draft_ms,
            "draft_prefill_ms": {str(n): ms for n, ms in sorted(self.draft_prefill_ms.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """The inverse of :meth:`to_dict`; malformed data raises ``ConfigError``."""
        try:
            return cls(
                {int(k): float(ms) for k, ms in data["target_ms"].items()},
                float(data["draft_ms"]),
                {int(n): float(ms) for n, ms in data["draft_prefill_ms"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a saved cost model: {error!r}") from None

    def target(self, num_tokens: int) -> float:
        """t_target(k) on the fitted curve, interpolated between the measured k; past the last one it
        rises at the fitted curve's mean slope (a pooled end is flat, and more tokens are not free)."""
        fitted = self.fitted_target_ms
        first, last = min(fitted), max(fitted)
        if num_tokens <= last or first == last:
            return interpolate(fitted, num_tokens)
        mean_slope = (fitted[last] - fitted[first]) / (last - first)
        return float(fitted[last] + mean_slope * (num_tokens - last))

    def draft_read(self, num_tokens: int) -> float:
        """What reading ``num_tokens`` costs the drafter before it drafts (0 without a prefill curve)."""
        if num_tokens <= 0 or not self.draft_prefill_ms:
            return 0.0
        return interpolate({0: 0.0, **self.draft_prefill_ms}, num_tokens)

    def with_measurements(self, plain_step_ms: float | None, draft_token_ms: float | None) -> CostModel:
        """This model corrected by what real steps took (None: not measured yet).

        ``plain_step_ms`` shifts the whole target curve so that t(1) is a measured plain step: a step
        spends the same time beyond its forward (committing and detokenizing, verifying, attending to
        the request's own context) whatever its size, while the profile's curve keeps saying what each
        further token adds. ``draft_token_ms`` replaces the draft's per-token cost.
        """
        if plain_step_ms is None and draft_token_ms is None:
            return self
        shift = 0.0 if plain_step_ms is None else plain_step_ms - self.target(1)
        return replace(
            self,
            target_ms={k: ms + shift for k, ms in self.fitted_target_ms.items()},
            draft_ms=self.draft_ms if draft_token_ms is None else draft_token_ms,
        )

    def step_ms(self, num_draft_tokens: int) -> float:
        """Time of one step: γ drafted tokens plus a target forward over γ + 1 tokens."""
        return num_draft_tokens * self.draft_ms + self.target(num_draft_tokens + 1)

    def goodput(self, acceptance_rate: float, num_draft_tokens: int, continuation_rate: float | None = None) -> float:
        """Expected committed tokens per millisecond (Leviathan et al. with this cost curve;
        ``continuation_rate``: see :func:`expected_tokens`)."""
        return expected_tokens(acceptance_rate, num_draft_tokens, continuation_rate) / self.step_ms(num_draft_tokens)

    def best_num_draft_tokens(
        self, acceptance_rate: float, max_draft_tokens: int, continuation_rate: float | None = None
    ) -> int:
        """argmax over γ in 0..max of the goodput; ties go to the smaller γ."""
        goodputs = [self.goodput(acceptance_rate, gamma, continuation_rate) for gamma in range(max_draft_tokens + 1)]
        return max(range(len(goodputs)), key=lambda gamma: (goodputs[gamma], -gamma))

    def saving_ms(
        self, acceptance_rate: float, num_draft_tokens: int, num_tokens: float, continuation_rate: float | None = None
    ) -> float:
        """Expected time saved over ``num_tokens`` new tokens by drafting γ per step instead of plain steps."""
        tokens_per_step = expected_tokens(acceptance_rate, num_draft_tokens, continuation_rate)
        return num_tokens * (self.step_ms(0) - self.step_ms(num_draft_tokens) / tokens_per_step)


def expected_tokens(acceptance_rate: float, num_draft_tokens: int, continuation_rate: float | None = None) -> float:
    """E[tokens per step] when a block's first draft is accepted with probability α and each later draft,
    given that every draft before it was, with probability β (``continuation_rate``):
    1 + α · (1 − β^γ) / (1 − β). With β = α (None: Leviathan et al.'s independent drafts) this is
    (1 − α^(γ+1)) / (1 − α)."""
    alpha, beta, gamma = acceptance_rate, continuation_rate, num_draft_tokens
    if beta is None:
        beta = alpha
    later_drafts = float(gamma) if beta >= 1.0 else (1.0 - beta**gamma) / (1.0 - beta)
    return 1.0 if gamma == 0 else 1.0 + alpha * later_drafts


def draft_outcomes(proposed: int, accepted: int) -> tuple[list[int], list[int]]:
    """A verified block's draft outcomes (1 accepted, 0 rejected): its first draft's, and those of the
    later drafts the target judged after an accepted one (drafts past the first rejection tell nothing)."""
    if proposed == 0:
        return [], []
    later = [1] * max(0, accepted - 1) + ([0] if 0 < accepted < proposed else [])
    return [1 if accepted > 0 else 0], later


@dataclass(frozen=True)
class DraftStep:
    """What a drafter knows right after drafting a token: what a policy may stop drafting on."""

    logits: torch.Tensor  # [B, V] the draft distribution's logits (temperature 1)
    hidden: torch.Tensor | None  # [B, H] the draft model's last hidden state, if the runtime gives it
    num_drafted: int  # tokens drafted so far in this step, this one included


@dataclass(frozen=True)
class StepState:
    """What the engine tells a policy before a step, besides the policy's own history."""

    remaining_tokens: int | None = None  # new tokens the request may still produce (a bound); None: unbounded
    drafter_backlog: int = 0  # committed tokens the drafter must read before its next draft
    generated_tokens: int | None = None  # new tokens the request has produced so far; None: not known

    def __post_init__(self) -> None:
        counts = [self.remaining_tokens, self.drafter_backlog, self.generated_tokens]
        if any(count is not None and count < 0 for count in counts):
            raise ValueError(f"a step state needs counts >= 0, got {self}")

    def expected_remaining_tokens(self) -> int | None:
        """How many more tokens the answer is expected to run: as many as it has run so far, within the budget.

        Answer lengths are scale-free (one short, the next hundreds of tokens), and an answer that has
        run m tokens is guessed to run about m more. Trading on this guess is the ski-rental rule: pay
        for a drafter's reading once the plain steps have forgone as much as the reading costs.
        """
        if self.generated_tokens is None:
            return self.remaining_tokens
        if self.remaining_tokens is None:
            return self.generated_tokens
        return min(self.remaining_tokens, self.generated_tokens)


UNKNOWN_STATE = StepState()


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may use: the request's γ settings, the cost model, the drafter's shared acceptance record."""

    num_draft_tokens: int = 4
    max_draft_tokens: int = 16
    cost_model: CostModel | None = None
    acceptance: AcceptanceRecord | None = None
    acceptance_head: AcceptanceHead | None = None  # for specdec++
    step_times: StepTimeRecord | None = None  # the engine's measured step overhead, for goodput
    answer_lengths: AnswerLengthRecord | None = None  # how long the drafter's earlier answers ran, for goodput


@dataclass
class BetaCounts:
    """Successes and failures of a Bernoulli outcome: the pseudo-counts of a Beta posterior."""

    accepted: float = 0.0
    rejected: float = 0.0

    @property
    def total(self) -> float:
        return self.accepted + self.rejected

    def mean(self, extra_accepted: float = 0.0, extra_rejected: float = 0.0) -> float:
        """The posterior mean, with optional extra pseudo-counts."""
        accepted = self.accepted + extra_accepted
        return accepted / (accepted + self.rejected + extra_rejected)

    def add(self, outcome: int, decay: float = 1.0) -> None:
        """One outcome (1 accepted, 0 rejected); older evidence is first discounted by ``decay``."""
        self.discount(decay)
        self.accepted += outcome
        self.rejected += 1 - outcome

    def discount(self, factor: float) -> None:
        self.accepted *= factor
        self.rejected *= factor

    @classmethod
    def prior(cls, mean: float, strength: float) -> BetaCounts:
        """Beta(0.5 + strength · mean, 0.5 + strength · (1 − mean)): a mean worth ``strength`` observations."""
        return cls(0.5 + strength * mean, 0.5 + strength * (1.0 - mean))


@dataclass
class AcceptanceRecord:
    """Acceptance seen by one drafter across requests, the prior of each new request's estimates: of a
    block's first draft, and of a later draft whose block was accepted up to it.

    The two differ: a draft that got one token right usually gets the next ones right too (a prompt-lookup
    match that copies, a draft model past a hard token). On Spec-Bench qa, fixed γ = 3 accepted a
    draft model's first draft in 73 % of steps and each later one, after an accepted one, in 84–94 %.
    """

    first: BetaCounts = field(default_factory=BetaCounts)
    later: BetaCounts = field(default_factory=BetaCounts)

    @classmethod
    def independent(cls, accepted: float, rejected: float) -> AcceptanceRecord:
        """A record whose first and later drafts were accepted alike."""
        return cls(BetaCounts(accepted, rejected), BetaCounts(accepted, rejected))

    def add(self, proposed: int, accepted: int) -> None:
        """A verified block: ``proposed`` drafts, the first ``accepted`` of them accepted."""
        first, later = draft_outcomes(proposed, accepted)
        for outcome in first:
            self.first.add(outcome)
        for outcome in later:
            self.later.add(outcome)

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "first": [self.first.accepted, self.first.rejected],
            "later": [self.later.accepted, self.later.rejected],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceRecord:
        """The inverse of :meth:`to_dict`; counts that are not finite and >= 0 raise ``ValueError``."""
        pairs = [[float(count) for count in data[key]] for key in ("first", "later")]
        if any(len(pair) != 2 or not all(math.isfinite(count) and count >= 0 for count in pair) for pair in pairs):
            raise ValueError(f"acceptance counts must be pairs of finite numbers >= 0, got {pairs}")
        return cls(BetaCounts(*pairs[0]), BetaCounts(*pairs[1]))


class AnswerLength(NamedTuple):
    num_tokens: int
    cut_by_budget: bool = False  # it stopped at its max_new_tokens, so it would have run at least that long


@dataclass
class AnswerLengthRecord:
    """How many new tokens one drafter's earlier answers ran: what an answer that has run m tokens is
    expected still to run.

    An answer cut by its token budget ran at least that long; past m it counts as running on to the
    current request's budget (where the budgets are equal, as in the bench, exactly what it did; under a
    larger budget, a guess that what was cut goes on). Before any answer is recorded the guess is the
    ski-rental one (as many more as it has run, :meth:`StepState.expected_remaining_tokens`), and it
    keeps the weight of ``prior_weight`` answers: the record takes over as answers accumulate.
    """

    answers: deque[AnswerLength] = field(default_factory=deque)
    prior_weight: float = 2.0
    capacity: int = 256  # the most recent answers: what is served now, and a bounded cost per step

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"an answer length record needs room for at least one answer, got {self.capacity}")
        self.answers = deque(self.answers, maxlen=self.capacity)

    def add(self, num_tokens: int, cut_by_budget: bool = False) -> None:
        self.answers.append(AnswerLength(num_tokens, cut_by_budget))

    def expected_remaining(self, generated: int, remaining: int | None, ski_rental: float) -> float:
        """E[min(L − m, remaining)] over the recorded answers that ran longer than m = ``generated``,
        blended with the ski-rental guess."""
        cap = float("inf") if remaining is None else remaining

        def still_to_run(answer: AnswerLength) -> float:
            if answer.cut_by_budget and remaining is not None:
                return remaining
            return min(answer.num_tokens - generated, cap)

        longer = [still_to_run(answer) for answer in self.answers if answer.num_tokens > generated]
        return (self.prior_weight * ski_rental + sum(longer)) / (self.prior_weight + len(longer))


@dataclass
class StepTimeRecord:
    """What one drafter's steps took in the engine, across requests: a plain step, a drafted token
    and reading a backlog (against the profile).

    Each is a running mean over its first ``window`` samples, then an exponential moving average
    with weight 1 / ``window``, so it follows a change of context length or machine load.
    """

    plain_step_ms: float | None = None
    draft_token_ms: float | None = None
    reading_scale: float = 1.0  # a backlog's measured reading time ÷ the profiled prefill curve's
    num_plain_steps: int = 0
    num_drafting_steps: int = 0
    num_readings: int = 0
    window: int = 16

    def add_plain_step(self, elapsed_ms: float) -> None:
        self.num_plain_steps += 1
        self.plain_step_ms = self._average(self.plain_step_ms, elapsed_ms, self.num_plain_steps)

    def add_draft_token_cost(self, per_token_ms: float) -> None:
        self.num_drafting_steps += 1
        self.draft_token_ms = self._average(self.draft_token_ms, per_token_ms, self.num_drafting_steps)

    def add_reading(self, measured_ms: float, profiled_ms: float) -> None:
        self.num_readings += 1
        scale = min(4.0, max(0.25, measured_ms / profiled_ms))  # one step's noise must not freeze the choice
        self.reading_scale = self._average(self.reading_scale, scale, self.num_readings)

    def _average(self, current: float | None, sample: float, count: int) -> float:
        if current is None or count == 1:
            return sample
        return current + (sample - current) / min(count, self.window)


class Policy(ABC):
    @abstractmethod
    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        """γ for the next step (0 = a plain step)."""

    def keep_drafting(self, step: DraftStep) -> bool:
        """After drafting a token: draft another one?"""
        return True

    def observe(self, proposed: int, accepted: int) -> None:  # noqa: B027 - optional hook
        """The step proposed ``proposed`` drafts and the target accepted the first ``accepted``."""

    def observe_plain(self, target_logits: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """A token was chosen without drafts (the prompt's last position or a step that proposed
        nothing), from these ``[B, V]`` target logits (temperature 1, before any sampling processing)."""

    def observe_step_time(self, proposed: int, elapsed_ms: float) -> None:  # noqa: B027 - optional hook
        """A whole step (choosing, drafting ``proposed`` tokens, verifying, committing) took ``elapsed_ms``."""

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:  # noqa: B027 - optional hook
        """The request ended after ``num_tokens`` new tokens; ``cut_by_budget``: at its max_new_tokens."""


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

    def observe(self, proposed: int, accepted: int) -> None:
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
        top_probability = torch.softmax(step.logits.float(), dim=-1).amax(dim=-1)  # [B]
        return bool((top_probability >= self.threshold).all())


MEASURED_BACKLOG = 2  # a drafter catching up on at most this many tokens: a draft model after a fully accepted block


@dataclass
class GoodputPolicy(Policy):
    """γ maximising expected tokens per millisecond for the request's estimated acceptance.

    Acceptance is estimated in two parts (:class:`AcceptanceRecord`): α, that a block's first draft is
    accepted, and β, that a later draft is accepted when every draft before it in the block was
    (:func:`expected_tokens`). A drafter that copies or has found its footing keeps being right, so β
    is usually well above α, and a single per-draft rate, measured mostly on short blocks, would keep
    γ short where long blocks pay (prompt lookup on Spec-Bench qa chose γ = 1 on most steps, while
    fixed γ = 4 was its best). α is the mean of a Beta posterior over first drafts: an accepted one is
    a success, a rejected one a failure, and older evidence decays by ``decay`` per block. β counts the
    later drafts the same way (the first rejected one is its failure), shrunk toward α with the weight
    of ``continuation_shrink`` observations, and its evidence decays by ``decay`` per observed draft of
    either kind: without evidence of its own β is α, Leviathan et al.'s independent drafts, and
    evidence that blocks of one draft no longer renew fades back to that. The priors are the
    drafter's record across requests with the weight of ``prior_strength`` observations (α: Beta(1, 1)
    before there is a record). A prior is the oldest evidence and decays with the rest, so a request
    whose drafts keep being accepted drives both toward 1 (with a prior that did not decay, an
    estimate would stay below (1 + 1/(1 − decay)) / (2 + 1/(1 − decay)) = 0.93 at 0.92).
    After ``probe_after`` plain steps in a row it drafts one token to re-measure α, so a request
    whose text turns predictable is noticed; after ``probe_after`` one-draft blocks in a row it
    drafts up to two, since a block of one never shows whether later drafts are accepted.

    A drafter may first have to read tokens (a draft model reads the prompt lazily, at its first
    draft): that cost, read from the cost model's measured draft prefill curve, is paid only when
    the expected saving over the tokens the answer is expected still to run exceeds it
    (:meth:`horizon`). With no earlier answers that is as many as it has run so far, within the
    budget: ski rental, which with α known loses at most twice what knowing the answer's length
    would have, whatever the budget. As the drafter's answers accumulate in ``answer_lengths``,
    the expectation over the earlier answers that ran longer than this one has so far takes over.
    So a long document is decoded plainly unless answers run long enough to repay reading it, and
    where answers usually run long enough to repay a short prompt's reading, it is read at once.
    A probe pays at most as much reading as the ``probe_after`` plain steps before it cost.

    γ is the most a step drafts: a drafter with a model stops earlier once the next token is not
    expected to pay for itself (:meth:`keep_drafting`: the chance, by the draft's own top
    probabilities, that the block so far is accepted, times β, against what one more token costs), so
    a request whose draft is unsure verifies short blocks before its estimates have caught up.

    The cost model's curves time bare forwards at one context length, and on a shared machine they
    are off by tens of percent either way (the 1.5B target's 1-token forward profiled at 63 ms with
    real plain steps taking 70, and at 93 ms with real steps taking 75). So the policy plans with what
    the engine's steps take (:class:`StepTimeRecord`, :meth:`CostModel.with_measurements`): every
    plain step measures t(1); every drafting step whose drafter had at most ``MEASURED_BACKLOG``
    tokens to catch up on measures a drafted token's cost, as the step's time less the corrected target
    forward, per draft; a step that read a longer backlog first measures the reading against the
    profiled prefill curve. The decision to draft at all rests on exactly these ratios.

    Before a request's first draft, when the drafter has to read first, the target's top
    probability on each plain token so far (the prefill's token at least) counts as that fraction
    of an accepted draft, in the estimate that chooses the first γ and decides whether the reading
    pays (recent tokens weigh more, by ``decay`` per token). Once the drafter has drafted, only
    real acceptances count. The relation is loose: over the first 32 tokens of the Spec-Bench
    questions, mean top probability 0.65–0.77 went with 50–67 % draft agreement on translation,
    0.73–0.86 with 75–94 % on qa and 0.83–0.96 with 78–100 % on math
    (``tools/target_confidence.py``; measured on greedy decoding, used as is under sampling).
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
    first: BetaCounts = field(default_factory=lambda: BetaCounts(1.0, 1.0), init=False)  # α's decayed evidence
    later: BetaCounts = field(default_factory=BetaCounts, init=False)  # β's, the record's prior included
    drafted: bool = field(default=False, init=False)  # has this request had a step with drafts?
    top_probability_sum: float = field(default=0.0, init=False)  # decayed sums of their top probabilities
    rest_probability_sum: float = field(default=0.0, init=False)  # and of 1 - those
    plain_steps: int = field(default=0, init=False)
    single_steps: int = field(default=0, init=False)  # one-draft blocks in a row
    last_backlog: int = field(default=0, init=False)  # the drafter's backlog when the last step was chosen
    block_survival: float = field(default=1.0, init=False)  # P(every draft of this block so far is accepted)
    block_costs: CostModel | None = field(default=None, init=False)  # the corrected costs this block was chosen by

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
        return (self.later.accepted + self.continuation_shrink * alpha) / (self.later.total + self.continuation_shrink)

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        self.last_backlog = state.drafter_backlog
        self.block_survival = 1.0
        reading_ms = self._reading_ms(state)
        acceptance_rate = self.acceptance_rate()
        if not self.drafted and reading_ms > 0:  # what the target's confidence so far says, before the reading
            acceptance_rate = self.acceptance_rate(self.top_probability_sum, self.rest_probability_sum)
        continuation_rate = self.continuation_rate(acceptance_rate)
        costs = self.block_costs = self.costs()
        gamma = costs.best_num_draft_tokens(acceptance_rate, self.maximum, continuation_rate)
        if gamma > 0 and reading_ms > 0 and (horizon := self.horizon(state)) is not None:
            # is drafting worth the drafter's backlog over the tokens the answer is expected still to run?
            if costs.saving_ms(acceptance_rate, gamma, horizon, continuation_rate) <= reading_ms:
                gamma = 0
        elif gamma == 0 and self.plain_steps >= self.probe_after:
            # a probe may cost as much reading as the plain steps before it took
            gamma = 1 if reading_ms <= self.probe_after * costs.step_ms(0) else 0
        elif gamma == 1 and self.single_steps >= self.probe_after:
            gamma = min(2, self.maximum)  # a probe of β
        self.plain_steps = self.plain_steps + 1 if gamma == 0 else 0
        self.single_steps = self.single_steps + 1 if gamma == 1 else 0
        return gamma

    def keep_drafting(self, step: DraftStep) -> bool:
        """Draft one more token only if it is expected to pay for itself: it saves a plain step if it and
        every draft before it are accepted (the draft's top probabilities so far, times β for the next
        one), and it costs a drafted token plus what one more token adds to the verify forward."""
        confidence = torch.softmax(step.logits.float(), dim=-1).amax(dim=-1).min()  # the least sure row
        self.block_survival *= float(confidence)
        costs = self.block_costs or self.costs()
        k = step.num_drafted
        next_token_ms = costs.draft_ms + costs.target(k + 2) - costs.target(k + 1)
        return self.block_survival * self.continuation_rate() * costs.target(1) > next_token_ms

    def horizon(self, state: StepState) -> float | None:
        """How many more tokens the answer is expected to run: the ski-rental guess, blended with the
        drafter's earlier answers that ran longer than this one so far (None: unbounded, unknown)."""
        ski_rental = state.expected_remaining_tokens()
        if ski_rental is None or self.answer_lengths is None or state.generated_tokens is None:
            return ski_rental
        return self.answer_lengths.expected_remaining(state.generated_tokens, state.remaining_tokens, ski_rental)

    def costs(self) -> CostModel:
        """The profiled cost model, corrected by the step times measured so far."""
        assert self.step_times is not None
        return self.cost_model.with_measurements(self.step_times.plain_step_ms, self.step_times.draft_token_ms)

    def _reading_ms(self, state: StepState) -> float:
        """The drafter's catch-up beyond the one token every step's draft cost already includes
        (the profiled prefill curve, scaled by what earlier readings took against it)."""
        assert self.step_times is not None
        return self.step_times.reading_scale * self.cost_model.draft_read(state.drafter_backlog - 1)

    def observe_step_time(self, proposed: int, elapsed_ms: float) -> None:
        assert self.step_times is not None
        if proposed == 0:
            self.step_times.add_plain_step(elapsed_ms)
            return
        costs = self.costs()
        drafting_ms = max(0.0, elapsed_ms - costs.target(proposed + 1))  # the drafter's share of the step
        if self.last_backlog <= MEASURED_BACKLOG:
            self.step_times.add_draft_token_cost(drafting_ms / proposed)
        elif (profiled_ms := self.cost_model.draft_read(self.last_backlog - 1)) > 0:  # it read a backlog first
            self.step_times.add_reading(max(0.0, drafting_ms - proposed * costs.draft_ms), profiled_ms)

    def observe_plain(self, target_logits: torch.Tensor) -> None:
        if self.drafted:
            return
        top_probabilities = torch.softmax(target_logits.float(), dim=-1).amax(dim=-1)  # [B]
        top_probability = float(top_probabilities.min())  # the least confident row speaks for the batch
        self.top_probability_sum = self.decay * self.top_probability_sum + top_probability
        self.rest_probability_sum = self.decay * self.rest_probability_sum + 1.0 - top_probability

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.drafted = True
        first, later = draft_outcomes(proposed, accepted)
        for outcome in first:  # a block's first draft discounts α's older evidence, and β's
            self.first.add(outcome, self.decay)
            self.later.discount(self.decay)
        for outcome in later:
            self.later.add(outcome, self.decay)
        if self.record is not None:
            self.record.add(proposed, accepted)

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:
        if self.answer_lengths is not None:
            self.answer_lengths.add(num_tokens, cut_by_budget)


class SpecDecPolicy(Policy):
    """SpecDec++: draft up to the maximum while P(at least one rejection in the block) stays ≤ T.

    The acceptance head predicts each drafted token's acceptance from the draft's hidden state;
    the chance that the whole block so far is accepted is the product of those predictions.
    """

    def __init__(self, head: AcceptanceHead, threshold: float, maximum: int) -> None:
        self.head = head
        self.threshold = threshold
        self.maximum = maximum
        self.all_accepted = 1.0

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        self.all_accepted = 1.0
        return self.maximum

    def keep_drafting(self, step: DraftStep) -> bool:
        if step.hidden is None:
            return True  # a drafter without hidden states: the head cannot judge, draft on to the maximum
        self.all_accepted *= float(self.head.predict(step.hidden, step.logits).min())
        return 1.0 - self.all_accepted <= self.threshold


PolicyFactory = Callable[[str | None, PolicyContext], Policy]
POLICIES: Registry[PolicyFactory] = Registry("speculation policy")


def _number(spec: str | None, kind: type, what: str, low: float, high: float) -> float | int | None:
    if spec is None:
        return None
    try:
        value = kind(spec)
    except ValueError:
        raise ConfigError(f"{what} must be a {kind.__name__}, got {spec!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{what} must be in [{low}, {high}], got {value}")
    return value


@POLICIES.register("fixed")
def _fixed(arg: str | None, context: PolicyContext) -> Policy:
    value = _number(arg, int, "fixed:K", 0, 1024)
    return FixedPolicy(context.num_draft_tokens if value is None else int(value))


@POLICIES.register("heuristic")
def _heuristic(arg: str | None, context: PolicyContext) -> Policy:
    if arg is not None:
        raise ConfigError("the heuristic policy takes no argument")
    return HeuristicPolicy(context.num_draft_tokens, context.max_draft_tokens)


@POLICIES.register("confidence")
def _confidence(arg: str | None, context: PolicyContext) -> Policy:
    threshold = _number(arg, float, "confidence:T", 0.0, 1.0)
    return ConfidencePolicy(0.4 if threshold is None else float(threshold), context.max_draft_tokens)


@POLICIES.register("goodput")
def _goodput(arg: str | None, context: PolicyContext) -> Policy:
    if arg is not None:
        raise ConfigError("the goodput policy takes no argument")
    if context.cost_model is None:
        raise ConfigError("the goodput policy needs a cost model (a saved `quickdraft profile` or a calibration)")
    return GoodputPolicy(
        context.cost_model,
        context.max_draft_tokens,
        context.acceptance,
        step_times=context.step_times,
        answer_lengths=context.answer_lengths,
    )


@POLICIES.register("specdec++")
def _specdec(arg: str | None, context: PolicyContext) -> Policy:
    threshold = _number(arg, float, "specdec++:T", 0.0, 1.0)
    if context.acceptance_head is None:
        raise ConfigError(
            "the specdec++ policy needs an acceptance head: train one with `quickdraft train-acceptance-head` "
            "and pass it with --acceptance-head FILE"
        )
    return SpecDecPolicy(
        context.acceptance_head, 0.7 if threshold is None else float(threshold), context.max_draft_tokens
    )


NEEDS_MEASUREMENTS = {"goodput", "specdec++"}  # built per request from a cost model or a trained head


def needs_cost_model(spec: str) -> bool:
    """Does the policy ``NAME[:ARG]`` plan with measured costs (so a caller should calibrate first)?"""
    return spec.partition(":")[0] == "goodput"


def check_policy_spec(spec: str) -> None:
    """Validate ``NAME[:ARG]`` without building the policy (which may need a cost model or a head)."""
    name, _, arg = spec.partition(":")
    factory = POLICIES.get(name)
    if name not in NEEDS_MEASUREMENTS:
        factory(arg or None, PolicyContext())
    elif name == "goodput" and arg:
        raise ConfigError("the goodput policy takes no argument")
    elif name == "specdec++":
        _number(arg or None, float, "specdec++:T", 0.0, 1.0)


def make_policy(spec: str, context: PolicyContext) -> Policy:
    name, _, arg = spec.partition(":")
    return POLICIES.get(name)(arg or None, context)
