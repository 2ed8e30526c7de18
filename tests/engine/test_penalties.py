"""Logit bias and penalties, and vLLM's min_tokens, ignore_eos and stop_token_ids, through the one engine on tiny
random models: greedy output is the adjusted target's own token for token whatever the drafter and γ, and seeded
output is seeded plain decoding's (the law of sampled output: test_sampling_law.py and test_sampling_law_endings.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from conftest import adjusted_by_hand, answer_text, native_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.errors import ConfigError
from quickdraft.lossless.adjustments import LogitAdjustments

PENALIZED = LogitAdjustments({3: 1.5, 7: -2.0}, presence_penalty=0.6, frequency_penalty=0.3, repetition_penalty=1.2)
PROMPTS = [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]
MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def close_pair() -> Pipeline:
    """A target and a draft that agree often: drafts are accepted, and judged against adjusted rows."""
    return native_pipeline()


def greedy_by_hand(pipeline: Pipeline, prompt_ids: list[int], adjustments: LogitAdjustments) -> list[int]:
    """Plain greedy decoding that reads the whole sequence again for each token, each position's logits adjusted by
    hand: the oracle."""
    answer: list[int] = []
    while len(answer) < MAX_NEW_TOKENS:
        target = pipeline.target
        logits = target.forward(torch.tensor([prompt_ids + answer]), target.new_cache(1), last_only=True)[0, -1]
        adjusted = adjusted_by_hand(adjustments, logits.float().tolist(), prompt_ids, answer)
        answer.append(max(range(len(adjusted)), key=adjusted.__getitem__))
        if answer[-1] in pipeline.eos_token_ids:
            break
    return answer


def test_penalized_greedy_speculation_equals_the_adjusted_target_by_hand(close_pair: Pipeline) -> None:
    accepted = 0
    for prompt_ids in PROMPTS:
        config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, adjustments=PENALIZED)
        expected = greedy_by_hand(close_pair, prompt_ids, PENALIZED)
        assert close_pair.generate(prompt_ids, config, drafter="none").token_ids == expected
        unadjusted = close_pair.generate(prompt_ids, replace(config, adjustments=LogitAdjustments()), "none")
        assert expected != unadjusted.token_ids
        for drafter, gamma in itertools.product(["draft-model", "prompt-lookup", "hybrid"], [1, 3, 6]):
            result = close_pair.generate(prompt_ids, replace(config, num_draft_tokens=gamma), drafter=drafter)
            assert result.token_ids == expected, (prompt_ids, drafter, gamma)
            accepted += result.stats.draft_tokens_accepted
    assert accepted > 0


def test_seeded_penalized_sampling_gives_the_same_tokens_whatever_gamma(close_pair: Pipeline) -> None:
    pipeline = close_pair
    sampling = SamplingParams(temperature=0.9, top_p=0.95, min_p=0.05, seed=7)
    config = GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, sampling=sampling, adjustments=PENALIZED)
    for prompt_ids in PROMPTS:
        plain = pipeline.generate(prompt_ids, config, drafter="none").token_ids
        for drafter, gamma in itertools.product(["draft-model", "hybrid"], [1, 4, 7]):
            result = pipeline.generate(prompt_ids, replace(config, policy=f"fixed:{gamma}"), drafter=drafter)
            assert result.token_ids == plain, (prompt_ids, drafter, gamma)


def test_a_bias_of_minus_100_bans_a_token_and_plus_100_forces_one(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=12, num_draft_tokens=3)
    plain = pipeline.generate(PROMPTS[0], config, drafter="draft-model").token_ids
    banned = plain[0]
    without = pipeline.generate(PROMPTS[0], replace(config, adjustments=LogitAdjustments({banned: -100})))
    assert banned not in without.token_ids
    forced = pipeline.generate(PROMPTS[0], replace(config, adjustments=LogitAdjustments({5: 100})), "draft-model")
    assert set(forced.token_ids) == {5}


def test_a_bias_past_the_vocabulary_is_a_clear_error(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=4, adjustments=LogitAdjustments({pipeline.target.vocab_size: 1}))
    with pytest.raises(ConfigError, match="logit_bias's token ids must be below the vocabulary's size") as error:
        pipeline.generate(PROMPTS[0], config)
    assert error.value.setting == "logit_bias"


def test_min_tokens_ignore_eos_and_stop_token_ids_end_answers_as_plain_decoding_does(close_pair: Pipeline) -> None:
    end = 11  # an end-of-sequence token the bias makes the likeliest everywhere: without more, answers end at once
    pipeline = Pipeline(
        target=close_pair.target, draft=close_pair.draft, tokenizer=close_pair.tokenizer, eos_token_ids=frozenset({end})
    )
    ending = GenerationConfig(max_new_tokens=12, adjustments=LogitAdjustments({end: 6.0}))
    assert pipeline.generate(PROMPTS[0], ending, drafter="none").token_ids == [end]
    free = pipeline.generate(PROMPTS[0], GenerationConfig(max_new_tokens=12), drafter="none").token_ids
    stopper = next(token for token in free[3:] if token != end)
    cases = {
        "min_tokens": (replace(ending, min_tokens=6), lambda ids: len(ids) == 7 and ids.index(end) == 6),
        "ignore_eos": (replace(ending, ignore_eos=True), lambda ids: len(ids) == 12 and ids.count(end) > 1),
        "stop_token_ids": (
            GenerationConfig(max_new_tokens=12, stop_token_ids=(stopper,)),
            lambda ids: ids == free[: free.index(stopper) + 1],
        ),
    }
    stopped = pipeline.generate(PROMPTS[0], cases["stop_token_ids"][0], drafter="none")
    assert stopped.text == answer_text(pipeline.tokenizer, PROMPTS[0], stopped.token_ids[:-1])  # no stop token's text
    assert stopped.stop_reason == stopper and pipeline.generate(PROMPTS[0], ending, drafter="none").stop_reason is None
    both = pipeline.generate(PROMPTS[0], replace(ending, stop_token_ids=(end,)), drafter="none")
    assert both.token_ids[-1] == end and both.stop_reason is None  # an end-of-sequence token ends it anyway (vLLM)
    heeded = replace(ending, stop_token_ids=(end,), ignore_eos=True)  # then only as a stop token
    assert pipeline.generate(PROMPTS[0], heeded, drafter="none").stop_reason == end
    for name, (config, holds) in cases.items():
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=5)):
            plain = pipeline.generate(PROMPTS[0], replace(config, sampling=sampling), drafter="none")
            assert sampling.is_seeded or holds(plain.token_ids), (name, plain.token_ids)
            for drafter, gamma in itertools.product(["draft-model", "hybrid"], [1, 4]):
                speculative = replace(config, sampling=sampling, policy=f"fixed:{gamma}")
                result = pipeline.generate(PROMPTS[0], speculative, drafter=drafter)
                assert result.token_ids == plain.token_ids, (name, sampling, drafter, gamma)
