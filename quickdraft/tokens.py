"""Token-sequence utilities shared by drafters, the pipeline and the bench."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (a cache against the committed tokens, two prompts)."""
    shorter = min(len(a), len(b))
    if list(a[:shorter]) == list(b[:shorter]):  # the usual case (the cache trails the committed tokens), compared in C
        return shorter
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
