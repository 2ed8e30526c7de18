"""Frozen, validated settings of one generation request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quickdraft.errors import ConfigError, PromptError
from quickdraft.grammar import GrammarSpec
from quickdraft.lossless.adjustments import LogitAdjustments
from quickdraft.lossless.sampling import SamplingParams, as_python, is_int
from quickdraft.policies import MAX_DRAFT_TOKENS, PolicySpec, parse_policy
from quickdraft.prompts import require_utf8

__all__ = ["DEFAULT_NUM_DRAFT_TOKENS", "DEFAULT_POLICY", "GenerationConfig", "LogitAdjustments", "SamplingParams"]


DEFAULT_POLICY = "goodput"
DEFAULT_NUM_DRAFT_TOKENS = 4
MAX_LOGPROBS = 20  # the most likeliest tokens listed beside each new token (OpenAI's limit)


SCALARS = ("max_new_tokens", "num_draft_tokens", "max_draft_tokens", "logprobs", "min_tokens", "prompt_logprobs",
           "ignore_eos")  # fmt: skip  # fields a NumPy scalar may be given for


@dataclass(frozen=True)
class GenerationConfig:
    """One request: how many tokens, how drafts per step are chosen, sampling and stop strings.

    The policy defaults to ``goodput`` (γ per step from measured costs and the observed acceptance),
    except that a request which gives ``num_draft_tokens`` without a policy asked for that many
    drafts per step and gets ``fixed``. Both fields hold the resolved values after construction:
    ``policy`` is parsed here, once, into a :class:`PolicySpec` (its text is ``str(config.policy)``). A policy
    that carries its own γ (``fixed:K``) or reads none (``goodput``) goes before ``num_draft_tokens``, so
    ``replace(config, policy="fixed:0")`` is plain decoding whatever γ the config held; the CLI notes such an unused
    ``--num-draft-tokens`` and the server refuses it.
    """

    max_new_tokens: int = 256
    num_draft_tokens: int | None = None  # γ of the fixed policy; where the heuristic policy starts (default 4)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    policy: PolicySpec | str | None = None  # fixed[:K], heuristic, confidence[:T], goodput, specdec++[:T] (see above)
    max_draft_tokens: int = 16  # the largest γ an adaptive policy may choose
    logprobs: int | None = None  # None: none; K: each new token's log-probability and the K likeliest (K <= 20)
    grammar: GrammarSpec | None = None  # structured output: the grammar every answer follows
    adjustments: LogitAdjustments = field(default_factory=LogitAdjustments)  # logit bias and penalties
    # vLLM's: before min_tokens new tokens the answer cannot end (its end tokens masked, stop strings not looked
    # for); ignore_eos: the end-of-sequence tokens do not end it; stop_token_ids: tokens that end it as they do
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # vLLM's: each prompt token's log-probability (the model's own) and the K likeliest at its position (K <= 20)
    prompt_logprobs: int | None = None
    # special tokens whose text the answer keeps (a tool format's markers, its calls read from them); the others have
    # none, as skip_special_tokens has it
    kept_special_tokens: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):  # one stop string, as OpenAI's stop takes it (not one per character)
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop, tuple):
            raise ConfigError(f"stop must be a string or a tuple of strings, got {self.stop!r}", "stop")
        for name in SCALARS:  # a NumPy scalar as the Python value it holds
            object.__setattr__(self, name, as_python(getattr(self, name)))
        if not isinstance(self.sampling, SamplingParams):
            raise ConfigError(f"sampling must be a SamplingParams, got {self.sampling!r}", "sampling")
        if self.policy is None:
            object.__setattr__(self, "policy", "fixed" if self.num_draft_tokens is not None else DEFAULT_POLICY)
        if self.num_draft_tokens is None:
            object.__setattr__(self, "num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS)
        if not is_int(self.max_new_tokens) or self.max_new_tokens <= 0:
            raise ConfigError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}", "max_new_tokens"
            )
        if not is_int(self.num_draft_tokens) or not 0 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            message = f"num_draft_tokens must be an integer in [0, {MAX_DRAFT_TOKENS}], got {self.num_draft_tokens!r}"
            raise ConfigError(message, "num_draft_tokens")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop strings must be non-empty strings, got {self.stop!r}", "stop")
        for text in self.stop:  # an answer is UTF-8 text: a stop string that is not could never match
            try:
                require_utf8(text, "a stop string")
            except PromptError:
                never = "an answer never holds a lone surrogate or an undecodable byte"
                raise ConfigError(f"stop strings must be UTF-8 text ({never}), got {self.stop!r}", "stop") from None
        if not is_int(self.max_draft_tokens) or self.max_draft_tokens < 1:
            raise ConfigError(
                f"max_draft_tokens must be an integer >= 1, got {self.max_draft_tokens!r}", "max_draft_tokens"
            )
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            message = f"logprobs must be an integer in [0, {MAX_LOGPROBS}] (the likeliest tokens to list)"
            raise ConfigError(f"{message}, got {self.logprobs!r}", "logprobs")
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            limit = f"[0, {self.max_new_tokens}]: at most the answer's token limit"
            message = f"min_tokens must be an integer in {limit}, got {self.min_tokens!r}"
            raise ConfigError(message, "min_tokens")
        require_bool(self.ignore_eos, "ignore_eos")
        if isinstance(self.stop_token_ids, tuple | list):
            object.__setattr__(self, "stop_token_ids", tuple(as_python(token) for token in self.stop_token_ids))
        if not isinstance(self.stop_token_ids, tuple) or not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            message = f"stop_token_ids must be a list of token ids (ints >= 0), got {self.stop_token_ids!r}"
            raise ConfigError(message, "stop_token_ids")
        prompt_top = self.prompt_logprobs
        if prompt_top is not None and (not is_int(prompt_top) or not 0 <= prompt_top <= MAX_LOGPROBS):
            message = f"prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] (the likeliest tokens to list)"
            raise ConfigError(f"{message}, got {prompt_top!r}", "prompt_logprobs")
        if isinstance(self.kept_special_tokens, list):  # kept as a tuple, as stop is: a config is hashable
            object.__setattr__(self, "kept_special_tokens", tuple(self.kept_special_tokens))
        kept = self.kept_special_tokens
        if not isinstance(kept, tuple) or not all(isinstance(text, str) and text for text in kept):
            message = f"kept_special_tokens must be a list of token texts, got {kept!r}"
            raise ConfigError(message, "kept_special_tokens")
        if self.ignore_eos and self.grammar is not None:
            message = "a grammar's answer ends at the end-of-sequence token: ignore_eos cannot go with one"
            raise ConfigError(message, "ignore_eos")
        if not isinstance(self.adjustments, LogitAdjustments):
            raise ConfigError(f"adjustments must be a LogitAdjustments, got {self.adjustments!r}", "adjustments")
        if self.grammar is not None and not isinstance(self.grammar, GrammarSpec):
            raise ConfigError(f"grammar must be a GrammarSpec, got {self.grammar!r}", "grammar")
        if isinstance(self.policy, str):
            try:
                object.__setattr__(self, "policy", parse_policy(self.policy))
            except ConfigError as error:
                raise ConfigError(str(error), "policy") from None
        if not isinstance(self.policy, PolicySpec):
            raise ConfigError(f"policy must be a name such as 'fixed' or 'goodput', got {self.policy!r}", "policy")

    def end_token_ids(self, eos_token_ids: frozenset[int]) -> frozenset[int]:
        """The tokens that end this request's answer, given the model's end-of-sequence tokens."""
        return (frozenset() if self.ignore_eos else eos_token_ids) | frozenset(self.stop_token_ids)

    @property
    def policy_spec(self) -> PolicySpec:
        """The parsed policy (``policy`` after construction, typed)."""
        assert isinstance(self.policy, PolicySpec)
        return self.policy


def require_bool(value: Any, name: str) -> None:
    """``value`` is True or False: a string such as "no" would read as true, an int is no flag."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}", name)
