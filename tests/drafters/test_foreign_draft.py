"""A draft model with a tokenizer of its own, through the one engine: greedy string-level and sampled TLI drafts are
lossless, and a same-vocabulary pair run through the translation accepts what it accepts directly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import draft_task, foreign_pipeline

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams

VOCAB = 48
PROMPT = [1, 5, 9, 5, 9, 3, 7, 2]
GREEDY = GenerationConfig(max_new_tokens=40, policy="fixed:3")
SEEDED = replace(GREEDY, sampling=SamplingParams(temperature=0.8, seed=3))


@pytest.fixture(scope="module")
def pipelines() -> tuple[Pipeline, Pipeline]:
    return foreign_pipeline()


@pytest.mark.parametrize("drafter", ["draft-model", "hybrid", "hybrid-suffix"])
@pytest.mark.parametrize("config", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_foreign_drafts_give_the_targets_own_tokens(
    pipelines: tuple[Pipeline, Pipeline], drafter: str, config: GenerationConfig
) -> None:
    _, foreign = pipelines
    plain = foreign.generate(PROMPT, config, drafter="none")
    speculative = foreign.generate(PROMPT, config, drafter=drafter)
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.draft_tokens_accepted > 0.5 * speculative.stats.draft_tokens_proposed


def test_through_the_bridge_a_pair_accepts_what_it_accepts_directly(pipelines: tuple[Pipeline, Pipeline]) -> None:
    """The control: the same draft behind the translation. Seeded TLI drafts the very tokens the direct path drafts
    (the draft's own words have no mass there); greedy string-level may prefer a word of its own, rarely."""
    direct, foreign = pipelines
    for config, tolerance in ((SEEDED, 0), (GREEDY, 3)):
        one, other = (p.generate(PROMPT, config, drafter="draft-model").stats for p in (direct, foreign))
        assert one.draft_tokens_proposed == other.draft_tokens_proposed
        assert abs(one.draft_tokens_accepted - other.draft_tokens_accepted) <= tolerance


def test_unseeded_foreign_drafts_carry_their_distribution(pipelines: tuple[Pipeline, Pipeline]) -> None:
    """Unseeded sampling: the drafts' q is TLI's, over the target's ids, zero where the draft cannot propose."""
    _, foreign = pipelines
    drafter = foreign.drafter("draft-model")
    state = drafter.start(PROMPT, foreign.target.new_cache(1))
    sampling = SamplingParams(temperature=1.0)
    (proposal,) = drafter.propose([draft_task(state, PROMPT, 3, sampling)])
    assert proposal.probs is not None and proposal.probs.shape == (1, proposal.num_tokens, VOCAB)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(1, proposal.num_tokens))
    for i, token in enumerate(proposal.token_ids[0].tolist()):
        assert proposal.probs[0, i, token] > 0
