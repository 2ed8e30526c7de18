"""A draft model with a tokenizer of its own, through the one engine: greedy string-level and sampled TLI drafts are
lossless, and a same-vocabulary pair run through the translation accepts what it accepts directly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import draft_task, listed_tokenizer, native_from_hf, native_pipeline, tiny_model

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.vocabularies import VocabularyBridge

VOCAB = 48
EXTRA_WORDS = ("x0", "x1")  # words only the draft has
PROMPT = [1, 5, 9, 5, 9, 3, 7, 2]
GREEDY = GenerationConfig(max_new_tokens=40, policy="fixed:3")
SEEDED = replace(GREEDY, sampling=SamplingParams(temperature=0.8, seed=3))


def foreign_pipeline() -> tuple[Pipeline, Pipeline]:
    """The same pair twice: :func:`native_pipeline`'s, and its draft with its vocabulary shuffled and two words of
    its own (their rows zero) behind a bridge. A draft id means there what the target's id it came from means."""
    direct = native_pipeline(VOCAB)
    target_words = direct.tokenizer.convert_ids_to_tokens(list(range(VOCAB)))
    order = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0)).tolist()  # draft id -> target id
    draft_words = [target_words[i] for i in order] + list(EXTRA_WORDS)
    noisy = tiny_model(VOCAB, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # native_pipeline's draft: the target with noise on its LM head
        weight = noisy.lm_head.weight
        weight.add_(0.1 * weight.std() * torch.randn(weight.shape, generator=generator))
    shuffled = tiny_model(len(draft_words), seed=0)
    state = noisy.state_dict()
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        state[name] = torch.cat([state[name][order], torch.zeros(len(EXTRA_WORDS), state[name].shape[1])])
    shuffled.load_state_dict(state)
    draft_tokenizer = listed_tokenizer(draft_words)
    bridge = VocabularyBridge(direct.tokenizer, draft_tokenizer, VOCAB, len(draft_words))
    foreign = Pipeline(
        target=direct.target,
        tokenizer=direct.tokenizer,
        eos_token_ids=direct.eos_token_ids,
        draft=native_from_hf(shuffled),
        bridge=bridge,
        mismatch="their token ids mean different text",
    )
    return direct, foreign


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
