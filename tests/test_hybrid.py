from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.drafters.hybrid import HybridDrafter
from quickdraft.errors import ConfigError
from tests.test_engine import PROMPTS


def hybrid(pipeline: Pipeline, **options: int) -> HybridDrafter:
    drafter = DRAFTERS.get("hybrid").create(pipeline.target, pipeline.draft, DrafterOptions(**options))
    assert isinstance(drafter, HybridDrafter)
    return drafter


def test_copies_after_a_repeated_ngram_at_no_cost(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    context = [5, 6, 7, 8, 9, 1, 5, 6]  # "5 6" occurred before, followed by 7 8 9 1 5 6
    drafter.prefill([context])
    assert drafter.free_drafts([context]) == 6
    assert drafter.backlog([context]) == len(context)  # what the model would read first, if a policy chose it
    proposal = drafter.propose([context], 3, SamplingParams(), None)
    assert proposal.token_ids.tolist() == [[7, 8, 9]] and proposal.probs is None  # one-hot q
    assert drafter.model.cached_ids == []  # the draft model reads nothing for a copy
    declined = drafter.propose([context], 3, SamplingParams(), None, copies=False)
    assert declined.token_ids.shape == (1, 3) and declined.probs is not None  # the model drafted instead


def test_a_single_repeated_token_is_not_copied(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)  # the default: a match of 2 tokens at least
    context = [5, 6, 7, 8, 9, 1, 5]
    drafter.prefill([context])
    assert drafter.free_drafts([context]) == 0
    assert drafter.backlog([context]) == len(context)  # the draft model reads the context first
    assert hybrid(pipeline, hybrid_min_ngram=1).free_drafts([context]) == 6


def test_without_a_match_the_draft_model_drafts(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    context = [3, 1, 4, 15, 9, 2, 6]
    drafter.prefill([context])
    proposal = drafter.propose([context], 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert proposal.token_ids.shape == (1, 3) and proposal.probs is not None  # the draft's q  [1, γ, V]
    assert drafter.model.cached_ids == context + proposal.token_ids[0, :2].tolist()


def test_hybrid_ngram_size_is_checked() -> None:
    with pytest.raises(ConfigError, match="n-gram"):
        DrafterOptions(hybrid_min_ngram=0)


def test_greedy_hybrid_under_goodput_equals_plain(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=24)
    for prompt_ids in PROMPTS:
        plain = pipeline.engine("none").generate(prompt_ids, config)
        result = pipeline.engine("hybrid").generate(prompt_ids, config)  # the default policy: goodput
        assert result.token_ids == plain.token_ids


def test_a_new_request_gets_its_own_copy(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    first, second = [5, 6, 7, 8, 5, 6], [1, 6, 2, 3, 1, 6]  # same length and last token
    drafter.prefill([first])
    assert drafter.copies.after(first) == [7, 8, 5, 6]
    drafter.prefill([second])
    assert drafter.copies.after(second) == [2, 3, 1, 6]


def test_the_hybrid_shares_the_draft_models_calibration(pipeline: Pipeline, tmp_path: Path) -> None:
    pipeline = replace(pipeline, target_path=tmp_path / "target", draft_path=tmp_path / "draft")
    assert pipeline.calibration_file("hybrid") == pipeline.calibration_file("draft-model")
    assert pipeline.calibration_file("hybrid") != pipeline.calibration_file("prompt-lookup")
