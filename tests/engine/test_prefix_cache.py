"""Prefix caching: finished requests' caches taken over by prompts that start alike, bit for bit the same output."""

from __future__ import annotations

import pytest
import torch
from conftest import native_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.engine import Engine, Request, generate
from quickdraft.engine.prefix_cache import PrefixCache
from quickdraft.errors import ConfigError


class FakeCache:
    def __init__(self, length: int) -> None:
        self.length = length

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([self.length])

    def truncate(self, length: int) -> None:
        assert 0 <= length <= self.length
        self.length = length


def copy(cache: FakeCache, length: int) -> FakeCache:
    assert 0 <= length <= cache.length
    return FakeCache(length)


def test_a_conversations_next_turn_takes_its_cache_over_and_other_prompts_get_a_copy() -> None:
    store = PrefixCache(budget_bytes=1000, entry_bytes=lambda n: 10 * n, copy_prefix=copy, min_tokens=2)  # type: ignore[arg-type]
    short, long = FakeCache(4), FakeCache(6)
    store.put([1, 2, 3, 4], short)  # type: ignore[arg-type]
    store.put([1, 2, 3, 9, 9, 9], long)  # type: ignore[arg-type]
    assert store.take([5, 6, 7]) is None  # nothing shared
    assert store.take([1, 2, 3, 4, 8]) == (short, 4) and short.length == 4  # goes on from all of it: taken over
    shared = store.take([1, 2, 3, 4, 8])  # parts from the other entry inside it: a copy of the shared start
    assert shared is not None and shared[0] is not long and shared[1] == 3 and long.length == 6
    again = store.take([1, 2, 3, 9, 9, 9, 5])  # the entry stayed for its own conversation
    assert again == (long, 6)
    assert store.take([1, 2, 3, 4, 8]) is None
    whole = FakeCache(3)
    store.put([1, 2, 3], whole)  # type: ignore[arg-type]
    assert store.take([1, 2, 3]) == (whole, 2)  # the prompt's last token is read again: its logits give the first
    assert (store.stats.lookups, store.stats.hits, store.stats.cached_tokens) == (6, 4, 15)


def test_a_question_after_the_same_system_prompt_leaves_the_other_conversations_alone() -> None:
    """Requests that share only a system prompt with the entries must not use them up (each keeps its own)."""
    store = PrefixCache(budget_bytes=10_000, entry_bytes=lambda n: n, copy_prefix=copy, min_tokens=2)  # type: ignore[arg-type]
    system = [7, 7, 7]
    for question in range(1, 5):  # four conversations, one after another
        store.take([*system, question])
        store.put([*system, question, 0], FakeCache(len(system) + 2))  # type: ignore[arg-type]
    assert len(store._entries) == 4
    for question in range(1, 5):  # each asked again: its own entry's whole prompt is there
        taken = store.take([*system, question])
        assert taken is not None and taken[1] == len(system)


def test_the_oldest_entries_leave_when_the_budget_is_exceeded() -> None:
    store = PrefixCache(budget_bytes=100, entry_bytes=lambda n: 10 * n, copy_prefix=copy, min_tokens=2)  # type: ignore[arg-type]
    for start in range(3):
        store.put([start, 1, 2, 3], FakeCache(4))  # type: ignore[arg-type]
    assert store.tokens == 8 and store.take([0, 1, 2, 3, 4]) is None and store.take([2, 1, 2, 3, 4]) is not None
    store.put(list(range(11)), FakeCache(11))  # type: ignore[arg-type]  # larger than the whole budget: not kept
    assert store.tokens == 4
    with pytest.raises(ConfigError):
        PrefixCache(budget_bytes=-1, entry_bytes=lambda n: 10 * n, copy_prefix=copy)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_pipeline()


def engine(native: Pipeline, cached: bool) -> Engine:
    store = PrefixCache(2**20, native.target.cache_bytes, native.target.copy_prefix, 4) if cached else None
    return Engine(native.target, native.tokenizer, native.eos_token_ids, prefix_cache=store)


@pytest.mark.parametrize(
    ("drafter", "sampling"),
    [
        ("none", SamplingParams()),
        ("draft-model", SamplingParams()),
        ("hybrid", SamplingParams(temperature=0.9, seed=4)),
    ],
)
def test_a_conversations_later_turns_read_only_what_is_new_and_answer_the_same(
    native: Pipeline, drafter: str, sampling: SamplingParams
) -> None:
    config = GenerationConfig(max_new_tokens=10, sampling=sampling, num_draft_tokens=3)
    with_cache, without = engine(native, True), engine(native, False)
    conversation = [3, 1, 4, 1, 5, 9, 2, 6]
    for turn in range(3):
        request = Request(tuple(conversation), config, native.drafter(drafter))
        cached, read = generate(with_cache, request), generate(without, request)
        assert cached.token_ids == read.token_ids, turn  # the same bits with the prefix cached or read
        assert cached.stats.cached_prompt_tokens == (0 if turn == 0 else len(conversation) - 3 - 1), turn
        conversation += [*cached.token_ids, 7, 8, 9]  # the answer and the next user turn


def test_prompts_that_share_a_start_with_an_entry_get_a_copy_that_answers_the_same(native: Pipeline) -> None:
    """Two conversations after one system prompt, each asked again: a copied start gives the same bits, and the
    copy leaves the entry as it was."""
    config = GenerationConfig(max_new_tokens=8, num_draft_tokens=3)
    with_cache, without = engine(native, True), engine(native, False)
    system = [3, 1, 4, 1, 5, 9, 2, 6]
    for question in ([5, 3], [8, 9, 7], [5, 3], [8, 9, 7]):
        request = Request((*system, *question), config, native.drafter("hybrid"))
        cached, read = generate(with_cache, request), generate(without, request)
        assert cached.token_ids == read.token_ids, question
    assert with_cache.prefix_cache is not None and with_cache.prefix_cache.stats.hits == 3
    assert with_cache.prefix_cache.stats.cached_tokens == len(system) + (len(system) + 1) + (len(system) + 2)


def test_runtimes_with_inexact_prefixes_refuse_a_prefix_cache(pipeline: Pipeline) -> None:
    with pytest.raises(ConfigError, match="prefix caching"):
        Engine(
            pipeline.target,
            pipeline.tokenizer,
            pipeline.eos_token_ids,
            prefix_cache=PrefixCache(100, lambda n: 10 * n, copy),
        )  # type: ignore[arg-type]
