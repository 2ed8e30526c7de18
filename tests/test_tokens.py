"""Token utilities."""

from __future__ import annotations

from quickdraft.tokens import common_prefix_length


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3  # a cache trailing the context
    assert common_prefix_length([1, 2, 9, 9], [1, 2, 3]) == 2  # rejected drafts in the cache
    assert common_prefix_length([], [1]) == 0 and common_prefix_length([5], [6]) == 0
