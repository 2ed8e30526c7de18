"""The sampling law through the batched engine: tiny random bigram models, the χ² test of ``test_engine.py``.

Requests run 100 at a time, so every step verifies many requests together; each request's new tokens 2, 3
and 4 are counted (drafts, corrections, and the bonus of a step whose two drafts passed) and compared with the
target's exact distribution. Negative controls plug a wrong rule and a wrong bonus token into the batched
engine; the same test rejects them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from conftest import chi_square_pvalue
from test_engine import (
    FITS,
    PROMPT_FOR,
    REJECTED,
    SAMPLES,
    TOP_P_SAMPLING,
    VOCAB,
    WINDOW_CONFIG,
    every_third_bonus_to_token_0,
    table_pipeline,
    window_distribution,
    wrong_rule,
)

import quickdraft.engine
import quickdraft.serving.engine
from quickdraft.sampling import SamplingParams
from quickdraft.serving import BatchEngine, RequestFinished, SchedulerSettings, ServeRequest

PROMPT = (1, 2)
AT_ONCE = 100  # requests in flight together


@pytest.fixture
def numbered_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unseeded requests draw from generators seeded 0, 1, 2, ... in the order they are submitted."""
    seeds = itertools.count()
    monkeypatch.setattr(
        quickdraft.serving.engine, "make_generator", lambda seed: torch.Generator().manual_seed(next(seeds))
    )


def batched_window(
    sampling: SamplingParams, seeded: bool, drafter: str = "draft-model", prompt: tuple[int, ...] = PROMPT
) -> torch.Tensor:
    """Counts ``[V, V, V]`` of new tokens 2, 3, 4 over SAMPLES requests, AT_ONCE in flight at a time."""
    pipeline = table_pipeline()
    engine = BatchEngine(
        pipeline.target,
        pipeline.tokenizer,
        pipeline.eos_token_ids,
        draft=pipeline.draft,
        settings=SchedulerSettings(  # prompts of a whole batch read in one step
            max_running=AT_ONCE, max_waiting=SAMPLES, prefill_tokens_per_step=AT_ONCE * len(prompt)
        ),
    )
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    decoded: list[list[int]] = []

    def sink(event: object) -> None:
        if isinstance(event, RequestFinished):
            decoded.append(event.result.token_ids)

    for run in range(SAMPLES):
        config = replace(WINDOW_CONFIG, sampling=replace(sampling, seed=run if seeded else None), policy="fixed:2")
        engine.submit(ServeRequest(prompt, config, drafter), sink)
    steps = 0
    while engine.step() is not None:
        steps += 1
    assert len(decoded) == SAMPLES and steps < 4 * SAMPLES / AT_ONCE + 4  # many requests per step
    for token_ids in decoded:
        counts[tuple(token_ids[1:4])] += 1
    return counts


def batched_pvalue(sampling: SamplingParams, seeded: bool, drafter: str = "draft-model") -> float:
    prompt = PROMPT if drafter == "draft-model" else tuple(PROMPT_FOR[drafter])
    expected = window_distribution(table_pipeline().target, list(prompt), sampling)
    return chi_square_pvalue(batched_window(sampling, seeded, drafter, prompt), expected)


RULES = pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
@pytest.mark.parametrize("drafter", ["draft-model", "hybrid"])
def test_batched_sampling_follows_the_target_distribution(seeded: bool, drafter: str) -> None:
    assert batched_pvalue(TOP_P_SAMPLING, seeded, drafter) > FITS


@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_acceptance_rule_in_the_batched_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quickdraft.engine, "rejection_sample", wrong_rule)
    assert batched_pvalue(TOP_P_SAMPLING, seeded=False) < REJECTED


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_bonus_token_in_the_batched_engine(
    seeded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every third bonus token (all drafts accepted) replaced by token 0."""
    wrong = every_third_bonus_to_token_0(quickdraft.serving.engine.verify_drafts)
    monkeypatch.setattr(quickdraft.serving.engine, "verify_drafts", wrong)
    assert batched_pvalue(TOP_P_SAMPLING, seeded) < REJECTED
