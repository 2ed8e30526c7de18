"""The cost model and the expected tokens of a step: what goodput plans with."""

from __future__ import annotations

import json
import math

import pytest
from conftest import EXPENSIVE_DRAFT, FLAT, MODERATE, READS_SLOWLY, STEEP

from quickdraft.costs import CostModel, expected_tokens, monotone_fit
from quickdraft.errors import ConfigError
from quickdraft.policies import best_gamma


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_cost_model_interpolates_and_extrapolates() -> None:
    assert FLAT.target(4) == 103.0
    assert FLAT.target(3) == pytest.approx(102.0)
    assert STEEP.target(10) == pytest.approx(730.0 + 2 * 90.0)
    assert FLAT.step_ms(3) == pytest.approx(3 * 1.0 + 103.0)
    with pytest.raises(ConfigError):
        CostModel({2: 10.0})


def test_draft_read_follows_the_prefill_curve() -> None:
    prefill = CostModel({1: 100.0}, draft_prefill_ms={128: 256.0, 512: 1280.0})
    assert prefill.draft_read(0) == 0.0
    assert prefill.draft_read(64) == pytest.approx(128.0)  # below the first point: from (0, 0)
    assert prefill.draft_read(320) == pytest.approx(768.0)
    assert prefill.draft_read(1024) == pytest.approx(2645.333, rel=1e-4)  # the last segment's slope
    assert MODERATE.draft_read(5000) == 0.0  # no prefill curve: reading is free


def test_best_gamma_from_the_cost_model() -> None:
    assert best_gamma(FLAT, 0.0, 16) == 0  # nothing is ever accepted: never draft
    assert best_gamma(FLAT, 0.9, 16) >= 10  # cheap drafts, free verification, high α: draft long
    assert best_gamma(STEEP, 0.9, 16) <= 1  # verification costs as much as decoding: barely draft
    assert best_gamma(EXPENSIVE_DRAFT, 0.6, 16) <= 2
    assert 0 < best_gamma(EXPENSIVE_DRAFT, 0.95, 16) < best_gamma(FLAT, 0.95, 16)


def test_expected_tokens_with_a_continuation_rate() -> None:
    assert expected_tokens(0.5, 3, continuation_rate=0.5) == pytest.approx(expected_tokens(0.5, 3))
    assert expected_tokens(0.5, 4, continuation_rate=1.0) == pytest.approx(3.0)  # half the blocks all accepted
    assert expected_tokens(0.0, 4, continuation_rate=1.0) == 1.0
    assert expected_tokens(0.9, 0, continuation_rate=0.9) == 1.0


def test_measurements_shift_the_target_curve_and_replace_the_draft_cost() -> None:
    corrected = MODERATE.with_measurements(plain_step_ms=130.0, draft_token_ms=12.0)
    assert [corrected.target(k) for k in (1, 2, 4)] == [130.0, 140.0, 155.0]  # each token adds what it did
    assert corrected.draft_ms == 12.0
    assert MODERATE.with_measurements(None, None) is MODERATE
    assert MODERATE.with_measurements(None, 12.0).target(4) == MODERATE.target(4)


def test_cost_model_trades_on_a_monotone_fit_of_the_target_curve() -> None:
    assert monotone_fit({1: 71.0, 4: 122.0, 5: 110.0, 6: 125.0}) == {1: 71.0, 4: 116.0, 5: 116.0, 6: 125.0}
    assert monotone_fit({1: 5.0}) == {1: 5.0}
    assert monotone_fit({1: 3.0, 2: 2.0, 3: 1.0}) == {1: 2.0, 2: 2.0, 3: 2.0}  # one pool
    ends_low = CostModel({1: 70.0, 2: 90.0, 3: 80.0})  # a dip at the end pools it flat
    assert ends_low.target(3) == 85.0 and ends_low.target(5) == pytest.approx(85.0 + 2 * 7.5)  # not free past it
    dipped = CostModel({1: 70.0, 2: 85.0, 3: 96.0, 4: 122.0, 5: 110.0, 6: 140.0}, draft_ms=0.0)
    assert dipped.target_ms[5] == 110.0  # kept as measured
    assert dipped.target(4) == dipped.target(5) == 116.0
    assert all(dipped.step_ms(gamma) <= dipped.step_ms(gamma + 1) for gamma in range(8))


def test_a_cost_model_survives_its_json_form() -> None:
    assert CostModel.from_dict(json.loads(json.dumps(READS_SLOWLY.to_dict()))) == READS_SLOWLY
    broken_forms = [{}, {"target_ms": {"x": 1}, "draft_ms": 0, "draft_prefill_ms": {}}, {"target_ms": []}]
    for broken in broken_forms:
        with pytest.raises(ConfigError, match="not a saved cost model"):
            CostModel.from_dict(broken)


