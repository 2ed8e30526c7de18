"""Serving many requests at once: continuous batching with per-request speculation (``BatchEngine``), its
scheduler, batched drafting, and the background loop a server drives it with."""

from quickdraft.serving.engine import BatchEngine, StepReport
from quickdraft.serving.request import (
    Event,
    RequestFailed,
    RequestFinished,
    RequestState,
    ServeRequest,
    TokenDelta,
)
from quickdraft.serving.scheduler import QueueFull, SchedulerSettings

__all__ = [
    "BatchEngine",
    "Event",
    "QueueFull",
    "RequestFailed",
    "RequestFinished",
    "RequestState",
    "SchedulerSettings",
    "ServeRequest",
    "StepReport",
    "TokenDelta",
]
