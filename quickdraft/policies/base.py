"""The policy interface and registry: a policy bids γ for a step (0 = a plain step) on one of its drafter's offers.

A policy lives for one request. Before each step the drafter says what it can draft now (its :class:`Offer` s:
a draft model's drafts, copies from the context, …) and the engine asks :meth:`Policy.bid` for a
:class:`DraftBid` on one of them, telling it in a :class:`StepState` how many tokens the request may still
produce and what its context holds. A bid is a query: it changes nothing in the policy. While the drafter drafts,
the bid's own ``keep_drafting`` may stop it early (confidence-based policies); after verification the engine
hands the policy a :class:`StepOutcome` (:meth:`Policy.observe`), the one place where what it learns from a
step changes. Policies never affect which tokens are produced, only how fast: every γ is lossless.

Registry names (``NAME`` or ``NAME:ARG``; each entry is a :class:`PolicyKind`):
- ``fixed:K`` — always K (``fixed`` alone uses the request's ``num_draft_tokens``);
- ``heuristic`` — transformers' rule: start at ``num_draft_tokens``, +2 after a fully accepted
  block, −1 otherwise (at least 1);
- ``confidence:T`` — draft up to the maximum, stopping when the draft's top probability < T;
- ``goodput`` — γ = argmax over 0..γmax of expected tokens per millisecond under the measured
  cost model and an online estimate of the acceptance rate α (SmartSpec-style), for the offer that
  promises the most;
- ``specdec++:T`` — draft up to the maximum, stopping when a trained acceptance head puts
  P(at least one rejection in the block) above T (SpecDec++).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from quickdraft.costs import CostModel
from quickdraft.errors import ConfigError
from quickdraft.policies.acceptance_head import AcceptanceHead
from quickdraft.policies.records import AcceptanceRecord, AnswerLengthRecord, StepTimeRecord
from quickdraft.registry import Registry


@dataclass(frozen=True)
class DraftStep:
    """What a drafter knows right after drafting a token: what a policy may stop drafting on."""

    logits: torch.Tensor  # [B, V] the draft distribution's logits (temperature 1)
    hidden: torch.Tensor | None  # [B, H] the draft model's last hidden state, if the runtime gives it
    num_drafted: int  # tokens drafted so far in this step, this one included


# Called after each drafted token with what the drafter knows about it; False stops drafting
# (confidence-based policies). Drafters without a model never call it.
KeepDrafting = Callable[[DraftStep], bool]


def always(step: DraftStep) -> bool:
    """A block that drafts as many tokens as were bid."""
    return True


@dataclass(frozen=True)
class Offer:
    """Drafts a drafter can propose for a request in the next step, from one source. A policy bids on one offer
    and the engine hands it back to the drafter with the step's task; neither needs to know what the source is.

    Rules: a drafter lists its offers in the order a policy without estimates takes them (the first one
    ``available``); a ``free`` offer costs no drafting, and a policy keeps its acceptance apart from the
    drafter's measured drafts (the first offer that is not free), whose record the drafter keeps across
    requests. A drafter that lists a free offer lists it every step, with ``max_tokens`` 0 when it has nothing,
    so a policy can tell how often it has something."""

    source: str  # where the drafts come from ("model", "copy", ...): estimates are kept per source
    max_tokens: int | None = None  # the most it can draft now; None: as many as bid
    free: bool = False  # drafting costs nothing (copies); else a drafted token costs what the drafter's costs say
    backlog: int = 0  # committed tokens the drafter must read before it can draft (a lazy draft model)
    batched: bool = False  # its drafts are rows of draft-model forwards that the step's requests share
    token_ms: float | None = None  # what a drafted token costs, where the drafter times it itself (a draft head);
    # None: what the drafter's calibration says. Either is corrected by the steps the engine measures.
    # The drafter asks the bid's judge after each drafted token, and how it drafts does not depend on how many
    # tokens it may draft: a block may run past the plan (DraftBid.reach).
    judged: bool = False

    def __post_init__(self) -> None:
        if self.backlog < 0 or any(n is not None and n < 0 for n in (self.max_tokens, self.token_ms)):
            raise ValueError(f"an offer needs counts >= 0, got {self}")

    @property
    def available(self) -> bool:
        return self.max_tokens is None or self.max_tokens > 0


MODEL_DRAFTS = Offer("model")  # a drafter's own drafts, priced by its measured costs, with nothing to read first


@dataclass(frozen=True)
class StepState:
    """What the engine tells a policy before a step, besides the policy's own history."""

    remaining_tokens: int | None = None  # new tokens the request may still produce (a bound); None: unbounded
    generated_tokens: int | None = None  # new tokens the request has produced so far; None: not known
    context_tokens: int = 0  # tokens in the target's cache before the step: what its attention reads
    offers: tuple[Offer, ...] = (MODEL_DRAFTS,)  # what the request's drafter can draft now (Drafter.offers)

    def __post_init__(self) -> None:
        counts = [self.remaining_tokens, self.generated_tokens, self.context_tokens]
        if any(count is not None and count < 0 for count in counts):
            raise ValueError(f"a step state needs counts >= 0, got {self}")

    def expected_remaining_tokens(self) -> int | None:
        """How many more tokens the answer is expected to run: as many as it has run so far, within the budget.

        Answer lengths are scale-free (one short, the next hundreds of tokens), and an answer that has
        run m tokens is guessed to run about m more. Trading on this guess is the ski-rental rule: pay
        for a drafter's reading once the plain steps have forgone as much as the reading costs.
        """
        return min((n for n in (self.remaining_tokens, self.generated_tokens) if n is not None), default=None)


