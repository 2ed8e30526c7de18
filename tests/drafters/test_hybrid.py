"""The hybrid drafter: copies from the context where it repeats, the draft model elsewhere, per request."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import draft_task

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.drafters.draft_model import DraftModelState
from quickdraft.drafters.hybrid import COPIES, SUFFIX_COPIES, HybridDrafter, HybridState, HybridSuffixDrafter
from quickdraft.errors import ConfigError
from quickdraft.policies import Offer

PROMPTS = [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [7] * 12, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def hybrid(pipeline: Pipeline, **options: int) -> HybridDrafter:
    drafter = DRAFTERS.get("hybrid").create(pipeline.target, pipeline.draft, DrafterOptions(**options))
    assert isinstance(drafter, HybridDrafter)
    return drafter


def start(drafter: HybridDrafter, context: list[int]) -> HybridState:
    state = drafter.start(context, target_cache=None)  # type: ignore[arg-type]
    assert isinstance(state, HybridState) and isinstance(state.model, DraftModelState)
    return state


def test_copies_after_a_repeated_ngram_at_no_cost(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    context = [5, 6, 7, 8, 9, 1, 5, 6]  # "5 6" occurred before, followed by 7 8 9 1 5 6
    state = start(drafter, context)
    copies, model = drafter.offers(state, context)
    assert copies == Offer(COPIES, max_tokens=6, free=True)
    assert model.backlog == len(context) and model.batched  # what the model would read first, if a policy chose it
    (proposal,) = drafter.propose([draft_task(state, context, 3)])
    assert proposal.token_ids.tolist() == [[7, 8, 9]] and proposal.probs is None  # one-hot q
    assert state.model.conversation.cached_ids == []  # the draft model reads nothing for a copy
    (declined,) = drafter.propose([draft_task(state, context, 3, SamplingParams(temperature=1.0), offer=model)])
    assert declined.token_ids.shape == (1, 3) and declined.probs is not None  # the model drafted instead: its q


def test_a_single_repeated_token_is_not_copied(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)  # the default: a match of 2 tokens at least
    context = [5, 6, 7, 8, 9, 1, 5]
    state = start(drafter, context)
    assert drafter.offers(state, context) == (
        Offer(COPIES, max_tokens=0, free=True),  # offered every step, with nothing this time
        Offer("model", backlog=len(context), batched=True, judged=True),  # the draft model reads the context first
    )
    one_token = hybrid(pipeline, hybrid_min_ngram=1)
    assert one_token.offers(start(one_token, context), context)[0].max_tokens == 6


def test_without_a_match_the_draft_model_drafts(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    context = [3, 1, 4, 15, 9, 2, 6]
    state = start(drafter, context)
    sampling, generator = SamplingParams(temperature=1.0), torch.Generator().manual_seed(0)
    (proposal,) = drafter.propose([draft_task(state, context, 3, sampling, generator)])
    assert proposal.token_ids.shape == (1, 3) and proposal.probs is not None  # the draft's q  [1, γ, V]
    assert state.model.conversation.cached_ids == context + proposal.token_ids[0, :2].tolist()


def test_requests_that_copy_and_requests_that_draft_share_a_step(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    copying, drafting = [5, 6, 7, 8, 9, 1, 5, 6], [3, 1, 4, 15, 9, 2, 6]
    sampled = SamplingParams(temperature=1.0)  # unseeded: a model's drafts keep their q, copies are one-hot
    tasks = [draft_task(start(drafter, context), context, 2, sampled) for context in (drafting, copying, drafting)]
    proposals = drafter.propose(tasks)
    assert proposals[1].token_ids.tolist() == [[7, 8]] and proposals[1].probs is None
    assert proposals[0].probs is not None and torch.equal(proposals[0].token_ids, proposals[2].token_ids)


def test_hybrid_ngram_size_is_checked() -> None:
    with pytest.raises(ConfigError, match="n-gram"):
        DrafterOptions(hybrid_min_ngram=0)
    bad = [({"prompt_lookup_max_ngram": "3"}, "must be an integer"), ({"hybrid_min_ngram": 1.5}, "must be an integer"),
           ({"prompt_lookup_min_ngram": True}, "must be an integer"), ({"draft_head": 5}, "a file's path"),
           ({"vocabulary_bridge": "x"}, "VocabularyBridge"),
           ({"prompt_lookup_max_ngram": 10**9}, "at most 16"),  # its index held every size: out of memory
           ({"hybrid_min_ngram": 17}, "at most 16")]  # fmt: skip
    for options, words in bad:
        with pytest.raises(ConfigError, match=words):
            DrafterOptions(**options)


def test_greedy_hybrid_under_goodput_equals_plain(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=24)
    for prompt_ids in PROMPTS:
        plain = pipeline.generate(prompt_ids, config, drafter="none")
        result = pipeline.generate(prompt_ids, config, drafter="hybrid")  # the default policy: goodput
        assert result.token_ids == plain.token_ids


def test_a_new_request_gets_its_own_copies(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    first, second = [5, 6, 7, 8, 5, 6], [1, 6, 2, 3, 1, 6]  # same length and last token
    assert start(drafter, first).copies.after(first) == [7, 8, 5, 6]
    assert start(drafter, second).copies.after(second) == [2, 3, 1, 6]


def test_the_hybrid_shares_the_draft_models_calibration(pipeline: Pipeline, tmp_path: Path) -> None:
    store = replace(pipeline, target_path=tmp_path / "target", draft_path=tmp_path / "draft").calibrations
    assert store.cost_model_file(DRAFTERS.get("hybrid")) == store.cost_model_file(DRAFTERS.get("draft-model"))
    assert store.cost_model_file(DRAFTERS.get("hybrid")) != store.cost_model_file(DRAFTERS.get("prompt-lookup"))


def test_hybrid_suffix_copies_what_earlier_answers_said(pipeline: Pipeline) -> None:
    """A context with nothing to copy from itself gets the continuation an earlier request's answer had, as a free
    offer of its own source; finishing a request is what adds its answer."""
    drafter = DRAFTERS.get("hybrid-suffix").create(pipeline.target, pipeline.draft, DrafterOptions())
    assert isinstance(drafter, HybridSuffixDrafter)
    earlier_prompt, earlier_answer = [40, 41], [1, 2, 3, 4, 5, 6]
    earlier = start(drafter, earlier_prompt)
    earlier.copies.after(earlier_prompt + earlier_answer)  # the request's context as its last step saw it
    context = [9, 8, 1, 2]
    assert drafter.offers(start(drafter, context), context)[0] == Offer(SUFFIX_COPIES, max_tokens=0, free=True)
    drafter.finish(earlier)
    state = start(drafter, context)
    copies, _ = drafter.offers(state, context)
    assert copies.source == SUFFIX_COPIES and copies.free and copies.max_tokens
    assert state.copies.after(context) == [3, 4][: copies.max_tokens]
    task = draft_task(state, context, copies.max_tokens, offer=copies)
    assert drafter.propose([task])[0].token_ids[0].tolist() == [3, 4][: copies.max_tokens]
    drafter.forget()
    assert not start(drafter, context).copies.after(context)


def test_greedy_hybrid_suffix_equals_plain_across_requests(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=24)
    for prompt_ids in PROMPTS * 2:  # the second round finds the first round's answers
        plain = pipeline.generate(prompt_ids, config, drafter="none")
        assert pipeline.generate(prompt_ids, config, drafter="hybrid-suffix").token_ids == plain.token_ids
