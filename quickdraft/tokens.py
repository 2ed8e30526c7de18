"""Token-sequence utilities shared by drafters, the pipeline and the bench."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (a cache against the committed tokens, two prompts)."""
    shorter = min(len(a), len(b))
    if list(a[:shorter]) == list(b[:shorter]):  # the usual case (the cache trails the committed tokens), compared in C
        return shorter
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


def frequent_tokens(tokenizer: Any, count: int) -> tuple[int, ...]:
    """The ``count`` lowest token ids, which a BPE tokenizer gives its earliest, most frequent merges (FR-Spec's
    frequency-ranked vocabulary without a corpus), plus every special and added token (end of turn, ...)."""
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return tuple(sorted(set(range(min(count, len(tokenizer)))) | special))