UNKNOWN_STATE = StepState()


@dataclass(frozen=True)
class DraftBid:
    """What a request's policy asks of a step: at most ``num_draft_tokens`` drafts of ``offer`` (``reach`` when the
    request has the step alone), drafted while ``keep_drafting`` says so. A bid with acceptance estimates may be
    given fewer by a batch planner that weighs every request's expected tokens against the whole step's cost
    (goodput's :func:`plan_step`); one without gets exactly what it asked for (a fixed γ is a fixed γ)."""

    num_draft_tokens: int
    acceptance_rate: float | None = None  # α, that the block's first draft is accepted; None: not negotiable
    continuation_rate: float | None = None  # β, that a later draft is accepted when the drafts before it were
    reading_ms: float = 0.0  # what the drafter must read before it drafts costs (paid only if it drafts)
    offer: Offer | None = None  # which of the drafter's offers to draft from; None: nothing to draft
    # What the request's context adds to a step beyond the batch curve's (measured with few cached tokens): to the
    # target's forward for its one token, and for each draft (its row's attention, and the draft model's if any).
    context_ms: float = 0.0
    context_ms_per_draft: float = 0.0
    keep_drafting: KeepDrafting = always  # this block's own judge: it may keep state for the block, never the policy
    # Alone in its step, the request may draft on to this many while keep_drafting says so (None: num_draft_tokens).
    reach: int | None = None

    def __post_init__(self) -> None:
        times = [self.reading_ms, self.context_ms, self.context_ms_per_draft]
        if self.num_draft_tokens < 0 or min(times) < 0:
            raise ValueError(f"a draft bid needs num_draft_tokens >= 0 and times >= 0, got {self}")
        if self.reach is not None and self.reach < self.num_draft_tokens:
            raise ValueError(f"a draft bid's reach is at least its num_draft_tokens, got {self}")
        rates = [rate for rate in (self.acceptance_rate, self.continuation_rate) if rate is not None]
        if any(not 0.0 <= rate <= 1.0 for rate in rates):
            raise ValueError(f"acceptance estimates are probabilities, got {self}")

    @property
    def negotiable(self) -> bool:
        return self.acceptance_rate is not None

    def capped(self, most: int) -> DraftBid:
        """This bid, drafting at most ``most`` tokens (what the request's budget leaves), reach included."""
        reach = None if self.reach is None else min(self.reach, most)
        return replace(self, num_draft_tokens=min(self.num_draft_tokens, most), reach=reach)

    def gain(self, k: int) -> float:
        """The expected tokens the k-th draft of the block adds: α·β^(k−1) (β = α when not given; 0 without α)."""
        alpha = self.acceptance_rate or 0.0
        beta = alpha if self.continuation_rate is None else self.continuation_rate
        return alpha * beta ** (k - 1)

    @property
    def batched(self) -> bool:
        """Its drafts are rows of the draft model's forwards shared by the step's requests."""
        return self.offer is not None and self.offer.batched


@dataclass(frozen=True)
class StepOutcome:
    """What a step did for one request, for its policy to learn from: the bid it made (before a batch planner
    trimmed it), the drafts proposed and how many the target judged and accepted, and, when the request had the
    step to itself, how long the whole step took."""

    bid: DraftBid
    num_drafted: int = 0  # drafts the drafter proposed
    num_judged: int = 0  # of those, the drafts the target's verdict counts for (see committed_drafts)
    num_accepted: int = 0  # the first ``num_accepted`` judged drafts were accepted
    step_ms: float | None = None  # the whole step (bidding, drafting, verifying, committing); None: shared

    def __post_init__(self) -> None:
        if not 0 <= self.num_accepted <= self.num_judged <= self.num_drafted:
            raise ValueError(f"a step outcome needs 0 <= accepted <= judged <= drafted, got {self}")


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


