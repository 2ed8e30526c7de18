"""What a policy learns and measures across requests: acceptance counts, answer lengths, step times.

One drafter's records are kept in its :class:`quickdraft.drafters.records.DrafterRecords` and shared by its
requests; each has ``to_dict``/``from_dict`` where it is saved between processes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar


def draft_outcomes(proposed: int, accepted: int) -> tuple[list[int], list[int]]:
    """A verified block's draft outcomes (1 accepted, 0 rejected): its first draft's, and those of the
    later drafts the target judged after an accepted one (drafts past the first rejection tell nothing)."""
    if proposed == 0:
        return [], []
    later = [1] * max(0, accepted - 1) + ([0] if 0 < accepted < proposed else [])
    return [1 if accepted > 0 else 0], later


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

    def plus(self, outcome: int, decay: float = 1.0) -> BetaCounts:
        """These counts after :meth:`add` (``outcome``, ``decay``), leaving these as they are."""
        return BetaCounts(self.accepted * decay + outcome, self.rejected * decay + (1 - outcome))

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
    match that copies, a draft model past a hard token); the measurements are in ``docs/policies.md``.
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
        return {key: [c.accepted, c.rejected] for key, c in (("first", self.first), ("later", self.later))}

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
    num_added: int = field(default=0, init=False, compare=False)  # answers added since it was made (it may hold fewer)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"an answer length record needs room for at least one answer, got {self.capacity}")
        self.answers = deque(self.answers, maxlen=self.capacity)

    def add(self, num_tokens: int, cut_by_budget: bool = False) -> None:
        self.answers.append(AnswerLength(num_tokens, cut_by_budget))
        self.num_added += 1

    def added_since(self, num_added: int) -> list[AnswerLength]:
        """The answers added after the ``num_added``-th that it still holds, oldest first."""
        count = min(self.num_added - num_added, len(self.answers))
        return list(self.answers)[len(self.answers) - count :] if count > 0 else []

    def expected_remaining(self, generated: int, remaining: int | None, ski_rental: float) -> float:
        """E[min(L − m, remaining)] over the recorded answers that ran longer than m = ``generated``,
        blended with the ski-rental guess."""
        cap = float("inf") if remaining is None else remaining
        longer = [
            remaining if answer.cut_by_budget and remaining is not None else min(answer.num_tokens - generated, cap)
            for answer in self.answers
            if answer.num_tokens > generated
        ]
        return (self.prior_weight * ski_rental + sum(longer)) / (self.prior_weight + len(longer))


Current = TypeVar("Current")  # an estimate as it stands: a default, or None (not yet made)
MIN_SAMPLES = 3  # a step time is estimated from at least this many steps (a median of one would be that step)


@dataclass
class StepTimeRecord:
    """What one drafter's steps took in the engine, across requests: a plain step, a drafted token
    and reading a backlog (against the profile).

    Rules: each estimate is the median of its last ``window`` samples, and none is made before
    ``MIN_SAMPLES`` (until then the profile stands), so one stalled step (the machine, not the step)
    does not move it, and it follows a change of context length or machine load within half a
    window. A drafted token's cost is kept as its share of the plain-step estimate when it was timed, so
    it follows the machine's speed through the plain steps, which come every few steps: it is sampled
    only by steps that draft, and a cost timed in a slow spell, or a running mean that one stall had
    raised, kept drafting off until steps that were no longer taken brought it down
    (``docs/policies.md``). A share is at most 1: at a plain step's price drafting never pays (a
    block's tokens never cost less than plain steps' would), so a dearer sample says no more.
    """

    plain_step_ms: float | None = None
    draft_share: float | None = None  # a drafted token's cost ÷ the plain step when it was timed
    reading_scale: float = 1.0  # a backlog's measured reading time ÷ the profiled prefill curve's
    num_plain_steps: int = 0
    num_drafting_steps: int = 0
    num_readings: int = 0
    window: int = 16
    recent: dict[str, deque[float]] = field(default_factory=dict, init=False, repr=False)  # samples by estimate

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"a step time record needs a window of at least one step, got {self.window}")

    @property
    def draft_token_ms(self) -> float | None:
        """What a drafted token costs now, at the record's own plain-step estimate (None: either not made)."""
        return self.draft_token_cost(self.plain_step_ms)

    def draft_token_cost(self, plain_step_ms: float | None) -> float | None:
        """A drafted token's share of a plain step, at ``plain_step_ms`` (None: no share yet, or no plain step)."""
        if self.draft_share is None or plain_step_ms is None or plain_step_ms <= 0:
            return None
        return self.draft_share * plain_step_ms

    def add_plain_step(self, elapsed_ms: float) -> None:
        self.num_plain_steps += 1
        self.plain_step_ms = self._median_with("plain_step_ms", elapsed_ms, self.plain_step_ms)

    def add_draft_token_cost(self, per_token_ms: float, plain_step_ms: float) -> None:
        """A drafted token's cost, kept as its share of ``plain_step_ms``: the plain step's estimate when it was
        timed (the record's own, or the profile's t(1) before there is one)."""
        self.num_drafting_steps += 1
        if plain_step_ms > 0:
            share = min(1.0, per_token_ms / plain_step_ms)
            self.draft_share = self._median_with("draft_share", share, self.draft_share)

    def add_reading(self, measured_ms: float, profiled_ms: float) -> None:
        self.num_readings += 1
        scale = min(4.0, max(0.25, measured_ms / profiled_ms))  # one step's noise must not freeze the choice
        self.reading_scale = self._median_with("reading_scale", scale, self.reading_scale)

    def summary(self) -> dict[str, float | int | None]:
        """The estimates and how many samples each has had (what a bench saves)."""
        names = ("plain_step_ms", "draft_token_ms", "draft_share", "reading_scale")
        counts = ("num_plain_steps", "num_drafting_steps", "num_readings", "window")
        return {name: getattr(self, name) for name in (*names, *counts)}

    def _median_with(self, name: str, sample: float, current: Current) -> float | Current:
        """The median of ``name``'s recent samples with ``sample``; ``current`` before ``MIN_SAMPLES`` of them."""
        samples = self.recent.setdefault(name, deque(maxlen=self.window))
        samples.append(sample)
        return statistics.median(samples) if len(samples) >= min(MIN_SAMPLES, self.window) else current
