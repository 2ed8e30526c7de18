"""Predicted outputs: drafts copied from the answer the user expects, following it through edits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import draft_task

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.drafters.hybrid import HybridDrafter, HybridState
from quickdraft.drafters.prediction import PredictionCopies
from quickdraft.errors import ConfigError, PromptError

PREDICTION = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


def copies(prediction: list[int] = PREDICTION) -> PredictionCopies:
    return PredictionCopies(prediction, max_ngram=3, min_ngram=2, max_copied=4)


def test_the_drafts_follow_the_answer_along_the_prediction() -> None:
    predicted = copies()
    assert predicted.after([]) == [10, 11, 12, 13]  # the answer has not started: the prediction's start
    assert predicted.after([10, 11]) == [12, 13, 14, 15]
    assert predicted.after([10, 11, 12, 13, 14]) == [15, 16, 17, 18]
    assert predicted.after(PREDICTION) == []  # the answer reached the prediction's end


def test_an_inserted_line_loses_the_place_until_the_answer_is_back_on_the_prediction() -> None:
    predicted = copies()
    assert predicted.after([10, 11, 12, 99]) == []  # an insertion: nothing to copy
    assert predicted.after([10, 11, 12, 99, 98, 13]) == []  # one token back on it is not enough
    assert predicted.after([10, 11, 12, 99, 98, 13, 14]) == [15, 16, 17, 18]  # "13 14" found: copying again


def test_a_deleted_or_replaced_stretch_is_skipped() -> None:
    predicted = copies()
    assert predicted.after([10, 11, 15, 16]) == [17, 18, 19, 20]  # 12-14 deleted
    replaced = copies()
    assert replaced.after([10, 11, 77, 77, 14, 15]) == [16, 17, 18, 19]  # 12, 13 replaced


def test_a_repeated_line_is_found_after_the_place_reached_not_before() -> None:
    prediction = [1, 2, 3, 50, 51, 1, 2, 3, 60, 61]  # the line "1 2 3" twice
    predicted = copies(prediction)
    assert predicted.after([1, 2, 3, 50, 51]) == [1, 2, 3, 60]
    # the answer edits the second line's first token and goes on: "2 3" is found at the second line, not the first
    assert predicted.after([1, 2, 3, 50, 51, 9, 2, 3]) == [60, 61]
    back = copies(prediction)
    assert back.after([1, 2, 3, 50, 51, 1, 2, 3, 60, 61, 7, 50, 51]) == [1, 2, 3, 60]  # only an earlier one: taken


def hybrid(pipeline: Pipeline) -> HybridDrafter:
    drafter = DRAFTERS.get("hybrid").create(pipeline.target, pipeline.draft, DrafterOptions())
    assert isinstance(drafter, HybridDrafter)
    return drafter


def test_the_hybrid_copies_the_prediction_before_the_context(pipeline: Pipeline) -> None:
    drafter = hybrid(pipeline)
    prompt = [5, 6, 7, 8, 9, 1, 5, 6]  # the context alone would copy 7 8 9 1 5 6
    state = drafter.start(prompt, target_cache=None)  # type: ignore[arg-type]
    assert isinstance(state, HybridState)
    drafter.expect(state, [40, 41, 42])
    assert drafter.offers(state, prompt)[0].max_tokens == 3
    (proposal,) = drafter.propose([draft_task(state, prompt, 2)])
    assert proposal.token_ids.tolist() == [[40, 41]] and proposal.predicted and proposal.probs is None
    context = [*prompt, 40, 41, 42, 9, 1]  # past the prediction's end: the context's copies again
    (proposal,) = drafter.propose([draft_task(state, context, 2)])
    assert proposal.token_ids.tolist() == [[5, 6]] and not proposal.predicted


def test_with_a_prediction_the_output_is_the_plain_one(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=24, policy="fixed:4")  # goodput may decline copies on a busy machine
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    plain = pipeline.generate(prompt, config, drafter="none")
    exact = pipeline.generate(prompt, config, drafter="hybrid", prediction=plain.token_ids)
    assert exact.token_ids == plain.token_ids
    assert exact.stats.predicted_tokens_accepted >= len(plain.token_ids) // 2  # most of it drafted and accepted
    edited = [*plain.token_ids[:5], 7, 7, 7, *plain.token_ids[8:]]
    assert pipeline.generate(prompt, config, drafter="hybrid", prediction=edited).token_ids == plain.token_ids
    as_tensor = pipeline.generate(prompt, config, drafter="hybrid", prediction=torch.tensor(plain.token_ids))
    assert as_tensor.token_ids == plain.token_ids and as_tensor.stats.predicted_tokens_accepted > 0
    seeded = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.8, seed=3), policy="fixed:4")
    sampled = pipeline.generate(prompt, seeded, drafter="none")
    assert pipeline.generate(prompt, seeded, drafter="hybrid", prediction=edited).token_ids == sampled.token_ids


def test_a_drafter_that_cannot_copy_refuses_a_prediction(pipeline: Pipeline) -> None:
    with pytest.raises(ConfigError, match=r"needs a drafter that copies it: hybrid, hybrid-eagle, hybrid-suffix$"):
        pipeline.generate([1, 2, 3], GenerationConfig(max_new_tokens=4), drafter="none", prediction=[1, 2])
    with pytest.raises(ConfigError, match="needs a drafter that copies it"):  # a one-token array is not dropped
        pipeline.generate([1, 2, 3], GenerationConfig(max_new_tokens=4), drafter="none", prediction=np.array([0]))
    for wrong in (0, False, {}):
        with pytest.raises(PromptError, match="the prediction must be a sequence of token ids"):
            pipeline.generate([1, 2, 3], GenerationConfig(max_new_tokens=4), drafter="hybrid", prediction=wrong)