@pytest.mark.parametrize(
    "costs",
    [
        {"target_ms": {1: math.nan}},
        {"target_ms": {1: 50.0, 2: math.inf}},
        {"target_ms": {1: 50.0}, "draft_ms": math.nan},
        {"target_ms": {1: 50.0}, "draft_ms": math.inf},
        {"target_ms": {1: 50.0}, "draft_prefill_ms": {128: math.nan}},
        {"target_ms": {1: 50.0}, "draft_prefill_ms": {128: math.inf}},
    ],
)
def test_a_cost_model_rejects_times_that_are_not_finite(costs: dict) -> None:
    """NaN compares false with everything, so it passed the range checks and silently disabled speculation."""
    with pytest.raises(ConfigError, match="finite"):
        CostModel(**costs)
    saved = {"target_ms": {"1": 50.0}, "draft_ms": 0.0, "draft_prefill_ms": {}} | {
        name: {str(k): ms for k, ms in value.items()} if isinstance(value, dict) else value
        for name, value in costs.items()
    }
    with pytest.raises(ConfigError, match="not a saved cost model"):
        CostModel.from_dict(json.loads(json.dumps(saved)))


# A target whose every further row attends to the whole cache again (no shared tiles): long context makes drafts dear.
KV_HEAVY = CostModel(
    {1: 25.0, 9: 50.0}, 7.0, context_tokens=64, target_context_ms={1: 0.004, 9: 0.04}, draft_context_ms=0.001
)


def test_a_longer_context_adds_to_every_forward_and_more_to_longer_blocks() -> None:
    at_16k = KV_HEAVY.at_context(64 + 16384)
    assert at_16k.target(1) == pytest.approx(25.0 + 16384 * 0.004)
    assert at_16k.target(9) == pytest.approx(50.0 + 16384 * 0.04)
    assert at_16k.target(5) == pytest.approx(37.5 + 16384 * 0.022)  # linear in k between the measured blocks
    assert at_16k.draft_ms == pytest.approx(7.0 + 16.384)
    assert KV_HEAVY.context_ms(1, 1064) == pytest.approx(4.0)
    assert at_16k.at_context(64 + 16384) == at_16k  # it holds at its own context now
    assert KV_HEAVY.at_context(64) is KV_HEAVY and KV_HEAVY.at_context(10) is KV_HEAVY  # not below the measured one
    assert FLAT.at_context(10**6) is FLAT  # without context costs: the same at every length
    assert best_gamma(KV_HEAVY, 0.6, 8) >= 1 and best_gamma(at_16k, 0.6, 8) == 0


def test_context_costs_survive_the_json_form_and_older_files_have_none() -> None:
    assert CostModel.from_dict(json.loads(json.dumps(KV_HEAVY.to_dict()))) == KV_HEAVY
    older = {key: value for key, value in KV_HEAVY.to_dict().items() if "context" not in key}
    assert CostModel.from_dict(older).at_context(30000).target(1) == 25.0
    with pytest.raises(ConfigError, match="context costs"):
        CostModel({1: 1.0}, target_context_ms={1: -0.1})
    with pytest.raises(ConfigError, match="context costs"):
        CostModel({1: 1.0}, draft_context_ms=math.nan)


def test_context_costs_never_fall_with_more_rows() -> None:
    """A measured dip (noise on a tiny model) must not make a draft's context cost negative."""
    dipping = CostModel({1: 10.0, 8: 20.0}, context_tokens=8, target_context_ms={1: 0.002, 8: 0.001})
    assert dipping.context_ms(2, 1008) >= dipping.context_ms(1, 1008) > 0


def test_goodput_on_a_model_too_short_for_its_measurements_says_so() -> None:
    from conftest import native_from_hf, tiny_model

    from quickdraft.costs.calibration import measure_cost_model
    from quickdraft.drafters import DRAFTERS

    target = native_from_hf(tiny_model(32, seed=0), capacity=64)
    with pytest.raises(ConfigError, match=r"holds 64 positions: give a fixed number of drafts") as error:
        measure_cost_model(target, None, DRAFTERS.get("prompt-lookup"), 16)
    assert error.value.setting == "policy"


def test_goodput_with_more_drafts_than_the_model_holds_names_max_draft_tokens() -> None:
    from conftest import native_from_hf, tiny_model

    from quickdraft.costs.calibration import measure_cost_model
    from quickdraft.drafters import DRAFTERS

    target = native_from_hf(tiny_model(32, seed=0), capacity=80)  # 64 cached + 16 drafts + 1 is one too many
    with pytest.raises(ConfigError, match=r"lower max_draft_tokens to at most 15, or give a fixed") as error:
        measure_cost_model(target, None, DRAFTERS.get("prompt-lookup"), 16)
    assert error.value.setting == "max_draft_tokens"
