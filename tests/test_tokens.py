"""Token utilities."""

from __future__ import annotations

from quickdraft.tokens import common_prefix_length, frequent_tokens


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3  # a cache trailing the context
    assert common_prefix_length([1, 2, 9, 9], [1, 2, 3]) == 2  # rejected drafts in the cache
    assert common_prefix_length([], [1]) == 0 and common_prefix_length([5], [6]) == 0


def test_frequent_tokens_are_the_lowest_ids_and_every_special_token() -> None:
    from conftest import word_tokenizer

    tokenizer = word_tokenizer(64)  # end of sequence: id 63
    assert frequent_tokens(tokenizer, 5) == (0, 1, 2, 3, 4, 63)
    assert frequent_tokens(tokenizer, 1000) == tuple(range(64))
