"""Log-probabilities of the new tokens: the target's own at each position, the same with and without speculation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import native_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.engine import Event, Request, TokenDelta
from quickdraft.engine.logprobs import token_logprobs
from quickdraft.errors import ConfigError

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def native() -> Pipeline:
    return native_pipeline()


@pytest.mark.parametrize(
    "sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=10, seed=5)], ids=["greedy", "seeded"]
)
def test_speculation_does_not_change_the_logprobs(native: Pipeline, sampling: SamplingParams) -> None:
    config = GenerationConfig(max_new_tokens=16, sampling=sampling, logprobs=4)
    plain = native.generate(PROMPT, config, drafter="none")
    assert plain.logprobs is not None and [entry.token_id for entry in plain.logprobs] == plain.token_ids
    for drafter, policy in [("draft-model", "fixed:3"), ("hybrid", "goodput"), ("prompt-lookup", "fixed:5")]:
        speculative = native.generate(PROMPT, replace(config, policy=policy), drafter)
        assert speculative.stats.draft_tokens_proposed > 0 or drafter != "draft-model"
        assert speculative.token_ids == plain.token_ids and speculative.logprobs == plain.logprobs, drafter


def test_a_logprob_is_the_targets_distribution_at_its_position(native: Pipeline) -> None:
    result = native.generate(PROMPT, GenerationConfig(max_new_tokens=6, logprobs=3), drafter="none")
    context = torch.tensor([PROMPT + result.token_ids[:-1]])
    logits = native.target.forward(context, native.target.new_cache(1))[0, len(PROMPT) - 1 :]  # [6, V]
    expected = torch.log_softmax(logits, dim=-1)
    assert result.logprobs is not None
    for row, entry in zip(expected, result.logprobs, strict=True):
        assert entry.logprob == pytest.approx(float(row[entry.token_id]), abs=1e-5)
        assert entry.top[0][0] == entry.token_id  # greedy: the likeliest
        assert [token for token, _ in entry.top] == row.topk(3).indices.tolist()


def test_sampled_logprobs_come_from_the_distribution_drawn_from() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    (entry,) = token_logprobs(logits, [1], SamplingParams(temperature=0.5, top_k=2), top=3)
    assert entry.logprob == pytest.approx(float(torch.log_softmax(torch.tensor([4.0, 2.0]), 0)[1]))
    assert [token for token, _ in entry.top] == [0, 1]  # the third is outside top-k: probability 0, no alternative
    (entry,) = token_logprobs(logits, [1], SamplingParams(), top=20)  # more asked for than the vocabulary holds
    assert [token for token, _ in entry.top] == [0, 1, 2, 3]


def test_logprobs_are_off_unless_asked_and_checked() -> None:
    assert GenerationConfig().logprobs is None
    for bad in (-1, 21, 2.5, True):
        with pytest.raises(ConfigError, match="logprobs"):
            GenerationConfig(logprobs=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("drafter", "policy"), [("none", None), ("draft-model", "fixed:3")])
def test_logprobs_cover_the_answers_text_and_no_stop_string(native: Pipeline, drafter: str, policy: str | None) -> None:
    """A stop string's tokens are not shown, streamed or not: the log-probabilities stream with their text."""
    plain = native.generate(PROMPT, GenerationConfig(max_new_tokens=16), drafter="none")
    stop = native.tokenizer.decode(plain.token_ids[6:8])  # two tokens' text: where the answer stops
    config = GenerationConfig(max_new_tokens=16, logprobs=2, stop=stop, policy=policy)
    events: list[Event] = []
    native.engine.submit(Request(tuple(PROMPT), config, native.drafter(drafter)), events.append)
    native.engine.run_until_idle()
    result = events[-1].result  # type: ignore[union-attr]
    assert result.finish_reason == "stop" and stop not in result.text
    starts = [len(native.tokenizer.decode(result.token_ids[:i])) for i in range(len(result.token_ids))]
    shown = sum(start < len(result.text) for start in starts)  # tokens whose text begins in the answer
    assert [entry.token_id for entry in result.logprobs] == result.token_ids[:shown] and shown < len(result.token_ids)
    streamed = [entry for event in events if isinstance(event, TokenDelta) for entry in event.logprobs]
    assert streamed == result.logprobs


@pytest.mark.parametrize("chunk", [128, 3], ids=["whole", "in-chunks"])
def test_prompt_logprobs_are_the_models_own_at_every_prompt_position(chunk: int) -> None:
    """vLLM's prompt_logprobs: each prompt token after the first, its log-probability (the model's own, whatever the
    sampling) and the likeliest at its position; the same bits read whole or in chunks of 3, alone or beside another
    request, with or without speculation, and never from a cached prefix."""
    from quickdraft.engine import Engine, SchedulerSettings
    from quickdraft.engine.prefix_cache import PrefixCache

    pipeline = native_pipeline()
    target = pipeline.target
    prefix_cache = PrefixCache(2**20, target.cache_bytes, target.copy_prefix, min_tokens=2)
    settings = SchedulerSettings(prefill_tokens_per_step=chunk)
    engine = Engine(target, pipeline.tokenizer, pipeline.eos_token_ids, settings, prefix_cache=prefix_cache)
    logits = pipeline.target.forward(torch.tensor([PROMPT]), pipeline.target.new_cache(1))[0]  # [P, V]
    expected = token_logprobs(logits, PROMPT[1:], SamplingParams(temperature=0.0), 3)
    config = GenerationConfig(max_new_tokens=4, prompt_logprobs=3, sampling=SamplingParams(temperature=0.7, seed=1))
    for drafter in ("none", "draft-model", "none"):  # the last after the first's prompt was kept as a prefix
        events: list[Event] = []
        engine.submit(Request(tuple(PROMPT), config, pipeline.drafter(drafter)), events.append)
        engine.submit(Request((7, 7, 7), GenerationConfig(max_new_tokens=4), pipeline.drafter("none")), events.append)
        engine.run_until_idle()
        (result,) = [
            event.result for event in events if getattr(event, "result", None) and event.result.prompt_logprobs
        ]
        assert result.prompt_logprobs == expected and result.stats.cached_prompt_tokens == 0, drafter
        streamed = [
            event.prompt_logprobs for event in events if isinstance(event, TokenDelta) and event.prompt_logprobs
        ]
        assert streamed[0] == tuple(expected) and not any(streamed[1:])  # with the first delta only
    assert pipeline.generate(PROMPT, GenerationConfig(max_new_tokens=2), drafter="none").prompt_logprobs is None
    for bad in (-1, 21, 2.5, True):
        with pytest.raises(ConfigError, match="prompt_logprobs"):
            GenerationConfig(prompt_logprobs=bad)  # type: ignore[arg-type]
