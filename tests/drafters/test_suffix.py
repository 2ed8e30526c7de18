"""The suffix drafter: its counts against a scan of the sequences (the oracle), adaptive length, the global index
across requests and its bound."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from quickdraft.drafters import suffix
from quickdraft.drafters.suffix import MAX_MATCH, MIN_MATCH, FollowerCounts, SuffixDrafter, SuffixState


def scanned_followers(sequences: list[list[int]], ngram: tuple[int, ...]) -> Counter[int]:
    """Which token followed ``ngram`` how often in ``sequences``: every position looked at."""
    found: Counter[int] = Counter()
    for tokens in sequences:
        for end in range(len(ngram), len(tokens)):
            if tuple(tokens[end - len(ngram) : end]) == ngram:
                found[tokens[end]] += 1
    return found


@settings(max_examples=60, deadline=None)
@given(
    sequences=st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=30), min_size=1, max_size=4),
    cut=st.integers(0, 30),
)
def test_counts_equal_a_scan_whether_added_at_once_in_parts_or_added_and_removed(sequences, cut) -> None:
    whole, parts = FollowerCounts(), FollowerCounts()
    for tokens in sequences:
        whole.add(tokens)
        parts.add(tokens[:cut])
        parts.add(tokens, start=min(cut, len(tokens)))
    extra = [0, 1, 2, 3, 0, 1, 2, 3]
    whole.add(extra)
    whole.add(extra, sign=-1)  # evicted again: nothing of it may remain
    for n in range(MIN_MATCH, MAX_MATCH + 1):
        ngrams = {tuple(t[i : i + n]) for t in sequences for i in range(len(t) - n)}
        for ngram in ngrams:
            expected = +scanned_followers(sequences, ngram)
            assert Counter(whole.followers(ngram)[0]) == expected == Counter(parts.followers(ngram)[0]), ngram
    assert set(whole.counts) == set(parts.counts) and set(whole.latest) == set(whole.counts)


def test_the_most_frequent_follower_is_drafted_for_as_long_as_the_match() -> None:
    drafter = SuffixDrafter()
    state = SuffixState()
    state.catch_up([5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7, 8, 3, 4, 5, 6, 7])
    # after (5, 6, 7): 8 twice, 9 once; the longest match (4, 5, 6, 7) is unseen, so 3 tokens match: 3 drafts at most
    assert drafter.continuation(state, 16)[:1] == [8]
    assert len(drafter.continuation(state, 16)) <= 3


def test_unlikely_continuations_stop_the_draft(monkeypatch) -> None:
    state = SuffixState()
    state.catch_up([token for follower in range(3, 14) for token in (1, 2, follower)] + [1, 2])
    assert SuffixDrafter().continuation(state, 8) == []  # each of (1, 2)'s 11 followers has a share of 1/11 < 0.1
    monkeypatch.setattr(suffix, "MIN_PROBABILITY", 0.05)
    assert SuffixDrafter().continuation(state, 8) == [13, 1]  # the latest of equals; 2 matched tokens, 2 drafts


def test_earlier_answers_draft_for_later_requests_within_a_bound(monkeypatch) -> None:
    drafter = SuffixDrafter()
    answer = [40, 41, 42, 43, 44, 45, 46, 47]
    first = SuffixState(prompt_length=3)
    first.catch_up([1, 2, 3, *answer])
    drafter.finish(first)
    later = SuffixState(prompt_length=4)
    later.catch_up([9, 9, 40, 41, 42])  # a new request that starts repeating the earlier answer
    assert drafter.continuation(later, 4) == [43, 44, 45]  # 3 matched tokens, at most 3 drafts
    monkeypatch.setattr(suffix, "GLOBAL_TOKENS", 12)
    for offset in range(3):  # newer answers push the first out of the bound
        other = SuffixState(prompt_length=1)
        other.catch_up([0, *(100 * (offset + 1) + i for i in range(8))])
        drafter.finish(other)
    assert drafter.kept_tokens <= 12 and drafter.continuation(later, 4) == []
    drafter.forget()
    assert not drafter.answers.counts
