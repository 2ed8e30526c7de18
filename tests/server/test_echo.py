"""``echo`` on /v1/completions: the prompt repeated before the answer, with the prompt tokens' log-probabilities
where ``logprobs`` asks (the first null), whole and streamed alike, the same with and without speculation; what an
evaluation harness asks (echo, logprobs 1, max_tokens 1) included."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from conftest import MODEL, Server, native_pipeline, serving

from quickdraft.api import Pipeline

PROMPT = "w3 w1 w4 w1 w5 w9 w2 w6"


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_pipeline()


@pytest.fixture(scope="module")
def server(native: Pipeline) -> Iterator[Server]:
    with serving(native) as running:
        yield running


def complete(server: Server, **fields: Any) -> Any:
    return server.client().completions.create(model=MODEL, prompt=PROMPT, temperature=0, **fields)


def test_echo_repeats_the_prompt_with_its_tokens_logprobs(server: Server, native: Pipeline) -> None:
    plain = complete(server, max_tokens=5, logprobs=2).choices[0]
    echoed = [complete(server, max_tokens=5, logprobs=2, echo=True, extra_body={"drafter": drafter}).choices[0]
              for drafter in ("none", "draft-model")]  # fmt: skip
    prompt_ids = native.encode(PROMPT)
    for choice in echoed:
        assert choice.text == PROMPT + plain.text
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(prompt_ids) + len(plain.logprobs.tokens)
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert logprobs.token_logprobs[len(prompt_ids) :] == plain.logprobs.token_logprobs  # the answer's, as before
        assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0
        assert logprobs.text_offset[len(prompt_ids)] == len(PROMPT)
    assert echoed[0].logprobs == echoed[1].logprobs  # speculation does not change them
    context = torch.tensor([prompt_ids])
    expected = torch.log_softmax(native.target.forward(context, native.target.new_cache(1))[0], dim=-1)  # [P, V]
    for position, (token, value) in enumerate(zip(prompt_ids[1:], echoed[0].logprobs.token_logprobs[1:], strict=False)):
        assert value == pytest.approx(float(expected[position, token]), abs=1e-5)
    for token, top in zip(echoed[0].logprobs.tokens[1:], echoed[0].logprobs.top_logprobs[1:], strict=True):
        assert token in top and len(top) in (2, 3)  # the two likeliest, and the prompt's token where it is neither
    assert complete(server, max_tokens=3, echo=True).choices[0].text.startswith(PROMPT)  # no logprobs asked: text


def test_what_an_evaluation_harness_asks(server: Server) -> None:
    """lm-evaluation-harness's loglikelihood request: the prompt's log-probabilities, one new token."""
    choice = complete(server, max_tokens=1, logprobs=1, echo=True, seed=1234).choices[0]
    assert choice.text.startswith(PROMPT) and all(
        isinstance(value, float) for value in choice.logprobs.token_logprobs[1:])  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_tokens_0_scores_the_prompt_alone(server: Server, stream: bool) -> None:
    """OpenAI's legacy scoring request (HELM's): echo with max_tokens 0, the prompt's log-probabilities and no token."""
    scored = complete(server, max_tokens=1, logprobs=2, echo=True).choices[0]  # its prompt part is the same
    prompt_entries = len(scored.logprobs.tokens) - 1
    fields = {"max_tokens": 0, "logprobs": 2, "echo": True, "n": 2, "extra_body": {"return_token_ids": True}}
    if not stream:
        whole = complete(server, **fields)
        assert whole.usage.completion_tokens == 0 and whole.usage.prompt_tokens == prompt_entries  # type: ignore[union-attr]
        choices = [(c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.finish_reason) for c in whole.choices]
    else:
        chunks = list(complete(server, **fields, stream=True))
        choices = []
        for index in range(2):
            mine = [chunk.choices[0] for chunk in chunks if chunk.choices and chunk.choices[0].index == index]
            assert not any(getattr(choice, "token_ids", None) for choice in mine)
            choices.append(("".join(c.text for c in mine), [t for c in mine if c.logprobs for t in c.logprobs.tokens],
                            [v for c in mine if c.logprobs for v in c.logprobs.token_logprobs],
                            mine[-1].finish_reason))  # fmt: skip
    for text, tokens, values, reason in choices:
        assert text == PROMPT and reason == "length"
        assert tokens == scored.logprobs.tokens[:-1] and values == scored.logprobs.token_logprobs[:-1]
    with pytest.raises(openai.BadRequestError, match="max_tokens must be a whole number at least 1"):
        complete(server, max_tokens=0)  # without echo there is nothing to answer
    with pytest.raises(openai.BadRequestError, match="no new tokens for min_tokens"):
        complete(server, max_tokens=0, echo=True, extra_body={"min_tokens": 1})
    full = server.client().completions  # a prompt that fills the context: the hidden token has no room, said so
    with pytest.raises(openai.BadRequestError, match="1024 in the prompt and the one that echo with max_tokens 0"):
        full.create(model=MODEL, prompt=[1] * 1024, max_tokens=0, echo=True)


def test_a_streamed_echo_is_the_whole_answers(server: Server) -> None:
    whole = complete(server, max_tokens=6, logprobs=1, echo=True, n=2).choices
    stream = complete(server, max_tokens=6, logprobs=1, echo=True, n=2, stream=True)
    texts, logprobs = ["", ""], [[], []]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            logprobs[choice.index] += choice.logprobs.token_logprobs if choice.logprobs else []
    for index in range(2):
        assert texts[index] == whole[index].text and logprobs[index] == whole[index].logprobs.token_logprobs


def test_an_echo_of_token_ids_is_their_text(server: Server, native: Pipeline) -> None:
    """As lm-evaluation-harness sends its requests by default: the prompt's ids, echoed as their text."""
    ids = native.encode(PROMPT)
    by_ids = server.client().completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0, logprobs=1,
                                                echo=True).choices[0]  # fmt: skip
    by_text = complete(server, max_tokens=3, logprobs=1, echo=True).choices[0]
    assert by_ids.text == by_text.text and by_ids.logprobs == by_text.logprobs


def test_an_echoed_answer_ending_at_its_end_token_gives_that_tokens_logprob() -> None:
    """An evaluation reads the last entry as the generated token's: the end-of-sequence token keeps its entry."""
    from conftest import tiny_pipeline

    pipeline = tiny_pipeline()
    eos = next(iter(pipeline.eos_token_ids))
    with serving(pipeline) as running:
        choice = running.client().completions.create(model=MODEL, prompt="w1 w2 w3", max_tokens=1, logprobs=1,
                                                     echo=True, logit_bias={str(eos): 100})  # fmt: skip
    assert choice.choices[0].finish_reason == "stop" and len(choice.choices[0].logprobs.token_logprobs) == 3 + 1


def test_an_echo_that_cannot_be_is_a_clear_400(server: Server) -> None:
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="cannot go with a suffix"):
        client.completions.create(model=MODEL, max_tokens=2, echo=True, prompt=PROMPT, suffix="w1")
    with pytest.raises(openai.BadRequestError, match="goes to /v1/completions"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w1"}], max_tokens=2,
                                       extra_body={"echo": True})  # fmt: skip
