"""Logit bias and penalties (quickdraft.lossless.adjustments) against the rule written out by hand, and min-p."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import adjusted_by_hand

from quickdraft.errors import ConfigError
from quickdraft.lossless.adjustments import LogitAdjustments, adjust_logits, mask_ends
from quickdraft.lossless.sampling import SamplingParams, logits_to_scores

STRONG = LogitAdjustments({3: 2.5, 0: -100, 7: 0.5}, 0.7, 0.4, repetition_penalty=1.3)


@pytest.mark.parametrize(
    "adjustments",
    [
        STRONG,
        LogitAdjustments({5: -3.0}),
        LogitAdjustments(presence_penalty=-1.0),
        LogitAdjustments(frequency_penalty=2.0),
        LogitAdjustments(repetition_penalty=0.6),
    ],
    ids=["all", "bias", "presence", "frequency", "repetition"],
)
@pytest.mark.parametrize("seed", range(3))
def test_each_row_is_the_rule_after_the_answer_and_the_drafts_before_it(
    adjustments: LogitAdjustments, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    vocab, num_drafts = 12, 5
    logits = 3 * torch.randn(num_drafts + 1, vocab, generator=generator)  # [γ + 1, V]
    prompt, answer, drafts = (torch.randint(vocab, (n,), generator=generator).tolist() for n in (6, 7, num_drafts))
    adjusted = adjust_logits(adjustments, logits, prompt, answer, drafts)  # [γ + 1, V]
    for row in range(num_drafts + 1):
        expected = adjusted_by_hand(adjustments, logits[row].tolist(), prompt, answer + drafts[:row])
        torch.testing.assert_close(adjusted[row], torch.tensor(expected), rtol=1e-6, atol=1e-5)
    assert not torch.equal(adjusted, logits)


@pytest.mark.parametrize("adjustments", [STRONG, LogitAdjustments(presence_penalty=1.0)], ids=["all", "presence"])
def test_the_first_token_of_an_answer_has_no_answer_before_it(adjustments: LogitAdjustments) -> None:
    logits = torch.randn(1, 9)
    adjusted = adjust_logits(adjustments, logits, [1, 2], [])
    torch.testing.assert_close(adjusted[0], torch.tensor(adjusted_by_hand(adjustments, logits[0].tolist(), [1, 2], [])))


def test_no_adjustments_leave_the_logits_as_they_are() -> None:
    logits = torch.randn(3, 8)
    assert adjust_logits(LogitAdjustments(), logits, [1, 2], [3], [4, 5]) is logits


def test_adjusting_makes_a_new_tensor_and_keeps_masked_tokens_masked() -> None:
    logits = torch.tensor([[0.0, float("-inf"), 2.0, -1.0]])
    original = logits.clone()
    adjusted = adjust_logits(LogitAdjustments({1: 100}, 1.0, 1.0, 2.0), logits, [1, 2], [1, 3])
    assert torch.equal(logits, original)
    assert adjusted[0, 1] == float("-inf")  # a grammar's mask outlasts any bias and penalty
    assert adjusted[0].tolist() == [0.0, float("-inf"), 1.0, -4.0]


def test_a_mapping_is_stored_as_sorted_pairs() -> None:
    assert LogitAdjustments({9: 1, 2: -1.5}).logit_bias == ((2, -1.5), (9, 1.0))
    assert LogitAdjustments({9: 1}).largest_token_id == 9 and LogitAdjustments().largest_token_id == -1


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {-1: 1}}, "logit_bias"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
        ({"logit_bias": {1: True}}, "logit_bias"),
        ({"logit_bias": {1: math.nan}}, "logit_bias"),
        ({"logit_bias": "5:1"}, "logit_bias"),
        ({"logit_bias": [(5, 1.0), (5, -1.0)]}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),  # a logit divided by it is inf in float32
        ({"repetition_penalty": 1e3}, "repetition_penalty"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ],
)
def test_bad_values_are_clear_errors_naming_the_setting(kwargs: dict, setting: str) -> None:
    with pytest.raises(ConfigError) as error:
        LogitAdjustments(**kwargs)
    assert error.value.setting == setting


def test_min_p_drops_tokens_below_its_share_of_the_likeliest() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    scores = logits_to_scores(logits, SamplingParams(temperature=1.0, min_p=0.2))  # keeps p >= 0.1
    assert torch.isinf(scores[0, 3]) and not torch.isinf(scores[0, :3]).any()
    torch.testing.assert_close(scores[0, :3].softmax(-1), torch.tensor([0.5, 0.3, 0.12]) / 0.92)
    cooler = logits_to_scores(logits, SamplingParams(temperature=0.5, min_p=0.2))  # after temperature: p² shares
    assert torch.isinf(cooler[0, 2:]).all()
    only_top = logits_to_scores(logits, SamplingParams(temperature=1.0, min_p=1.0))
    assert torch.isfinite(only_top).tolist() == [[True, False, False, False]]


@pytest.mark.parametrize("min_p", [-0.1, 1.5, math.nan, True])
def test_min_p_outside_zero_to_one_is_a_clear_error(min_p: float) -> None:
    with pytest.raises(ConfigError, match="min_p"):
        SamplingParams(temperature=1.0, min_p=min_p)


def test_min_tokens_masks_the_ends_in_its_rows_unless_nothing_else_is_left() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [float("-inf"), float("-inf"), 2.0]])
    masked = mask_ends(logits, 3, frozenset({2}))
    assert masked[:2].tolist() == [[0.0, 1.0, float("-inf")]] * 2
    assert masked[2].tolist() == logits[2].tolist()  # only an end is allowed there (a grammar's): it stays
    assert mask_ends(logits, 1, frozenset({2}))[1:].tolist() == logits[1:].tolist()  # rows past min_tokens
