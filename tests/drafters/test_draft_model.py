"""The draft-model drafter: its caches follow the committed tokens lazily, are rolled back exactly, outlive their
request for the next one that starts alike, and draft for several requests in one batched forward each."""

from __future__ import annotations

import pytest
import torch
from conftest import draft_task, native_pipeline, use_records

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.costs import CostModel
from quickdraft.drafters import DrafterRecords
from quickdraft.drafters.draft_model import KEPT_CACHES, DraftModelDrafter, DraftModelState
from quickdraft.policies import AcceptanceRecord, DraftStep

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


def fresh_drafter(pipeline: Pipeline) -> DraftModelDrafter:
    return DraftModelDrafter(pipeline.draft, pipeline.target.vocab_size)  # type: ignore[arg-type]


def start(drafter: DraftModelDrafter, prompt: list[int]) -> DraftModelState:
    state = drafter.start(prompt, target_cache=None)  # type: ignore[arg-type]  # the draft model needs no target cache
    assert isinstance(state, DraftModelState)
    return state


def test_draft_cache_rollback_matches_fresh_prefill(pipeline: Pipeline) -> None:
    sampling = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    context = [3, 1, 4, 1, 5]
    drafter = fresh_drafter(pipeline)
    state = start(drafter, context)
    (proposal,) = drafter.propose([draft_task(state, context, 4, sampling, generator)])
    first = int(proposal.token_ids[0, 0])
    rejected_second = (int(proposal.token_ids[0, 1]) + 1) % 31  # the target's correction at position 2
    accepted = [*context, first, rejected_second]
    after_rollback = drafter.propose([draft_task(state, accepted, 1, sampling, generator)])[0].probs
    fresh_drafter_ = fresh_drafter(pipeline)
    fresh = fresh_drafter_.propose([draft_task(start(fresh_drafter_, context), accepted, 1, sampling, generator)])
    assert after_rollback is not None and fresh[0].probs is not None
    torch.testing.assert_close(after_rollback, fresh[0].probs, rtol=1e-4, atol=1e-5)
    assert state.conversation.cached_ids == accepted


def test_requests_drafted_together_get_what_each_gets_alone() -> None:
    """Three requests of different lengths, budgets and sampling, in batched forwards: bitwise each one's drafts
    and distributions alone (the native runtime's rows never mix)."""
    pipeline = native_pipeline()
    contexts = [[1, 2, 3], [7, 8, 9, 10, 11, 12], [4, 4, 5]]
    gammas = [3, 1, 4]
    samplings = [SamplingParams(), SamplingParams(temperature=0.8, seed=5), SamplingParams(temperature=1.0, top_k=4)]

    def proposals(together: bool) -> list:
        drafter = fresh_drafter(pipeline)
        tasks = [
            draft_task(start(drafter, context), context, gamma, sampling, torch.Generator().manual_seed(i))
            for i, (context, gamma, sampling) in enumerate(zip(contexts, gammas, samplings, strict=True))
        ]
        if together:
            return drafter.propose(tasks)
        return [drafter.propose([task])[0] for task in tasks]

    for together, alone, sampling in zip(proposals(True), proposals(False), samplings, strict=True):
        assert torch.equal(together.token_ids, alone.token_ids)
        if sampling.is_unseeded:  # the only rule that reads q
            assert together.probs is not None and alone.probs is not None and torch.equal(together.probs, alone.probs)
        else:
            assert together.probs is None and alone.probs is None
    assert [proposal.num_tokens for proposal in proposals(True)] == gammas


def test_a_request_stops_drafting_when_its_policy_says_so(pipeline: Pipeline) -> None:
    drafter = fresh_drafter(pipeline)
    seen: list[DraftStep] = []

    def two_then_stop(step: DraftStep) -> bool:
        seen.append(step)
        return step.num_drafted < 2

    (proposal,) = drafter.propose([draft_task(start(drafter, PROMPT), PROMPT, 6, keep_drafting=two_then_stop)])
    assert proposal.num_tokens == 2 and [step.num_drafted for step in seen] == [1, 2]
    assert seen[0].hidden is not None and seen[0].hidden.shape == (1, pipeline.draft.hidden_size)  # for specdec++


def test_a_long_backlog_is_read_in_chunks_before_drafting(pipeline: Pipeline) -> None:
    drafter = fresh_drafter(pipeline)
    state = start(drafter, PROMPT)
    for read in (4, 8):
        (proposal,) = drafter.propose([draft_task(state, PROMPT, 3)], max_read_tokens=4)
        assert proposal.num_tokens == 0 and len(state.conversation.cached_ids) == read
    (proposal,) = drafter.propose([draft_task(state, PROMPT, 3)], max_read_tokens=4)
    assert proposal.num_tokens == 3  # the rest of the prompt, then its drafts


