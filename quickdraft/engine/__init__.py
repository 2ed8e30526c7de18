"""The speculative decoding engine: one step loop for one request and for many (``Engine``), its requests and
events, the rules every request's steps follow, and the scheduler that chooses which requests run."""

from quickdraft.engine.engine import Engine
from quickdraft.engine.request import (
    CONFIDENCE_ROWS_PER_STEP,
    Event,
    FailureCause,
    GenerationResult,
    Request,
    RequestFailed,
    RequestFinished,
    RequestState,
    RunningRequest,
    Sink,
    TokenDelta,
)
from quickdraft.engine.scheduler import QueueFull, Scheduler, SchedulerSettings
from quickdraft.engine.step import StepReport
from quickdraft.engine.stream import GenerationStream, generate, stream

__all__ = [
    "CONFIDENCE_ROWS_PER_STEP",
    "Engine",
    "Event",
    "FailureCause",
    "GenerationResult",
    "GenerationStream",
    "QueueFull",
    "Request",
    "RequestFailed",
    "RequestFinished",
    "RequestState",
    "RunningRequest",
    "Scheduler",
    "SchedulerSettings",
    "Sink",
    "StepReport",
    "TokenDelta",
    "generate",
    "stream",
]
