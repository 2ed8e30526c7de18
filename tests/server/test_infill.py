"""Fill-in-the-middle through ``/v1/completions``' ``suffix``: the prompt in the tokenizer's format, the same answer
with and without speculation, the format's end tokens ending it, and clear 400s where it cannot be."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from conftest import EOS, MODEL, Server, listed_tokenizer, native_from_hf, serving, tiny_model

from quickdraft.api import Pipeline

WORDS = ["<unk>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", EOS] + [
    f"w{i}" for i in range(26)
]
PAD = WORDS.index("<|fim_pad|>")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tokenizer = listed_tokenizer(WORDS)
    pipeline = Pipeline(
        target=native_from_hf(tiny_model(len(WORDS), seed=5, logit_scale=3.0)),
        tokenizer=tokenizer,
        eos_token_ids=frozenset({WORDS.index(EOS)}),
        draft=native_from_hf(tiny_model(len(WORDS), seed=5, logit_scale=3.0, num_layers=1)),
    )
    with serving(pipeline) as running:
        yield running


def complete(server: Server, **fields: Any) -> Any:
    extra = {"return_token_ids": True} | fields.pop("extra_body", {})
    return server.client().completions.create(model=MODEL, max_tokens=10, temperature=0, extra_body=extra, **fields)


def test_a_suffix_asks_for_the_middle_the_same_with_and_without_speculation(server: Server) -> None:
    answers = [complete(server, prompt="w1 w2", suffix="w3 w4", extra_body={"drafter": name}).choices[0]
               for name in ("none", "draft-model", "hybrid-suffix")]  # fmt: skip
    assert answers[0].token_ids == answers[1].token_ids == answers[2].token_ids
    assert [choice.text for choice in answers[1:]] == [answers[0].text] * 2
    plain = complete(server, prompt="w1 w2").choices[0]
    at_the_end = complete(server, prompt="w1 w2", suffix="")  # "": the middle runs to the end of the text
    assert at_the_end.usage.prompt_tokens == 5 and complete(server, prompt="w1 w2").usage.prompt_tokens == 2
    assert plain.token_ids  # a plain completion, as a null suffix asks
    usage = complete(server, prompt="w1 w2", suffix="w3 w4").usage
    assert usage.prompt_tokens == 7  # <|fim_prefix|> w1 w2 <|fim_suffix|> w3 w4 <|fim_middle|>
    assert complete(server, prompt=[WORDS.index("w1")], suffix="w3").usage.prompt_tokens == 5  # token ids too


def test_the_formats_end_tokens_end_an_infill_only(server: Server) -> None:
    forced = {"logit_bias": {str(PAD): 100}}
    infill = complete(server, prompt="w1", suffix="w2", extra_body=forced).choices[0]
    assert infill.finish_reason == "stop" and infill.token_ids == [PAD] and infill.stop_reason == PAD
    plain = complete(server, prompt="w1", extra_body=forced).choices[0]  # an ordinary completion goes on
    assert plain.finish_reason == "length" and plain.token_ids == [PAD] * 10


def test_suffixes_that_cannot_be_are_clear_400s(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="suffix must be a string") as bad:
        client.completions.create(model=MODEL, prompt="w1", max_tokens=2, extra_body={"suffix": 3})
    assert bad.value.body["param"] == "suffix"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="goes to /v1/completions"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w1"}], max_tokens=2,
                                       extra_body={"suffix": "w2"})  # fmt: skip


def test_a_model_without_fill_in_the_middle_tokens_refuses_a_suffix() -> None:
    words = ["<unk>", EOS, "w1", "w2"]
    pipeline = Pipeline(
        target=native_from_hf(tiny_model(len(words), seed=5)),
        tokenizer=listed_tokenizer(words),
        eos_token_ids=frozenset({1}),
    )
    refusal = pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens")
    with serving(pipeline) as running, refusal as refused:
        running.client().completions.create(model=MODEL, prompt="w1", suffix="w2", max_tokens=2)
    assert refused.value.body["param"] == "suffix"  # type: ignore[index]
