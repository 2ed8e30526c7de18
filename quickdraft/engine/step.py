"""What a step of the engine plans and what it reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from quickdraft.engine.request import RunningRequest
from quickdraft.policies import DraftBid


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
