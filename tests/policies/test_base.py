"""The policy interface and registry: step states, specs, the default policy."""

from __future__ import annotations

import pytest

from quickdraft.config import GenerationConfig
from quickdraft.costs import CostModel
from quickdraft.errors import ConfigError, UnknownNameError
from quickdraft.policies import (
    PolicyContext,
    StepState,
    make_policy,
)


def test_step_state_rejects_negative_counts() -> None:
    with pytest.raises(ValueError):
        StepState(remaining_tokens=-1)
    with pytest.raises(ValueError):
        StepState(drafter_backlog=-1)
    with pytest.raises(ValueError):
        StepState(generated_tokens=-1)
    with pytest.raises(ConfigError):
        CostModel({1: 1.0}, draft_prefill_ms={0: 1.0})
    with pytest.raises(ConfigError):
        CostModel({1: 1.0}, draft_prefill_ms={10: -1.0})


def test_fixed_policy_and_specs() -> None:
    assert make_policy("fixed", PolicyContext(num_draft_tokens=3)).choose() == 3
    assert make_policy("fixed:0", PolicyContext()).choose() == 0
    with pytest.raises(ConfigError, match="cost model"):
        make_policy("goodput", PolicyContext())
    for bad in ("fixed:x", "fixed:-1", "confidence:2", "heuristic:3", "goodput:1"):
        with pytest.raises(ConfigError):
            GenerationConfig(policy=bad)
    with pytest.raises(UnknownNameError):
        GenerationConfig(policy="oracle")
    GenerationConfig(policy="goodput")  # needs a cost model only when a request runs


def test_goodput_is_the_default_unless_the_request_gives_a_gamma() -> None:
    default = GenerationConfig()
    assert (default.policy, default.num_draft_tokens) == ("goodput", 4)
    asked = GenerationConfig(num_draft_tokens=2)  # "draft 2 per step" is a fixed policy
    assert (asked.policy, asked.num_draft_tokens) == ("fixed", 2)
    heuristic = GenerationConfig(policy="heuristic")
    assert (heuristic.policy, heuristic.num_draft_tokens) == ("heuristic", 4)
    assert GenerationConfig(num_draft_tokens=3, policy="goodput").policy == "goodput"
