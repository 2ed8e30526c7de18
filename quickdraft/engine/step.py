"""What a step of the engine plans and what it reports, and the lock one thread steps under."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from quickdraft.costs import BatchCostModel
from quickdraft.engine.request import RunningRequest
from quickdraft.policies import DraftBid, StepState
from quickdraft.policies.planner import alone_in_step, plan_step, step_reach


@dataclass(frozen=True)
class StepReport:
    """What one step did (for metrics)."""

    decoding: int  # requests that drafted and verified
    prefill_tokens: int  # prompt tokens read
    gammas: tuple[int, ...]  # γ chosen per decoding request
    proposed: int  # drafts proposed, all requests
    accepted: int  # drafts committed
    new_tokens: int  # tokens committed, all requests
    finished: int
    running: int
    waiting: int
    seconds: float


@dataclass
class StepPlan:
    chunks: list[tuple[RunningRequest, int]] = field(default_factory=list)  # (request, prompt tokens to read)
    gammas: dict[RunningRequest, int] = field(default_factory=dict)  # decoding requests and their planned γ
    reach: dict[RunningRequest, int] = field(default_factory=dict)  # what each may draft (DraftBid.reach when alone)
    bids: dict[RunningRequest, DraftBid] = field(default_factory=dict)  # what their policies bid (before planning)

    @property
    def alone(self) -> bool:
        """One request decodes and nothing else runs: the step is the single-request problem."""
        return len(self.gammas) == 1 and not self.chunks


def plan_requests(
    running: list[RunningRequest], chunks: list[tuple[RunningRequest, int]], batch_costs: BatchCostModel | None
) -> StepPlan:
    """The step's plan: the prompt ``chunks`` to read and a γ for every decoding request, from its policy's bid;
    goodput bids trimmed together to what pays in this step on ``batch_costs`` (None: bids stand)."""
    plan = StepPlan(chunks=chunks)
    decoding = [state for state in running if state.decoding]
    bids: list[DraftBid] = []
    for state in decoding:
        generated, context = len(state.new_token_ids), len(state.committed)  # context: what attention reads
        remaining_tokens = state.request.config.max_new_tokens - generated
        offers = state.request.drafter.offers(state.draft_state, state.committed)
        bid = plan.bids[state] = state.policy.bid(StepState(remaining_tokens, generated, context, offers))
        bids.append(bid.capped(remaining_tokens - 1))
    gammas = [bid.num_draft_tokens for bid in bids]
    # Bids exist only while some request decodes, and then prompt chunks keep to the step's budget (the
    # scheduler reads a prompt whole only when none decodes): other_tokens stays within the measured curve.
    other_tokens, negotiable = sum(n for _, n in plan.chunks), any(bid.negotiable for bid in bids)
    if batch_costs is not None and negotiable and not alone_in_step(bids, other_tokens):
        gammas = plan_step(bids, batch_costs, other_tokens)
    plan.gammas = dict(zip(decoding, gammas, strict=True))
    plan.reach = dict(zip(decoding, step_reach(bids, gammas, other_tokens), strict=True))
    return plan


class StepLock:
    """One thread steps an engine at a time. :meth:`stepping` holds the lock as the thread that steps (a step, or
    freeing a cancelled request's caches at once, which without ``blocking`` happens only if no step runs);
    :meth:`between_steps` holds it for work no step may run beside (measuring costs runs forwards), and on the thread
    that holds it (a sink that submits the next turn) lets the work run there, between that thread's forwards."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stepper: int | None = None  # the thread inside stepping()

    @contextlib.contextmanager
    def stepping(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the lock as the stepping thread; yields whether it is held (without ``blocking``, not if taken)."""
        if not self._lock.acquire(blocking):
            yield False
            return
        self._stepper = threading.get_ident()
        try:
            yield True
        finally:
            self._stepper = None
            self._lock.release()

    @contextlib.contextmanager
    def between_steps(self) -> Iterator[None]:
        if self._stepper == threading.get_ident():
            yield
            return
        with self._lock:
            yield
