"""A request of the engine: what was asked (frozen), what it hears back, and its state while it runs."""

from __future__ import annotations

import enum
import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, Drafter, DraftState
from quickdraft.engine.logprobs import TokenLogprob, token_logprobs
from quickdraft.errors import ConfigError, PromptError
from quickdraft.grammar import Constraint, constrain_step
from quickdraft.lossless.adjustments import adjust_logits, mask_ends, prompt_tokens
from quickdraft.lossless.sampling import top_probability
from quickdraft.policies import FixedPolicy, Policy
from quickdraft.runtime.base import KVCache
from quickdraft.stats import GenerationStats
from quickdraft.text import IncrementalDecoder


@dataclass(frozen=True, eq=False)
class Request:
    """One generation request: prompt token ids, its settings and the drafter that speculates for it (an object,
    resolved by name at the edge: ``Pipeline.drafter``)."""

    prompt_ids: tuple[int, ...]
    config: GenerationConfig
    drafter: Drafter  # a NoDrafter: plain decoding for this request, whatever the others do
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    policy: Policy | None = None  # a ready policy (e.g. one that records); None: config.policy, built at submission
    prediction_ids: tuple[int, ...] = ()  # the answer the user expects (Predicted Outputs): drafts copied from it
    cache_prompt: bool = True  # False: no cached prefix is taken for it and its cache is not kept (llama.cpp's)

    def __post_init__(self) -> None:
        """Types checked here, at the edge (a wrong one would fail deep in a step); ids' range by the engine."""
        for name in ("prompt_ids", "prediction_ids"):
            object.__setattr__(self, name, token_ids(getattr(self, name), name))
        for name, kind in (("config", GenerationConfig), ("drafter", Drafter)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"a request's {name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if not isinstance(self.cache_prompt, bool) or not isinstance(self.request_id, str):
            message = "a request's cache_prompt must be True or False and its request_id a string"
            raise ConfigError(f"{message}, got {self.cache_prompt!r} and {self.request_id!r}")
        if self.policy is not None and not isinstance(self.policy, Policy):
            raise ConfigError(f"a request's policy must be a Policy object or None, got {self.policy!r}")

    @property
    def scores_prompt(self) -> bool:
        """It asked for its prompt's log-probabilities: every prompt position's logits are read."""
        return self.config.prompt_logprobs is not None

    @property
    def reuses_prefix(self) -> bool:
        """It may start from a cached prefix: it caches prompts, and does not need every prompt position's logits."""
        return self.cache_prompt and not self.scores_prompt


def check_drafter(request: Any, target: Any) -> None:
    """Raise ``ConfigError`` for what is not a :class:`Request`, or one whose drafter cannot do what it asks: a
    drafter a pipeline made for another target than ``target`` (its drafts would index another vocabulary, or caches
    of another model), a prediction for a drafter that does not copy it, SpecDec++'s head for drafts without the
    draft model's hidden states (it would judge none)."""
    if not isinstance(request, Request):
        raise ConfigError(f"an engine takes a Request (prompt token ids, a config, a drafter), got {request!r}")
    drafter, spec = request.drafter, request.config.policy_spec
    if drafter.made_for not in (None, target):
        raise ConfigError("the request's drafter was made for another target model: take this pipeline's drafter")
    if request.prediction_ids and not drafter.follows_predictions:
        copiers = ", ".join(name for name in DRAFTERS.names() if DRAFTERS.get(name).follows_predictions)
        raise ConfigError(f"a predicted output needs a drafter that copies it: {copiers}", "prediction")
    if spec.kind.needs_acceptance_head and drafter.proposes_drafts and not drafter.drafts_hidden_states:
        judged = ", ".join(name for name in DRAFTERS.names() if DRAFTERS.get(name).drafts_hidden_states)
        message = f"the {spec} policy judges drafts by the draft model's hidden states: use a drafter that has them"
        raise ConfigError(f"{message} ({judged})", "drafter")


def token_ids(ids: Any, what: str = "prompt_ids") -> tuple[int, ...]:
    """``ids`` as a tuple of token ids (non-negative ints; a 1-D tensor or array of them too): ``PromptError`` for
    anything else (text, bytes, booleans, floats, nested lists, a batch of prompts)."""
    if isinstance(ids, torch.Tensor | np.ndarray):
        if ids.ndim != 1:
            raise PromptError(f"{what} must be one sequence of token ids, got an array of shape {tuple(ids.shape)}")
        ids = ids.tolist()
    if isinstance(ids, str | bytes | Mapping) or not isinstance(ids, Sequence):
        raise PromptError(f"{what} must be a sequence of token ids (ints), got {type(ids).__name__}")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int | np.integer) or token < 0:
            raise PromptError(f"{what} must hold token ids: non-negative ints, got {token!r}")
    return tuple(int(token) for token in ids)


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]  # new tokens only, an end-of-sequence token included
    finish_reason: str  # "eos" | "length" | "stop" | "cancelled"
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # when asked (config.logprobs): one per new token of the text
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it, else None
    prompt_logprobs: list[TokenLogprob] | None = None  # when asked: one per prompt token after the first


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a step committed for a request, and the text that became final with them (may be empty)."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # when the request asked: one per token whose text became visible
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # when the request asked, with its first delta: the prompt's


