"""Prompt lookup: the latest earlier occurrence of the longest suffix n-gram, and what followed it."""

from __future__ import annotations

import random

import pytest
from conftest import draft_task

from quickdraft.drafters.prompt_lookup import NgramIndex, PromptLookupDrafter, lookup_continuation


def test_longest_ngram_wins() -> None:
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 9, 2, 3, 7, 8, 2, 3]
    assert lookup_continuation(tokens, 2, max_ngram=3, min_ngram=1) == [7, 8]  # latest "2 3" is at 5..6


def test_longer_match_preferred_over_more_recent_shorter_one() -> None:
    tokens = [5, 6, 7, 1, 0, 7, 2, 5, 6, 7]
    assert lookup_continuation(tokens, 3, max_ngram=3, min_ngram=1) == [1, 0, 7]


def test_falls_back_to_shorter_ngrams_and_to_nothing() -> None:
    assert lookup_continuation([4, 1, 2, 3, 4], 2, max_ngram=3, min_ngram=1) == [1, 2]
    assert lookup_continuation([4, 1, 2, 3, 4], 2, max_ngram=3, min_ngram=2) == []
    assert lookup_continuation([1, 2, 3], 2, max_ngram=3, min_ngram=1) == []
    assert lookup_continuation([7], 2, max_ngram=3, min_ngram=1) == []


def test_continuation_is_cut_at_the_requested_length_and_context_end() -> None:
    assert lookup_continuation([1, 2, 3, 4, 5, 1, 2], 10, max_ngram=2, min_ngram=1) == [3, 4, 5, 1, 2]
    assert lookup_continuation([8, 8, 8, 8], 3, max_ngram=2, min_ngram=1) == [8]


def test_drafter_proposes_one_hot_tokens_per_request() -> None:
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    copies, none = drafter.propose(
        [draft_task(drafter.start([], None), [1, 2, 3, 1, 2], 2), draft_task(drafter.start([], None), [1, 2, 3], 2)]
    )
    assert copies.token_ids.tolist() == [[3, 1]] and copies.probs is None
    assert none.num_tokens == 0  # one request's lack of a match does not cut another's drafts


@pytest.mark.parametrize("seed", range(4))
def test_the_index_finds_what_the_scan_finds_as_the_context_grows(seed: int) -> None:
    """NgramIndex against lookup_continuation (the oracle) after every token of a growing context, over a small
    vocabulary (many matches, of every n-gram size), and after the context is replaced by another."""
    rng = random.Random(seed)
    index = NgramIndex(max_ngram=3, min_ngram=1 + seed % 2)
    for _ in range(2):  # the second context is another request's: indexed anew
        context: list[int] = []
        for _ in range(300):
            context += [rng.randrange(6)] * rng.choice([1, 1, 2])  # one token a step, or a few accepted at once
            expected = lookup_continuation(context, 5, max_ngram=3, min_ngram=index.min_ngram)
            assert index.continuation(context, 5) == expected, len(context)
