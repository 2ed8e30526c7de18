"""A request of the batched engine: what was asked (frozen), what it hears back, and its state while it runs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from quickdraft.config import GenerationConfig
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS
from quickdraft.drafters.draft_model import DraftCache
from quickdraft.drafters.hybrid import ContextCopies
from quickdraft.engine import GenerationResult
from quickdraft.errors import ConfigError
from quickdraft.policies import Policy
from quickdraft.runtime.base import KVCache
from quickdraft.stats import GenerationStats
from quickdraft.text import IncrementalDecoder

# early exit is not served: it drafts into one request's target cache
SERVED_DRAFTERS = ("hybrid", "draft-model", "prompt-lookup", "none")


@dataclass(frozen=True)
class ServeRequest:
    """One generation request: prompt token ids, its settings, and which drafter speculates for it."""

    prompt_ids: tuple[int, ...]
    config: GenerationConfig = field(default_factory=GenerationConfig)
    drafter: str = DEFAULT_DRAFTER  # "none": plain decoding for this request, whatever the others do
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self) -> None:
        DRAFTERS.get(self.drafter)  # an unknown name raises UnknownNameError listing the known ones
        if self.drafter not in SERVED_DRAFTERS:
            raise ConfigError(
                f"the {self.drafter} drafter is not served in batches; choose one of: {', '.join(SERVED_DRAFTERS)}"
            )


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a step committed for a request, and the text that became final with them (may be empty)."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class RequestFinished:
    """The request ended (end of sequence, a stop string, its token budget, or ``cancelled``)."""

    result: GenerationResult


@dataclass(frozen=True)
class RequestFailed:
    """The request could not go on (a fault of the server, not of the request); the others go on."""

    message: str


Event = TokenDelta | RequestFinished | RequestFailed
Sink = Callable[[Event], None]  # called on the engine's thread: hand the event over, do not block


@dataclass(eq=False)
class RequestState:
    """A running request: its caches, the committed tokens, its policy's and decoder's state."""

    request: ServeRequest
    sink: Sink
    policy: Policy
    generator: torch.Generator  # unseeded sampling draws from it; seeded, from position noise
    decoder: IncrementalDecoder
    committed: list[int]  # prompt + new tokens; the target's cache holds all but the last once prefilled
    cache: KVCache | None = None  # the target's, from admission until the request ends
    draft_cache: DraftCache | None = None  # the draft model's (draft-model requests), from admission
    copies: ContextCopies | None = None  # a hybrid request's copies from its context
    prefilled: int = 0  # prompt tokens the target has read
    confidence_step: int = 0  # the engine's step at which its policy last heard the target's confidence
    new_token_ids: list[int] = field(default_factory=list)
    stats: GenerationStats = field(default_factory=GenerationStats)
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    @property
    def prompt_length(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def decoding(self) -> bool:
        """The prompt is read and the first token committed: the request takes part in draft-and-verify steps."""
        return self.prefilled == self.prompt_length and bool(self.new_token_ids)

    def release(self) -> None:
        """Free the caches (the memory of a finished or cancelled request)."""
        self.cache = None
        self.draft_cache = None