def test_a_finished_requests_cache_serves_the_next_that_starts_alike(pipeline: Pipeline) -> None:
    drafter = fresh_drafter(pipeline)
    first = start(drafter, PROMPT)
    drafter.propose([draft_task(first, PROMPT, 2)])
    drafter.finish(first)
    other = start(drafter, [30, 29])  # shares nothing: a cache of its own
    assert other.conversation is not first.conversation
    again = start(drafter, [*PROMPT[:5], 8, 8])
    assert again.conversation is first.conversation  # shares the first five tokens
    assert again.conversation.backlog([*PROMPT[:5], 8, 8]) == 2
    for _ in range(KEPT_CACHES + 2):
        drafter.finish(start(drafter, [30]))
    assert len(drafter.kept) == KEPT_CACHES


@pytest.fixture
def fed(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Tokens per draft-model forward, recorded while the test runs; the draft model starts with no
    conversation cached (another test's would be reused)."""
    pipeline.drafter("draft-model").forget()
    sizes: list[int] = []
    forward = pipeline.draft.forward_with_hidden  # type: ignore[union-attr]

    def counting_forward(token_ids: torch.Tensor, *args: object, **kwargs: object) -> object:
        sizes.append(int(token_ids.shape[1]))
        return forward(token_ids, *args, **kwargs)

    monkeypatch.setattr(pipeline.draft, "forward_with_hidden", counting_forward)
    return sizes


def test_draft_model_reads_the_prompt_only_when_it_first_drafts(pipeline: Pipeline, fed: list[int]) -> None:
    pipeline.generate(PROMPT, GenerationConfig(max_new_tokens=6, policy="fixed:0"), "draft-model")
    assert fed == []  # plain steps only: the draft model never ran
    pipeline.generate(PROMPT, GenerationConfig(max_new_tokens=6, num_draft_tokens=2), "draft-model")
    assert fed[0] == len(PROMPT) + 1  # the prompt and the target's first token, in one forward


def test_draft_model_reads_only_what_a_next_turn_adds(pipeline: Pipeline, fed: list[int]) -> None:
    config = GenerationConfig(max_new_tokens=6, num_draft_tokens=2)
    first_turn = pipeline.generate(PROMPT, config, "draft-model").token_ids
    next_turn = [*PROMPT, *first_turn, 7, 8, 9]  # the conversation so far and a new message
    plain = pipeline.generate(next_turn, config, drafter="none").token_ids
    fed.clear()
    assert pipeline.generate(next_turn, config, "draft-model").token_ids == plain
    assert 0 < fed[0] <= len(first_turn) + 3 + 1  # not the first turn's prompt again
    pipeline.drafter("draft-model").forget()
    fed.clear()
    assert pipeline.generate(next_turn, config, "draft-model").token_ids == plain
    assert fed[0] == len(next_turn) + 1  # a forgotten conversation is read whole


def test_goodput_leaves_a_prompt_unread_when_reading_it_cannot_pay(
    pipeline: Pipeline, fed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cheap_verify = {1: 100.0, 2: 100.01, 4: 100.02, 8: 100.04, 17: 100.08}  # shifted to the tiny model's real step
    plain = pipeline.generate(PROMPT, GenerationConfig(max_new_tokens=8), drafter="none").token_ids
    for prefill_ms, drafts in (({1: 1e6}, False), ({1: 1e-3}, True)):  # a token costs 1000 s / 1 µs to read
        cost_model = CostModel(cheap_verify, draft_ms=0.001, draft_prefill_ms=prefill_ms)
        records = DrafterRecords(acceptance=AcceptanceRecord.independent(99, 1), cost_model=cost_model)
        use_records(monkeypatch, pipeline, "draft-model", records)  # no other test's timings nor answers
        fed.clear()
        result = pipeline.generate(PROMPT, GenerationConfig(max_new_tokens=8, policy="goodput"), "draft-model")
        assert bool(fed) == drafts
        assert result.token_ids == plain


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0), SamplingParams()], ids=["sampled", "greedy"])
def test_a_draft_wider_than_the_target_proposes_only_the_targets_ids(sampling: SamplingParams) -> None:
    """A draft vocabulary up to 128 ids wider (llama.cpp's pairing rule): ids the target lacks are never drafted, and
    the distribution recorded for verification is the one drafted from (renormalized over the target's ids)."""
    from conftest import native_from_hf, tiny_model

    wide = native_from_hf(tiny_model(40, seed=5))  # 8 ids past the target's 32
    drafter = DraftModelDrafter(wide, target_vocab_size=32)
    for seed in range(8):
        state = start(drafter, PROMPT)
        task = draft_task(state, PROMPT, 4, sampling, torch.Generator().manual_seed(seed))
        (proposal,) = drafter.propose([task])
        assert proposal.probs is None or proposal.probs.shape[-1] == 32
        assert (proposal.token_ids < 32).all()
        if proposal.probs is not None and proposal.num_tokens:
            sums = proposal.probs[0, : proposal.num_tokens].sum(-1)
            torch.testing.assert_close(sums, torch.ones_like(sums))
