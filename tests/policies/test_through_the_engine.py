"""Every policy through the engine on tiny models: lossless, and adapting as it should."""

from __future__ import annotations

import pytest
from conftest import MODERATE, STEEP

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig

PROMPTS = [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


@pytest.mark.parametrize("policy", ["fixed:3", "heuristic", "confidence:0.3", "goodput"])
@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup"])
def test_every_policy_is_lossless(pipeline: Pipeline, policy: str, drafter: str) -> None:
    records = pipeline.drafter_records(drafter)
    records.cost_model = records.cost_model or MODERATE
    for prompt_ids in PROMPTS:
        plain = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=24), drafter="none")
        result = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=24, policy=policy), drafter=drafter)
        assert result.token_ids == plain.token_ids, (policy, drafter, prompt_ids)
        assert len(result.stats.proposed_per_step) == result.stats.target_forwards - 1


def test_goodput_falls_back_to_plain_steps_when_drafts_fail(pipeline: Pipeline) -> None:
    fresh = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=pipeline.draft)
    fresh.drafter_records("prompt-lookup").cost_model = STEEP  # verification as dear as decoding: drafting never pays
    result = fresh.generate(PROMPTS[1], GenerationConfig(max_new_tokens=24, policy="goodput"), drafter="prompt-lookup")
    assert sum(result.stats.proposed_per_step) <= 2  # at most a probe


def test_confidence_policy_drafts_variable_lengths(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=32, policy="confidence:0.5", max_draft_tokens=8)
    result = pipeline.generate(PROMPTS[2], config, drafter="draft-model")
    assert len(set(result.stats.proposed_per_step)) > 1


def test_the_default_policy_calibrates_at_the_first_request(pipeline: Pipeline) -> None:
    fresh = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=pipeline.draft)
    plain = fresh.generate(PROMPTS[2], GenerationConfig(max_new_tokens=12), drafter="none")
    assert all(records.cost_model is None for records in fresh.records.values())  # no γ to choose: nothing to measure
    result = fresh.generate(PROMPTS[2], GenerationConfig(max_new_tokens=12), drafter="draft-model")
    assert result.token_ids == plain.token_ids
    calibrated = {drafter: records.cost_model for drafter, records in fresh.records.items() if records.cost_model}
    assert list(calibrated) == ["draft-model"] and calibrated["draft-model"].draft_ms > 0
