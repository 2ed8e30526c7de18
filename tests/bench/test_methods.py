"""Bench method specs (drafters, policies, runtimes, controls) and each question starting a new conversation."""

from __future__ import annotations

import pytest

from quickdraft.bench.methods import METHODS, PEERS, make_method, parse_methods
from quickdraft.bench.names import PEER_NAMES, method_names
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.errors import QuickdraftError


def test_method_specs() -> None:
    methods = parse_methods("draft-model:2,prompt-lookup,hf-generate")
    assert [m.name for m in methods] == ["baseline", "draft-model:2", "prompt-lookup:4", "hf-generate"]
    assert [m.num_draft_tokens for m in methods] == [None, 2, 4, None]
    assert [m.uses_draft_model for m in methods] == [False, True, False, False]
    assert make_method("hf-assisted").uses_draft_model
    control = parse_methods("control")
    assert [m.name for m in control] == ["baseline", "control"]  # plain decoding twice: an A/A control
    assert (control[1].drafter, control[1].policy, control[1].num_draft_tokens) == ("none", "fixed", None)
    policy = make_method("prompt-lookup+confidence:0.5")
    assert (policy.name, policy.num_draft_tokens, policy.max_draft_tokens) == ("prompt-lookup+confidence:0.5", None, 16)
    for bad in (
        "nope",
        "control:2",
        "control@transformers",
        "draft-model:x",
        "draft-model:0",
        "hf-generate:3",
        "baseline,baseline",
        "baseline+goodput",
        "draft-model+oracle",
        "draft-model+fixed:x",
    ):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def test_the_torch_free_names_are_the_methods() -> None:
    """What ``bench --help`` lists (bench/names.py, no torch) is what the method registry builds."""
    assert sorted(PEERS) == sorted(PEER_NAMES)
    assert METHODS.names() == method_names()


def test_no_methods_is_an_error_not_a_baseline_run() -> None:
    for empty in ("", ",", " , "):
        with pytest.raises(QuickdraftError, match="--methods: no methods given"):
            parse_methods(empty)


def test_llama_cpp_method_specs() -> None:
    methods = parse_methods("llama-cpp,llama-cpp-prompt-lookup,hf-generate")
    assert [m.name for m in methods] == ["baseline", "llama-cpp", "llama-cpp-prompt-lookup", "hf-generate"]
    assert [m.peer for m in methods] == [False, True, True, True]
    assert [m.uses_draft_model for m in methods] == [False, False, False, False]
    assert [m.num_draft_tokens for m in methods] == [None, None, None, None]  # no theory check for peers
    assert methods[1].info().peer and not methods[0].info().peer
    for bad in ("llama-cpp:3", "llama-cpp@transformers", "llama-cpp+goodput", "llama-cpp-prompt-lookup:2"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def test_method_specs_on_another_runtime() -> None:
    methods = parse_methods("draft-model:2@transformers,prompt-lookup+goodput@transformers,hf-generate")
    names = [m.name for m in methods]
    assert names == ["baseline", "baseline@transformers", "draft-model:2@transformers",
                     "prompt-lookup+goodput@transformers", "hf-generate"]  # fmt: skip
    assert [m.baseline for m in methods[:3]] == ["baseline", "baseline", "baseline@transformers"]
    assert methods[2].runtime == "transformers" and methods[2].num_draft_tokens is None  # no theory check
    for bad in ("draft-model:2@nope", "hf-generate@native", "baseline@"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def test_each_question_starts_a_new_conversation(pipeline) -> None:
    """Methods share a drafter: one must not find the prompt another method (or the warm-up) just read,
    only the start that every request shares (the chat template's system prompt), as far as it was read."""
    method = make_method("draft-model:2")
    method.run(pipeline, [3, 1, 4, 1, 5], max_new_tokens=4)
    drafter = pipeline.drafter("draft-model")
    assert isinstance(drafter, DraftModelDrafter)
    (conversation,) = [kept for kept in drafter.kept if kept.cached_ids[:5] == [3, 1, 4, 1, 5]]
    method.start_conversation(pipeline, [3, 1, 7])
    assert conversation.cached_ids == [3, 1] and int(conversation.cache.lengths[0]) == 2
    method.start_conversation(pipeline)
    assert conversation.cached_ids == [] and int(conversation.cache.lengths[0]) == 0
    make_method("prompt-lookup:2").start_conversation(pipeline)  # drafters without a conversation: a no-op
