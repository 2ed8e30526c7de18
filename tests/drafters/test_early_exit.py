"""Early exit: self-speculation with the target's own first layers, drafting into each request's target cache."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch
from conftest import chi_square_pvalue, native_from_hf, sharp_native_pipeline, tiny_model, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters.early_exit import EarlyExitDrafter
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import logits_to_probs
from quickdraft.runtime.native import NativeRuntime


@pytest.mark.parametrize("prompt_ids", [[1, 2, 3], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
def test_early_exit_drafting_equals_plain_decoding(prompt_ids: list[int]) -> None:
    pipeline = sharp_native_pipeline()
    plain = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=32), drafter="none")
    for gamma in (1, 3, 6):
        result = pipeline.generate(
            prompt_ids, GenerationConfig(max_new_tokens=32, num_draft_tokens=gamma), "early-exit"
        )
        assert result.token_ids == plain.token_ids, gamma
        assert result.stats.draft_tokens_proposed > 0
    drafter = pipeline.drafter("early-exit")
    assert isinstance(drafter, EarlyExitDrafter)
    assert set(drafter.tries) == set(drafter.candidates) and min(drafter.tries.values()) >= 2  # all were tried
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=4, sampling=SamplingParams(1.0, seed=3))
    sampled = pipeline.generate(prompt_ids, config, "early-exit")
    assert sampled.token_ids == pipeline.generate(prompt_ids, config, drafter="none").token_ids  # seeded: plain's
    assert sampled.stats.draft_tokens_proposed > 0


def window_distribution(runtime: NativeRuntime, prompt_ids: list[int], sampling: SamplingParams) -> dict:
    """P(new tokens 2, 3, 4) under plain sampling, by walking every path of nonzero probability."""
    distribution: dict[tuple[int, ...], float] = defaultdict(float)

    def walk(token_ids: list[int], probability: float) -> None:
        if len(token_ids) == len(prompt_ids) + 4:
            distribution[tuple(token_ids[len(prompt_ids) + 1 :])] += probability
            return
        logits = runtime.forward(torch.tensor([token_ids]), runtime.new_cache(1), last_only=True)[0, -1]  # [V]
        probs = logits_to_probs(logits, sampling).double()  # [V]
        for token in probs.nonzero().flatten().tolist():
            walk([*token_ids, token], probability * float(probs[token]))

    walk(prompt_ids, 1.0)
    return distribution


@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_early_exit_sampled_tokens_follow_the_target_distribution() -> None:
    """Rejection sampling with early-exit drafts, top-k 3: new tokens 2, 3, 4 (drafts, corrections and bonus
    tokens) over 2,000 unseeded runs follow the target's law (χ²). Seeded runs give plain decoding's tokens
    (above), whose law test_engine checks."""
    pipeline = Pipeline(
        target=native_from_hf(tiny_model(64, seed=3, logit_scale=2.0)),
        tokenizer=word_tokenizer(64),
        eos_token_ids=frozenset(),
    )
    sampling, prompt_ids = SamplingParams(temperature=1.0, top_k=3), [1, 2, 3]
    config = GenerationConfig(max_new_tokens=4, num_draft_tokens=2, sampling=sampling)
    windows = Counter(tuple(pipeline.generate(prompt_ids, config, "early-exit").token_ids[1:4]) for _ in range(2_000))
    distribution = window_distribution(pipeline.target, prompt_ids, sampling)
    assert set(windows) <= set(distribution)
    cells = list(distribution)
    counts = torch.tensor([float(windows[cell]) for cell in cells], dtype=torch.float64)
    assert chi_square_pvalue(counts, torch.tensor([distribution[cell] for cell in cells])) > 1e-4
    drafter = pipeline.drafter("early-exit")
    assert isinstance(drafter, EarlyExitDrafter) and sum(drafter.tries.values()) > 0


def test_early_exit_needs_a_runtime_that_exits_early(pipeline: Pipeline) -> None:
    with pytest.raises(ConfigError, match=r"cannot exit early: use the native runtime$"):  # the CLI adds its flag
        pipeline.drafter("early-exit")
