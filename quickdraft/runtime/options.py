"""How a draft model is loaded: weights and vocabulary traded for speed, never for output."""

from __future__ import annotations

from typing import Any

import torch

from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import is_int
from quickdraft.runtime.base import LoadOptions, Runtime
from quickdraft.runtime.device import CPU
from quickdraft.runtime.names import DRAFT_VOCABULARY, DRAFT_WEIGHTS, WEIGHT_FORMATS
from quickdraft.tokens import frequent_tokens


def draft_load_defaults(weights: str | None, vocabulary: int | None) -> tuple[str, int]:
    """The draft model's weight format and vocabulary size as asked for, else :data:`DRAFT_WEIGHTS` and
    :data:`DRAFT_VOCABULARY`."""
    return (DRAFT_WEIGHTS if weights is None else weights, DRAFT_VOCABULARY if vocabulary is None else vocabulary)


def draft_load_options(
    runtime_class: type[Runtime],
    tokenizer: Any,
    weights: str | None,
    vocabulary: int | None,
    device: torch.device = CPU,
    role: str = "draft",
) -> LoadOptions:
    """The draft model's load options on ``device``: what was asked for, else :data:`DRAFT_WEIGHTS` and
    :data:`DRAFT_VOCABULARY` where the runtime takes load options (a runtime that does not refuses what was asked
    for explicitly). ``role`` "": a model loaded as a draft model is, on its own (``profile``), its settings named
    ``weights`` and ``vocabulary``."""
    prefix, model = (f"{role}_", f"the {role} model") if role else ("", "the model")
    if weights is not None and weights not in WEIGHT_FORMATS:
        message = f"unknown {prefix}weights {weights!r}; choose one of: {', '.join(WEIGHT_FORMATS)}"
        raise ConfigError(message, f"{prefix}weights")
    if vocabulary is not None and (not is_int(vocabulary) or vocabulary < 0):
        message = f"{prefix}vocabulary is a number of tokens >= 0 (0: all), got {vocabulary!r}"
        raise ConfigError(message, f"{prefix}vocabulary")
    if vocabulary is not None and vocabulary > len(tokenizer):  # the default is what the model has, at most
        raise ConfigError(
            f"{prefix}vocabulary {vocabulary} is larger than {model}'s vocabulary of {len(tokenizer)} tokens: give "
            f"at most that many (0: all)",
            f"{prefix}vocabulary",
        )
    if not runtime_class.takes_load_options:  # what was asked for explicitly is refused, by its own name
        kept = {"weights": LoadOptions().weights, "vocabulary": 0}  # what such a runtime does anyway
        for name, value in (("weights", weights), ("vocabulary", vocabulary)):
            if value is not None and value != kept[name]:
                message = f"{prefix}{name} {value!r} needs the native runtime: the {runtime_class.name} runtime runs "
                raise ConfigError(message + f"{model}'s own weights over its whole vocabulary", f"{prefix}{name}")
        return LoadOptions(device=device)
    weights, vocabulary = draft_load_defaults(weights, vocabulary)
    return LoadOptions(weights, frequent_tokens(tokenizer, vocabulary) if vocabulary else None, device)
