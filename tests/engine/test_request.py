"""A request's ids and settings are checked where it is made, so no bad value reaches a step; and a request whose
start fails leaves the engine as it found it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import native_chat_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.engine import Request
from quickdraft.engine.request import token_ids
from quickdraft.errors import ConfigError, PromptError

CONFIG = GenerationConfig(max_new_tokens=4, num_draft_tokens=2)


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_chat_pipeline()


def test_token_ids_are_non_negative_ints_of_one_sequence() -> None:
    assert token_ids([3, 1, 4]) == (3, 1, 4) and token_ids((np.int64(2),)) == (2,)
    assert token_ids(torch.tensor([5, 6])) == (5, 6) and token_ids(np.array([7])) == (7,)
    bad = [
        ("w1", "sequence of token ids"),
        (b"w1", "sequence of token ids"),
        (None, "sequence of token ids"),
        (3, "sequence of token ids"),
        ({"role": "user"}, "sequence of token ids"),
        ([-1, 2], "got -1"),
        ([True, 2], "got True"),
        ([1.0], "got 1.0"),
        ([[1, 2]], "got \\[1, 2\\]"),
        ([{"role": "user", "content": "w1"}], "got \\{"),
        (torch.tensor([[1, 2]]), "shape \\(1, 2\\)"),
        (torch.tensor([1.5]), "got 1.5"),
    ]
    for ids, words in bad:
        with pytest.raises(PromptError, match=words):
            token_ids(ids)


def test_the_pipeline_refuses_bad_prompts_and_settings_before_any_step(native: Pipeline) -> None:
    expected = native.generate("w1 w2 w3", CONFIG).token_ids
    refused = [
        (([native.target.vocab_size],), PromptError, "below the vocabulary's size"),
        (([1, 2],), PromptError, "chat=True wraps prompt text", {"chat": True}),
        ((native.tokenizer("w1 w2 w3", return_tensors="pt").input_ids,), PromptError, "shape"),
        (([1, 2], {"max_new_tokens": 2}), ConfigError, "config must be a GenerationConfig"),
        ((None,), PromptError, "sequence of token ids"),
        (([1, 2], CONFIG), PromptError, "prediction's token ids", {"prediction": [native.target.vocab_size + 3]}),
    ]
    for args, error, words, *kwargs in refused:
        with pytest.raises(error, match=words):
            native.generate(*args, **(kwargs[0] if kwargs else {}))
    assert native.generate("w1 w2 w3", CONFIG).token_ids == expected  # nothing was left behind
    with pytest.raises(PromptError, match="non-empty list"):
        native.encode_chat([])
    with pytest.raises(PromptError, match="content must be text"):
        native.encode_chat([{"role": "user", "content": None}])
    with pytest.raises(PromptError, match="role and a content"):
        native.encode_chat(["w1"])  # type: ignore[list-item]


def test_a_request_whose_start_raises_leaves_the_engine_usable(
    native: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = native.generate("w1 w2 w3", CONFIG, drafter="draft-model").token_ids
    drafter = native.drafter("draft-model")
    start, poisoned = drafter.start, tuple(native.encode("w9 w9"))

    def failing_for_one_prompt(prompt_ids: tuple[int, ...], *args: object) -> object:
        if tuple(prompt_ids) == poisoned:
            raise RuntimeError("a start that fails")
        return start(prompt_ids, *args)

    monkeypatch.setattr(drafter, "start", failing_for_one_prompt)
    with pytest.raises(RuntimeError, match="a start that fails"):
        native.generate("w9 w9", CONFIG, drafter="draft-model")
    assert native.generate("w1 w2 w3", CONFIG, drafter="draft-model").token_ids == expected  # not started again
    assert native.engine.idle and not native.engine.scheduler.admitting


def test_what_an_engine_cannot_run_is_refused_at_submission(native: Pipeline, pipeline: Pipeline) -> None:
    """Each of these failed inside a step before, and took the other running requests with it."""
    request = Request((1, 2, 3), CONFIG, native.drafter("draft-model"))
    with pytest.raises(ConfigError, match="an engine takes a Request"):
        native.engine.submit("w1 w2", print)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sink must be a function"):
        native.engine.submit(request, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="made for another target model"):
        native.engine.submit(Request((1, 2, 3), CONFIG, pipeline.drafter("draft-model")), print)
    with pytest.raises(ConfigError, match="options must be a DrafterOptions"):
        native.drafter("draft-model", options={"hybrid_min_ngram": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="setup_policy takes a GenerationConfig"):
        native.setup_policy("draft-model", None)  # type: ignore[arg-type]
    assert native.engine.idle
    expected = native.generate("w1 w2 w3", CONFIG, drafter="hybrid").token_ids
    assert native.generate("w1 w2 w3", CONFIG, drafter="hybrid", prediction="").token_ids == expected


def test_a_requests_flags_and_the_pipelines_arguments_take_their_own_types(native: Pipeline) -> None:
    from quickdraft.runtime.native import NativeRuntime
    from quickdraft.runtime.options import draft_load_options

    drafter = native.drafter("draft-model")
    with pytest.raises(ConfigError, match="cache_prompt must be True or False"):
        Request((1, 2), CONFIG, drafter, cache_prompt="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="request_id a string"):
        Request((1, 2), CONFIG, drafter, request_id=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_draft_tokens must be an integer >= 1"):
        native.calibrate("draft-model", max_draft_tokens="4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="draft_vocabulary is a number of tokens >= 0 \\(0: all\\), got '16'"):
        draft_load_options(NativeRuntime, native.tokenizer, None, "16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown draft_weights 'q2'; choose one of: auto, q4, int8") as bad:
        draft_load_options(NativeRuntime, native.tokenizer, "q2", None)  # named by the library's setting
    assert bad.value.setting == "draft_weights"
    for tools in ("abc", 5, [5]):
        with pytest.raises(PromptError, match="tools must be a list of OpenAI function tools"):
            native.encode_chat([{"role": "user", "content": "w1"}], tools=tools)  # type: ignore[arg-type]
