"""The policy interface and registry: step states, specs, the default policy."""

from __future__ import annotations

import pytest

from quickdraft.config import GenerationConfig
from quickdraft.costs import CostModel
from quickdraft.errors import ConfigError, UnknownNameError
from quickdraft.policies import (
    POLICIES,
    DraftBid,
    Offer,
    PolicyContext,
    StepOutcome,
    StepState,
    make_policy,
    parse_policy,
)


def test_step_state_rejects_negative_counts() -> None:
    with pytest.raises(ValueError):
        StepState(remaining_tokens=-1)
    with pytest.raises(ValueError):
        Offer("model", backlog=-1)
    with pytest.raises(ValueError):
        Offer("copy", max_tokens=-1, free=True)
    with pytest.raises(ValueError):
        StepOutcome(DraftBid(2), num_drafted=2, num_judged=1, num_accepted=2)
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
    for bad in ("fixed:x", "fixed:-1", "confidence:2", "heuristic:3", "goodput:1", "fixed:", "goodput: "):
        with pytest.raises(ConfigError):
            GenerationConfig(policy=bad)
    with pytest.raises(UnknownNameError):
        GenerationConfig(policy="oracle")
    GenerationConfig(policy="goodput")  # needs a cost model only when a request runs


def test_a_bad_policy_argument_names_what_it_must_be() -> None:
    with pytest.raises(ConfigError, match=r"^fixed:K must be an integer, got 'abc'$"):
        parse_policy("fixed:abc")
    with pytest.raises(ConfigError, match=r"^confidence:T must be a number, got 'high'$"):
        parse_policy("confidence:high")
    for typo in ("3_0", " 3", "3 ", "\u0663"):  # int() reads each: "3_0" as 30, an Arabic-Indic digit as 3
        with pytest.raises(ConfigError, match="fixed:K must be an integer"):
            parse_policy(f"fixed:{typo}")


def test_each_policy_says_which_gamma_settings_it_reads() -> None:
    """What the CLI notes as unused: a fixed γ reads no maximum, an adaptive policy no starting γ."""
    reads = {name: (POLICIES.get(name).uses_num_draft_tokens, POLICIES.get(name).uses_max_draft_tokens)
             for name in POLICIES.names()}  # fmt: skip
    assert reads == {
        "fixed": (True, False), "heuristic": (True, True), "goodput": (False, True), "confidence": (False, True),
        "specdec++": (False, True),
    }  # fmt: skip


def test_goodput_is_the_default_unless_the_request_gives_a_gamma() -> None:
    default = GenerationConfig()
    assert (default.policy, default.num_draft_tokens) == ("goodput", 4)
    asked = GenerationConfig(num_draft_tokens=2)  # "draft 2 per step" is a fixed policy
    assert (asked.policy, asked.num_draft_tokens) == ("fixed", 2)
    heuristic = GenerationConfig(policy="heuristic")
    assert (heuristic.policy, heuristic.num_draft_tokens) == ("heuristic", 4)
    assert GenerationConfig(num_draft_tokens=3, policy="goodput").policy == "goodput"


def test_a_bid_takes_the_drafters_first_offer_with_drafts() -> None:
    """A policy without estimates bids on the first offer that has drafts (a hybrid's copies, when it has some),
    and bidding changes nothing in it."""
    copies, model = Offer("copy", max_tokens=3, free=True), Offer("model", backlog=5, batched=True)
    fixed = make_policy("fixed:4", PolicyContext())
    assert fixed.bid(StepState(offers=(copies, model))).offer == copies
    assert fixed.bid(StepState(offers=(Offer("copy", max_tokens=0, free=True), model))).offer == model
    plain = make_policy("fixed:0", PolicyContext()).bid(StepState(offers=(copies, model)))
    assert plain.num_draft_tokens == 0 and plain.offer is None and not plain.batched
    assert fixed.bid(StepState(offers=())).num_draft_tokens == 0  # nothing on offer: a plain step
