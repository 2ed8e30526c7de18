"""Records kept across requests: draft outcomes, answer lengths, step times."""

from __future__ import annotations

import json

import pytest

from quickdraft.policies import (
    AcceptanceRecord,
    AnswerLength,
    AnswerLengthRecord,
    StepTimeRecord,
    draft_outcomes,
)


def test_block_outcomes_split_into_first_and_later_drafts() -> None:
    assert draft_outcomes(0, 0) == ([], [])
    assert draft_outcomes(4, 0) == ([0], [])  # drafts after the first rejection tell nothing
    assert draft_outcomes(4, 2) == ([1], [1, 0])
    assert draft_outcomes(4, 4) == ([1], [1, 1, 1])
    record = AcceptanceRecord()
    for proposed, accepted in [(4, 0), (4, 2), (4, 4), (1, 1)]:
        record.add(proposed, accepted)
    assert (record.first.accepted, record.first.rejected) == (3, 1)
    assert (record.later.accepted, record.later.rejected) == (4, 1)
    assert AcceptanceRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    with pytest.raises(ValueError):
        AcceptanceRecord.from_dict({"first": [1.0, float("nan")], "later": [0, 0]})


def test_answer_lengths_take_over_from_ski_rental() -> None:
    record = AnswerLengthRecord()
    assert record.expected_remaining(generated=5, remaining=100, ski_rental=5) == 5  # nothing recorded yet
    for length in [10] * 8 + [128] * 8:  # short answers and answers cut at a budget of 128
        record.add(length, cut_by_budget=length == 128)
    assert record.expected_remaining(2, 126, ski_rental=2) == pytest.approx((2 * 2 + 8 * 8 + 8 * 126) / 18)
    assert record.expected_remaining(20, 108, ski_rental=20) == pytest.approx((2 * 20 + 8 * 108) / 10)
    assert record.expected_remaining(130, None, ski_rental=130) == 130  # longer than any: ski rental again
    assert record.expected_remaining(2, 30, ski_rental=2) == pytest.approx((2 * 2 + 8 * 8 + 8 * 30) / 18)  # capped
    # under a larger budget, answers cut at 128 are expected to run on to it; those that ended do not
    assert record.expected_remaining(2, 498, ski_rental=2) == pytest.approx((2 * 2 + 8 * 8 + 8 * 498) / 18)
    recent = AnswerLengthRecord([AnswerLength(5)] * 3, capacity=4)
    recent.add(50)
    recent.add(60)
    assert [answer.num_tokens for answer in recent.answers] == [5, 5, 50, 60]  # only the most recent answers count
    with pytest.raises(ValueError, match="at least one answer"):
        AnswerLengthRecord(capacity=0)


def test_step_time_record_follows_the_recent_steps() -> None:
    record = StepTimeRecord(window=4)
    assert record.plain_step_ms is None and record.draft_token_ms is None  # nothing measured yet
    for elapsed_ms in [107.0, 109.0]:
        record.add_plain_step(elapsed_ms)
    assert record.plain_step_ms is None  # too few steps to tell a step from a stall: the profile stands
    for elapsed_ms in [104.0, 108.0]:
        record.add_plain_step(elapsed_ms)
    assert record.plain_step_ms == pytest.approx(107.5)  # the median of the window
    for _ in range(2):
        record.add_plain_step(120.0)  # the machine got busier: half a window later the estimate moves
    assert record.plain_step_ms == pytest.approx(114.0)
    record.add_plain_step(120.0)
    assert record.plain_step_ms == pytest.approx(120.0)
    for _ in range(3):
        record.add_draft_token_cost(30.0, record.plain_step_ms)
    assert record.draft_token_ms == 30.0 and record.plain_step_ms == pytest.approx(120.0)
    with pytest.raises(ValueError, match="at least one step"):
        StepTimeRecord(window=0)


def test_step_time_record_is_not_moved_by_a_stalled_step() -> None:
    """A drafted token's cost is sampled only by drafting steps: one stall must not price drafting out."""
    record = StepTimeRecord(window=16)
    for _ in range(8):
        record.add_plain_step(60.0)
        record.add_draft_token_cost(20.0, 60.0)
    record.add_draft_token_cost(2000.0, 60.0)  # the machine stalled for two seconds in a one-draft step
    record.add_plain_step(2000.0)
    assert record.draft_token_ms == 20.0 and record.plain_step_ms == 60.0
    assert record.summary()["num_drafting_steps"] == 9


def test_step_time_record_prices_a_drafted_token_at_most_a_plain_step() -> None:
    record = StepTimeRecord(window=1)
    record.add_draft_token_cost(500.0, 60.0)  # against the profile's t(1): no plain step measured yet
    assert record.draft_token_ms is None  # at its own estimate: none yet
    assert record.draft_token_cost(60.0) == 60.0  # at a plain step's price drafting never pays: more says no more
    assert record.draft_token_cost(0.0) is None  # no plain step to take a share of
    record.add_plain_step(80.0)
    assert record.draft_token_ms == 80.0


def test_step_time_record_prices_a_drafted_token_at_the_machines_speed_now() -> None:
    """A drafted token timed in a slow spell costs less once plain steps say the machine is fast again."""
    record = StepTimeRecord(window=8)
    for _ in range(8):
        record.add_plain_step(120.0)  # a slow spell: both models run slowly
        record.add_draft_token_cost(40.0, record.plain_step_ms or 120.0)
    assert record.draft_token_ms == pytest.approx(40.0)
    for _ in range(8):
        record.add_plain_step(60.0)  # the machine is fast again, and the model left out meanwhile
    assert record.draft_token_ms == pytest.approx(20.0)