class Policy(ABC):
    @abstractmethod
    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        """γ for the next step (0 = a plain step); changes nothing."""

    def bid(self, state: StepState = UNKNOWN_STATE) -> DraftBid:
        """The next step's bid; changes nothing. By default :meth:`choose`'s γ, fixed, on the drafter's first
        available offer, judged block by block by :meth:`keep_drafting`."""
        offer = next((offer for offer in state.offers if offer.available), None)
        gamma = self.choose(state) if offer is not None else 0
        return DraftBid(gamma, offer=offer if gamma > 0 else None, keep_drafting=self.keep_drafting)

    def keep_drafting(self, step: DraftStep) -> bool:
        """After drafting a token: draft another one? (A policy whose judgement keeps state for a block makes
        a judge per bid instead.)"""
        return True

    def observe(self, outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """What the step of the policy's last bid did: the one place where a policy learns from a step."""

    def wants_confidence(self) -> bool:
        """Does :meth:`observe_confidence` want the target's confidence after the next token chosen without drafts
        (the prompt's last position, or a step that proposed nothing)? (The engine computes it for a few requests
        a step, taking turns.)"""
        return False

    def observe_confidence(self, probability: float) -> None:  # noqa: B027 - optional hook
        """After a token chosen without drafts: ``probability``, the largest of the target's softmax there
        (temperature 1, before any sampling processing)."""

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:  # noqa: B027 - optional hook
        """The request ended after ``num_tokens`` new tokens; ``cut_by_budget``: at its max_new_tokens."""


@dataclass(frozen=True)
class PolicyKind:
    """A registry entry: how a policy reads its argument, how it is built, and what it needs first."""

    build: Callable[[Any, PolicyContext], Policy]  # (the parsed argument, None if none was given; the context)
    parse_argument: Callable[[str | None], Any]  # ``ARG`` of ``NAME:ARG`` -> its value; raises ConfigError
    needs_cost_model: bool = False  # plans with measured costs: calibrate before building it
    needs_acceptance_head: bool = False  # a trained SpecDec++ head
    learns_answers: bool = False  # learns acceptance and answer lengths worth keeping across processes
    uses_num_draft_tokens: bool = False  # its γ (or the γ it starts from) is the request's num_draft_tokens
    uses_max_draft_tokens: bool = True  # it chooses γ up to the request's max_draft_tokens


POLICIES: Registry[PolicyKind] = Registry("speculation policy", setting="policy")
MAX_DRAFT_TOKENS = 1024  # the most drafts a step may ask for: fixed:K's bound and num_draft_tokens'


@dataclass(frozen=True)
class PolicySpec:
    """A parsed ``NAME[:ARG]``: the argument checked once, the entry that builds it."""

    name: str
    argument: Any
    kind: PolicyKind

    def build(self, context: PolicyContext) -> Policy:
        return self.kind.build(self.argument, context)

    @property
    def reads_num_draft_tokens(self) -> bool:
        """Its γ (or the γ it starts from) is the request's ``num_draft_tokens``, not one given as its argument."""
        return self.kind.uses_num_draft_tokens and self.argument is None

    def __str__(self) -> str:
        return self.name if self.argument is None else f"{self.name}:{self.argument}"

    def __eq__(self, other: object) -> bool:
        """Specs are equal by name and argument; a spec equals its text (``config.policy == "goodput"``)."""
        if isinstance(other, str):
            return str(self) == other
        if isinstance(other, PolicySpec):
            return (self.name, self.argument) == (other.name, other.argument)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))


def parse_policy(text: str) -> PolicySpec:
    """``NAME[:ARG]`` -> a :class:`PolicySpec`; an unknown name or a bad argument raises ``ConfigError``."""
    name, colon, argument = text.partition(":")
    kind = POLICIES.get(name)
    if colon and not argument.strip():
        raise ConfigError(f"the policy {text!r} has nothing after ':': give {name}:ARG or {name}")
    return PolicySpec(name, kind.parse_argument(argument or None), kind)


def make_policy(text: str, context: PolicyContext) -> Policy:
    return parse_policy(text).build(context)


def no_argument(name: str) -> Callable[[str | None], None]:
    """The argument parser of a policy that takes none."""

    def parse(argument: str | None) -> None:
        if argument is not None:
            raise ConfigError(f"the {name} policy takes no argument")

    return parse


def number_argument(kind: type, what: str, low: float, high: float) -> Callable[[str | None], Any]:
    """The argument parser of a policy that takes an optional ``kind`` in [low, high], written in ASCII without
    ``_`` or spaces around it (``int()`` would read "3_0" as 30)."""

    def parse(argument: str | None) -> Any:
        if argument is None:
            return None
        try:  # ASCII as written ("3_0" and " 3" are typos int() would read)
            if not argument.isascii() or "_" in argument or argument != argument.strip():
                raise ValueError(argument)
            value = kind(argument)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise ConfigError(f"{what} must be {noun}, got {argument!r}") from None
        if not low <= value <= high:
            raise ConfigError(f"{what} must be in [{low}, {high}], got {value}")
        return value

    return parse