@dataclass(frozen=True)
class RequestFinished:
    """The request ended (end of sequence, a stop string, its token budget, or ``cancelled``)."""

    result: GenerationResult


class FailureCause(enum.Enum):
    """Why a request could not finish."""

    SERVER = "server"  # a fault of the server (a step that raised)
    REQUEST = "request"  # the request's own (a grammar its tokenizer cannot follow)
    STOPPING = "stopping"  # the server stopped before it finished


@dataclass(frozen=True)
class RequestFailed:
    """The request could not go on; the others go on."""

    message: str
    cause: FailureCause = FailureCause.SERVER


Event = TokenDelta | RequestFinished | RequestFailed
Sink = Callable[[Event], None]  # called on the engine's thread: hand the event over, do not block
GREEDY = SamplingParams(temperature=0.0)  # a prompt token's log-probability is the model's own: it was not sampled


@dataclass(eq=False)
class RequestState:
    """A submitted request's state from its submission: the committed tokens, its policy's and decoder's state."""

    request: Request
    sink: Sink
    policy: Policy
    generator: torch.Generator  # unseeded sampling draws from it; seeded, from position noise
    decoder: IncrementalDecoder
    committed: list[int]  # prompt + new tokens; the target's cache holds all but the last once prefilled
    new_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the new tokens, if the request asked
    logprobs_sent: int = 0  # of them, those handed out: the tokens whose text is visible
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # of the prompt's tokens, if the request asked
    prompt_logprobs_sent: bool = False
    constraint: Constraint | None = None  # its place in the grammar its output must follow (config.grammar)
    eos_token_ids: frozenset[int] = frozenset()  # the model's end-of-sequence tokens
    end_token_ids: frozenset[int] = field(init=False)  # the tokens that end its answer (GenerationConfig's)
    stats: GenerationStats = field(default_factory=GenerationStats)
    submitted: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if not callable(self.sink):
            raise ConfigError(f"a request's sink must be a function that takes its events, got {self.sink!r}")
        self.end_token_ids = self.request.config.end_token_ids(self.eos_token_ids)

    @property
    def prompt_length(self) -> int:
        return len(self.request.prompt_ids)

    def result(self, finish_reason: str) -> GenerationResult:
        """The request's result as it ends for ``finish_reason``: the log-probabilities handed out, if asked; its
        ``stop_reason`` the stop string the decoder found, or the last token where it is one of the request's stop
        tokens and not an end-of-sequence token the request heeds (that one ends an answer anyway: vLLM's null)."""
        config, last = self.request.config, self.new_token_ids[-1] if self.new_token_ids else None
        stop_reason: str | int | None = self.decoder.stopped_by if finish_reason == "stop" else None
        heeded_eos = last in self.eos_token_ids and not config.ignore_eos
        if finish_reason == "eos" and last in config.stop_token_ids and not heeded_eos:
            stop_reason = last
        logprobs = self.logprobs[: self.logprobs_sent] if config.logprobs is not None else None
        prompt_logprobs = self.prompt_logprobs if config.prompt_logprobs is not None else None
        return GenerationResult(
            self.decoder.text, self.new_token_ids, finish_reason, self.stats, logprobs, stop_reason, prompt_logprobs
        )

    def delta(self, text: str, token_ids: Sequence[int], final: bool = False) -> TokenDelta:
        """A delta of these committed tokens and the text now final, with the log-probabilities now visible and,
        in the first delta, the prompt's. A request that scores its prompt gets every new token's at the end, an
        end-of-sequence token's too (as vLLM gives them to echoed completions: an evaluation reads the last one)."""
        prompt = () if self.prompt_logprobs_sent else tuple(self.prompt_logprobs)
        self.prompt_logprobs_sent = True
        return TokenDelta(
            text, tuple(token_ids), self.take_visible_logprobs(final and self.request.scores_prompt), prompt
        )

    def target_choice(
        self, draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """A step's drafts ``[1, γ]`` (their distributions ``[1, γ, V]`` or None) and the target's logits
        ``[γ + 1, V]`` as this request chooses its tokens: the drafts its grammar allows, and the logits its grammar
        masks (``GrammarDeadEnd`` where it allows nothing), its bias and penalties adjust, and its ``min_tokens``
        rids of its end tokens where the answer cannot end yet (:mod:`quickdraft.lossless.adjustments`)."""
        draft_token_ids, draft_probs, target_logits = constrain_step(
            self.constraint, draft_token_ids, draft_probs, target_logits
        )
        adjustments = self.request.config.adjustments
        draft_ids = draft_token_ids[0].tolist() if adjustments.penalizes else ()
        prompt = self.prompt_tokens if adjustments.repetition_penalty != 1 else ()
        adjusted = adjust_logits(adjustments, target_logits, prompt, self.new_token_ids, draft_ids)
        early_rows = self.request.config.min_tokens - len(self.new_token_ids)  # rows whose token cannot end it
        if early_rows > 0 and self.end_token_ids:
            adjusted = mask_ends(adjusted, early_rows, self.end_token_ids)
        return draft_token_ids, draft_probs, adjusted

    @functools.cached_property
    def prompt_tokens(self) -> torch.Tensor:
        """The prompt's distinct tokens ``[P']``, found once (a repetition penalty reads them every step)."""
        return prompt_tokens(self.request.prompt_ids)

    def take_visible_logprobs(self, every: bool = False) -> tuple[TokenLogprob, ...]:
        """The log-probabilities not handed out yet of the tokens whose text is now visible
        (:meth:`IncrementalDecoder.visible_tokens`): a stop string's tokens and an end-of-sequence token never are;
        ``every``: of all the tokens committed."""
        if len(self.logprobs) == self.logprobs_sent:  # none asked for, or none new: no pass over the text
            return ()
        shown = len(self.logprobs) if every else self.decoder.visible_tokens()
        visible = max(self.logprobs_sent, min(len(self.logprobs), shown))
        taken, self.logprobs_sent = tuple(self.logprobs[self.logprobs_sent : visible]), visible
        return taken


@dataclass(eq=False, kw_only=True)
class RunningRequest(RequestState):
    """An admitted request: its state, with the caches it runs on, from admission until it ends."""

    cache: KVCache  # the target's
    draft_state: DraftState  # the drafter's state of this request
    prefilled: int = 0  # prompt tokens the target has read
    confidence_step: int = 0  # the engine's step at which its policy last heard the target's confidence
    finished: bool = False  # it ended (its caches are released or kept for a later request)

    @classmethod
    def admit(cls, state: RequestState, cache: KVCache, prefilled: int, draft_state: DraftState) -> RunningRequest:
        """``state`` running on ``cache`` (holding its first ``prefilled`` prompt tokens) and ``draft_state``."""
        fields = {name: getattr(state, name) for name, spec in RequestState.__dataclass_fields__.items() if spec.init}
        return cls(**fields, cache=cache, draft_state=draft_state, prefilled=prefilled)

    def read_prompt(self, chunk_logits: torch.Tensor, n: int) -> torch.Tensor:
        """The target read ``n`` more prompt tokens, whose logits are ``chunk_logits`` (``[n, V]`` where the request
        asked for prompt log-probabilities, else the last row's ``[1, V]``): each position's log-probability of the
        prompt token after it, the model's own (none for the first prompt token); the last row ``[1, V]``."""
        top = self.request.config.prompt_logprobs
        if top is not None:  # positions prefilled .. prefilled + n - 1 predict the prompt tokens after them
            following = self.request.prompt_ids[self.prefilled + 1 : self.prefilled + n + 1]
            self.prompt_logprobs.extend(token_logprobs(chunk_logits, following, GREEDY, top))
        self.prefilled += n
        return chunk_logits[-1:]

    @property
    def decoding(self) -> bool:
        """The prompt is read and the first token committed: the request takes part in draft-and-verify steps."""
        return self.prefilled == self.prompt_length and bool(self.new_token_ids)


def request_policy(request: Request, between_steps: Callable[[], AbstractContextManager[None]]) -> Policy:
    """The request's policy by its config; a drafter that never drafts gets plain steps whatever the policy. A policy
    that plans with measured costs gets them ready first, measured within the engine's ``between_steps`` (no step
    runs forwards meanwhile; a policy whose drafter has no costs raises ``ConfigError``)."""
    drafter = request.drafter
    if not drafter.proposes_drafts:
        return FixedPolicy(0)
    spec = request.config.policy_spec
    if spec.kind.needs_cost_model and drafter.records.costs_needed(request.config.max_draft_tokens):
        with between_steps():
            drafter.records.ready_costs(request.config.max_draft_tokens)
    return spec.build(drafter.records.policy_context(request.config))


CONFIDENCE_ROWS_PER_STEP = 4  # requests whose policy hears the target's confidence in a step


def hear_confidence(rows: list[tuple[RunningRequest, torch.Tensor]], step: int) -> None:
    """The policies of these requests, whose tokens were chosen without drafts, hear the target's top probability
    at their ``[1, V]`` logits if they want it: at most :data:`CONFIDENCE_ROWS_PER_STEP` a step, those that
    heard it longest ago first (each is a pass of exp over the vocabulary, for an estimate that only steadies
    over many steps anyway)."""
    rows = [(state, logits) for state, logits in rows if state.policy.wants_confidence()]
    rows = sorted(rows, key=lambda row: row[0].confidence_step)[:CONFIDENCE_ROWS_PER_STEP]
    for state, logits in rows:
        state.confidence_step = step
        state.policy.observe_confidence(float(top_probability(logits)))
