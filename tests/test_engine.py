"""The engine loop on tiny random models: greedy equality, exact sampling law, rollback, stopping."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from conftest import BigramTableRuntime, chi_square_pvalue, tiny_pipeline, word_tokenizer

import quickdraft.engine
from quickdraft.api import Pipeline
from quickdraft.bench.peers import hf_greedy_generate
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.costs import CostModel
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.errors import PromptError
from quickdraft.memory import DrafterMemory
from quickdraft.policies import (
    UNKNOWN_STATE,
    AcceptanceRecord,
    AnswerLength,
    FixedPolicy,
    Policy,
    StepState,
)
from quickdraft.sampling import logits_to_probs, sample
from quickdraft.verify import VerificationResult

PROMPTS = [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [7] * 12, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def hf_greedy(pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = pipeline.target.model
    return hf_greedy_generate(
        model, prompt_ids, max_new_tokens, pipeline.eos_token_ids, pipeline.tokenizer.eos_token_id
    )


@pytest.mark.parametrize("prompt_ids", PROMPTS)
def test_greedy_speculation_equals_plain_and_transformers(pipeline: Pipeline, prompt_ids: list[int]) -> None:
    plain = pipeline.engine("none").generate(prompt_ids, GenerationConfig(max_new_tokens=24))
    assert plain.stats.mean_accepted_tokens == 1.0
    assert plain.token_ids == hf_greedy(pipeline, prompt_ids, 24)
    for drafter, gamma in itertools.product(["draft-model", "prompt-lookup", "hybrid"], [1, 2, 4, 7]):
        result = pipeline.engine(drafter).generate(
            prompt_ids, GenerationConfig(max_new_tokens=24, num_draft_tokens=gamma)
        )
        assert result.token_ids == plain.token_ids, (drafter, gamma)
        assert result.text == plain.text


def test_speculation_commits_several_tokens_per_target_forward(pipeline: Pipeline) -> None:
    result = pipeline.engine("prompt-lookup").generate(PROMPTS[2], GenerationConfig(max_new_tokens=24))
    stats = result.stats
    assert stats.draft_tokens_proposed > 0 and stats.draft_tokens_accepted > 0
    assert stats.target_forwards < stats.new_tokens
    assert stats.mean_accepted_tokens == stats.new_tokens / stats.target_forwards
    assert stats.acceptance_rate == stats.draft_tokens_accepted / stats.draft_tokens_proposed


@pytest.mark.parametrize(("drafter", "gamma"), [("none", 0), ("draft-model", 3), ("prompt-lookup", 5), ("hybrid", 4)])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 5])
def test_token_budget_is_exact(pipeline: Pipeline, drafter: str, gamma: int, max_new_tokens: int) -> None:
    result = pipeline.engine(drafter).generate(
        PROMPTS[1], GenerationConfig(max_new_tokens=max_new_tokens, num_draft_tokens=gamma)
    )
    assert len(result.token_ids) == result.stats.new_tokens == max_new_tokens
    assert result.finish_reason == "length"


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_stream_deltas_add_up_to_the_text(pipeline: Pipeline, drafter: str) -> None:
    stream = pipeline.engine(drafter).stream(PROMPTS[3], GenerationConfig(max_new_tokens=16))
    deltas = list(stream)
    assert stream.result is not None and "".join(deltas) == stream.result.text
    assert len(deltas) > 1


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_end_of_sequence_stops_and_is_kept(pipeline: Pipeline, drafter: str) -> None:
    plain = pipeline.engine("none").generate(PROMPTS[3], GenerationConfig(max_new_tokens=16))
    eos = plain.token_ids[5]
    engine = pipeline.engine(drafter)
    engine.eos_token_ids = frozenset({eos})
    result = engine.generate(PROMPTS[3], GenerationConfig(max_new_tokens=16, num_draft_tokens=4))
    assert result.finish_reason == "eos"
    assert result.token_ids == plain.token_ids[: plain.token_ids.index(eos) + 1]


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_stop_string_ends_text_before_it(pipeline: Pipeline, drafter: str) -> None:
    plain = pipeline.engine("none").generate(PROMPTS[3], GenerationConfig(max_new_tokens=16))
    words = plain.text.split(" ")
    stop = " ".join(words[4:6])
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=4, stop=(stop,))
    stream = pipeline.engine(drafter).stream(PROMPTS[3], config)
    streamed = "".join(stream)
    result = stream.result
    assert result is not None and result.finish_reason == "stop"
    assert result.text == streamed == plain.text[: plain.text.index(stop)]
    assert result.token_ids == plain.token_ids[: len(result.token_ids)]
    assert stop in pipeline.tokenizer.decode(result.token_ids)
    assert stop not in pipeline.tokenizer.decode(result.token_ids[:-1])


def test_prompt_errors(pipeline: Pipeline) -> None:
    engine = pipeline.engine("none")
    with pytest.raises(PromptError, match="empty"):
        engine.generate([], GenerationConfig())
    with pytest.raises(PromptError, match="context holds 512"):
        engine.generate([1] * 510, GenerationConfig(max_new_tokens=5))
    with pytest.raises(PromptError, match="empty"):
        pipeline.encode("   ")


def test_seeded_sampling_is_reproducible(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingParams(temperature=1.0, top_k=8, seed=3))
    first = pipeline.engine("draft-model").generate(PROMPTS[0], config)
    assert first.token_ids == pipeline.engine("draft-model").generate(PROMPTS[0], config).token_ids
    other_seeds = [replace(config, sampling=replace(config.sampling, seed=seed)) for seed in (4, 5, 2**64 - 1)]
    others = {tuple(pipeline.engine("draft-model").generate(PROMPTS[0], other).token_ids) for other in other_seeds}
    assert len(others | {tuple(first.token_ids)}) == 4


@pytest.mark.parametrize("seed", [None, 7])
def test_a_tiny_temperature_gives_the_greedy_tokens(pipeline: Pipeline, seed: int | None) -> None:
    greedy = pipeline.engine("none").generate(PROMPTS[3], GenerationConfig(max_new_tokens=12)).token_ids
    sampling = SamplingParams(temperature=1e-300, seed=seed)
    for drafter in ("none", "draft-model"):
        config = GenerationConfig(max_new_tokens=12, num_draft_tokens=3, sampling=sampling)
        assert pipeline.engine(drafter).generate(PROMPTS[3], config).token_ids == greedy, drafter


def test_target_cache_rollback_matches_fresh_prefill(pipeline: Pipeline) -> None:
    target, prefix, drafts = pipeline.target, [3, 1, 4, 1, 5], [9, 2, 6, 5]
    cache = target.new_cache(1)
    target.forward(torch.tensor([prefix]), cache)
    target.forward(torch.tensor([drafts]), cache)  # a verify block
    cache.truncate(len(prefix) + 1)  # only the first draft was accepted
    assert cache.lengths.tolist() == [len(prefix) + 1]
    after_rollback = target.forward(torch.tensor([[7]]), cache)[:, -1]
    fresh = target.forward(torch.tensor([[*prefix, drafts[0], 7]]), target.new_cache(1))[:, -1]
    torch.testing.assert_close(after_rollback, fresh, rtol=1e-4, atol=1e-4)


def test_draft_cache_rollback_matches_fresh_prefill(pipeline: Pipeline) -> None:
    sampling = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    context = [3, 1, 4, 1, 5]
    drafter = DraftModelDrafter(pipeline.draft, pipeline.target.vocab_size)
    drafter.prefill([context])
    proposal = drafter.propose([context], 4, sampling, generator)
    first = int(proposal.token_ids[0, 0])
    rejected_second = (int(proposal.token_ids[0, 1]) + 1) % 31  # the target's correction at position 2
    accepted = [*context, first, rejected_second]
    after_rollback = drafter.propose([accepted], 1, sampling, generator).probs
    fresh_drafter = DraftModelDrafter(pipeline.draft, pipeline.target.vocab_size)
    fresh_drafter.prefill([accepted[:-1]])
    fresh = fresh_drafter.propose([accepted], 1, sampling, generator).probs
    assert after_rollback is not None and fresh is not None
    torch.testing.assert_close(after_rollback, fresh, rtol=1e-4, atol=1e-5)
    assert drafter.cached_ids == accepted


@pytest.fixture
def fed(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Tokens per draft-model forward, recorded while the test runs; the draft model starts with no
    conversation cached (another test's would be reused)."""
    pipeline.engine("draft-model").drafter.forget()
    sizes: list[int] = []
    forward = pipeline.draft.forward_with_hidden

    def counting_forward(token_ids: torch.Tensor, *args: object, **kwargs: object) -> object:
        sizes.append(int(token_ids.shape[1]))
        return forward(token_ids, *args, **kwargs)

    monkeypatch.setattr(pipeline.draft, "forward_with_hidden", counting_forward)
    return sizes


def test_draft_model_reads_the_prompt_only_when_it_first_drafts(pipeline: Pipeline, fed: list[int]) -> None:
    engine, prompt_ids = pipeline.engine("draft-model"), PROMPTS[3]
    engine.generate(prompt_ids, GenerationConfig(max_new_tokens=6, policy="fixed:0"))
    assert fed == []  # plain steps only: the draft model never ran
    assert engine.drafter.backlog([[*prompt_ids, 1]]) == len(prompt_ids) + 1
    engine.generate(prompt_ids, GenerationConfig(max_new_tokens=6, num_draft_tokens=2))
    assert fed[0] == len(prompt_ids) + 1  # the prompt and the target's first token, in one forward


def test_draft_model_reads_only_what_a_next_turn_adds(pipeline: Pipeline, fed: list[int]) -> None:
    engine, config = pipeline.engine("draft-model"), GenerationConfig(max_new_tokens=6, num_draft_tokens=2)
    first_turn = engine.generate(PROMPTS[3], config).token_ids
    next_turn = [*PROMPTS[3], *first_turn, 7, 8, 9]  # the conversation so far and a new message
    plain = pipeline.engine("none").generate(next_turn, config).token_ids
    fed.clear()
    assert engine.generate(next_turn, config).token_ids == plain
    assert 0 < fed[0] <= len(first_turn) + 3 + 1  # not the first turn's prompt again
    engine.drafter.forget()
    fed.clear()
    assert engine.generate(next_turn, config).token_ids == plain
    assert fed[0] == len(next_turn) + 1  # a forgotten conversation is read whole


def test_goodput_leaves_a_prompt_unread_when_reading_it_cannot_pay(
    pipeline: Pipeline, fed: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    cheap_verify = {1: 100.0, 2: 100.01, 4: 100.02, 8: 100.04, 17: 100.08}  # shifted to the tiny model's real step
    plain = pipeline.engine("none").generate(PROMPTS[3], GenerationConfig(max_new_tokens=8)).token_ids
    for prefill_ms, drafts in (({1: 1e6}, False), ({1: 1e-3}, True)):  # a token costs 1000 s / 1 µs to read
        cost_model = CostModel(cheap_verify, draft_ms=0.001, draft_prefill_ms=prefill_ms)
        memory = DrafterMemory(acceptance=AcceptanceRecord.independent(99, 1), cost_model=cost_model)
        monkeypatch.setitem(pipeline.memories, "draft-model", memory)  # no other test's timings nor answers
        fed.clear()
        config = GenerationConfig(max_new_tokens=8, policy="goodput")
        result = pipeline.engine("draft-model").generate(PROMPTS[3], config)
        assert bool(fed) == drafts
        assert result.token_ids == plain


class AlternatingPolicy(Policy):
    """γ = 0, 2, 0, 2, …; records which tokens it saw as plain and how many drafts each step proposed."""

    def __init__(self) -> None:
        self.chosen: list[int] = []
        self.proposed: list[int] = []
        self.plain_logits: list[torch.Tensor] = []
        self.step_times: list[tuple[int, float]] = []
        self.ends: list[AnswerLength] = []

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        self.chosen.append(0 if len(self.chosen) % 2 == 0 else 2)
        return self.chosen[-1]

    def observe(self, proposed: int, accepted: int) -> None:
        self.proposed.append(proposed)

    def observe_plain(self, target_logits: torch.Tensor) -> None:
        self.plain_logits.append(target_logits)

    def observe_step_time(self, proposed: int, elapsed_ms: float) -> None:
        self.step_times.append((proposed, elapsed_ms))

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:
        self.ends.append(AnswerLength(num_tokens, cut_by_budget))


def test_policy_sees_the_target_logits_of_every_plain_token(pipeline: Pipeline) -> None:
    """The prompt's last position and each step that proposed nothing; never a step with drafts."""
    policy = AlternatingPolicy()
    pipeline.engine("draft-model").generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), policy)
    assert policy.chosen[:4] == [0, 2, 0, 2] and policy.proposed[:4] == [0, 2, 0, 2]
    assert len(policy.plain_logits) == 1 + policy.proposed.count(0)
    assert all(logits.shape == (1, pipeline.target.vocab_size) for logits in policy.plain_logits)


def test_policy_is_told_how_long_each_step_took(pipeline: Pipeline) -> None:
    policy = AlternatingPolicy()
    pipeline.engine("draft-model").generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), policy)
    assert [proposed for proposed, _ in policy.step_times] == policy.proposed  # every step, once it is committed
    assert all(elapsed_ms > 0 for _, elapsed_ms in policy.step_times)


def test_policy_is_told_how_long_the_answer_ran(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    memory = DrafterMemory()  # this test's records only: other tests keep theirs
    monkeypatch.setitem(pipeline.memories, "draft-model", memory)
    policy = AlternatingPolicy()
    result = pipeline.engine("draft-model").generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), policy)
    assert policy.ends == [AnswerLength(len(result.token_ids), cut_by_budget=result.finish_reason == "length")]
    result = pipeline.engine("draft-model").generate(PROMPTS[3], GenerationConfig(max_new_tokens=7, policy="goodput"))
    answers = memory.answer_lengths.answers  # goodput keeps its answers' lengths
    assert list(answers) == [AnswerLength(len(result.token_ids), cut_by_budget=result.finish_reason == "length")]
    pipeline.forget_answers()
    assert not memory.answer_lengths.answers and memory.acceptance.first.total == 0


class RandomGammaPolicy(Policy):
    """γ from 0..5 at random each step: as goodput's γ, which follows measured step times, varies between runs."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.rng.randint(0, 5)


@pytest.mark.parametrize("prompt_ids", [PROMPTS[0], PROMPTS[3]])
def test_seeded_sampling_gives_the_same_tokens_whatever_gamma(
    pipeline: Pipeline, prompt_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a seed, speculation gives plain decoding's tokens for any γ schedule (shared-noise coupling)."""
    config = GenerationConfig(max_new_tokens=24, sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=42))
    plain = pipeline.engine("none").generate(prompt_ids, config).token_ids
    draft_model = pipeline.engine("draft-model")
    runs = {
        f"fixed:{gamma}": draft_model.generate(prompt_ids, replace(config, policy=f"fixed:{gamma}"))
        for gamma in (1, 3, 5)
    }
    runs["alternating"] = draft_model.generate(prompt_ids, config, AlternatingPolicy())
    runs |= {f"random γ {seed}": draft_model.generate(prompt_ids, config, RandomGammaPolicy(seed)) for seed in range(3)}
    runs["prompt-lookup"] = pipeline.engine("prompt-lookup").generate(prompt_ids, replace(config, policy="fixed:3"))
    cost_model = CostModel({1: 100.0, 2: 100.01, 4: 100.02, 8: 100.04, 17: 100.08}, draft_ms=0.001)
    monkeypatch.setitem(pipeline.memories, "draft-model", DrafterMemory(cost_model=cost_model))  # no calibrating
    runs["goodput"] = pipeline.engine("draft-model").generate(prompt_ids, replace(config, policy="goodput"))
    for name, result in runs.items():
        assert result.token_ids == plain, name
    assert sum(result.stats.draft_tokens_accepted for result in runs.values()) > 0


def test_drafters_are_found_by_name() -> None:
    assert set(DRAFTERS.names()) == {"draft-model", "prompt-lookup", "early-exit", "hybrid", "none"}
    assert DRAFTERS.get("draft-model").needs_draft_model and DRAFTERS.get("hybrid").needs_draft_model
    assert not DRAFTERS.get("prompt-lookup").needs_draft_model


# -- the sampling law, through the real engine on tiny random bigram models ---------------------
#
# A run's new tokens 2, 3 and 4 are counted: with max_new_tokens 4 and γ 2, the first step drafts
# tokens 2 and 3, so the window sees drafts accepted, corrections, and token 4 as the bonus of a
# step whose drafts all passed. Seeded runs verify by shared-noise coupling, unseeded ones by
# rejection sampling (from generators seeded 0, 1, 2, ...).

VOCAB, SAMPLES, TOP_P = 6, 3_000, 0.9
FITS, REJECTED = 1e-4, 1e-5  # p-values: above FITS the law holds; a negative control must fall below REJECTED
TOP_P_SAMPLING = SamplingParams(temperature=1.0, top_p=TOP_P)
TOP_K_SAMPLING = SamplingParams(temperature=1.0, top_k=3)
WINDOW_CONFIG = GenerationConfig(max_new_tokens=4, num_draft_tokens=2)
PROMPT_FOR = {"none": [1, 2], "draft-model": [1, 2], "prompt-lookup": [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 1]}
PROMPT_FOR["hybrid"] = PROMPT_FOR["prompt-lookup"]  # copies where it repeats, the model elsewhere
RULES = pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])


def table_pipeline() -> Pipeline:
    target = BigramTableRuntime.random(VOCAB, seed=0, scale=1.5)
    draft = BigramTableRuntime.random(VOCAB, seed=1, scale=1.5)
    return Pipeline(target=target, draft=draft, tokenizer=word_tokenizer(VOCAB + 1), eos_token_ids=frozenset())


def window_distribution(target: BigramTableRuntime, prompt_ids: list[int], sampling: SamplingParams) -> torch.Tensor:
    """P(new tokens 2, 3, 4) ``[V, V, V]`` under plain sampling: p(y1) p(y2 | y1) p(y3 | y1 y2) p(y4 | y2 y3),
    enumerated and summed over y1."""
    probs = logits_to_probs(target.table, sampling).double()  # [V, V, V]: p(next | previous, current)
    first = probs[prompt_ids[-2], prompt_ids[-1]]  # [V]
    return torch.einsum("a,ab,abc,bcd->bcd", first, probs[prompt_ids[-1]], probs, probs)


def sampled_window(
    pipeline: Pipeline, drafter: str, prompt_ids: list[int], sampling: SamplingParams, seeded: bool
) -> torch.Tensor:
    """Counts ``[V, V, V]`` of new tokens 2, 3, 4 over SAMPLES runs (seeds 0, 1, ... when seeded)."""
    engine = pipeline.engine(drafter, DrafterOptions(prompt_lookup_max_ngram=2))
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    for run in range(SAMPLES):
        config = replace(WINDOW_CONFIG, sampling=replace(sampling, seed=run if seeded else None))
        counts[tuple(engine.generate(prompt_ids, config).token_ids[1:4])] += 1
    return counts


def window_pvalue(drafter: str, sampling: SamplingParams, seeded: bool) -> float:
    pipeline, prompt_ids = table_pipeline(), PROMPT_FOR[drafter]
    counts = sampled_window(pipeline, drafter, prompt_ids, sampling, seeded)
    return chi_square_pvalue(counts, window_distribution(pipeline.target, prompt_ids, sampling))


@RULES
@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_sampled_tokens_follow_the_target_distribution(drafter: str, seeded: bool) -> None:
    assert window_pvalue(drafter, TOP_P_SAMPLING, seeded) > FITS


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_top_k_sampled_tokens_follow_the_target_distribution(seeded: bool) -> None:
    assert window_pvalue("draft-model", TOP_K_SAMPLING, seeded) > FITS


def wrong_rule(draft_token_ids, draft_probs, target_probs, generator) -> VerificationResult:
    """A plausible but wrong rule: accept when p(x) >= q(x), else resample from p."""
    batch_size, num_drafts = draft_token_ids.shape
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_token_ids, target_probs.shape[-1]).to(target_probs.dtype)
    index = draft_token_ids[..., None]
    accepted = target_probs[:, :num_drafts].gather(-1, index) >= draft_probs.gather(-1, index)
    num_accepted = accepted.squeeze(-1).long().cumprod(dim=1).sum(dim=1)
    next_token_ids = sample(target_probs[torch.arange(batch_size), num_accepted], generator)
    return VerificationResult(num_accepted=num_accepted, next_token_ids=next_token_ids)


@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_acceptance_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the same test with a wrong rule plugged into the engine must fail.

    (With one-hot drafts the wrong rule only accepts where p(x) = 1 and otherwise samples p,
    which happens to be right, so the control uses the draft model.)
    """
    monkeypatch.setattr(quickdraft.engine, "rejection_sample", wrong_rule)
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded=False) < REJECTED


def every_third_bonus_to_token_0(verify: Callable[..., VerificationResult]) -> Callable[..., VerificationResult]:
    """A wrong rule: ``verify``, but every third bonus token (all drafts accepted) replaced by token 0."""
    bonuses = itertools.count()

    def bonus_to_token_0(draft_token_ids: torch.Tensor, *args: object) -> VerificationResult:
        result = verify(draft_token_ids, *args)
        if 0 < draft_token_ids.shape[1] == int(result.num_accepted[0]) and next(bonuses) % 3 == 0:
            return VerificationResult(result.num_accepted, torch.zeros_like(result.next_token_ids))
        return result

    return bonus_to_token_0


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_bonus_token(seeded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: every third bonus token (all drafts accepted) replaced by token 0 must fail."""
    wrong = every_third_bonus_to_token_0(quickdraft.engine.SpeculativeEngine._verify)
    monkeypatch.setattr(quickdraft.engine.SpeculativeEngine, "_verify", staticmethod(wrong))
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded) < REJECTED


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_speculative_sampling_drafts_were_accepted(seeded: bool) -> None:
    """The law above is not trivially met by rejecting everything, and its window sees bonus tokens."""
    engine = table_pipeline().engine("draft-model")
    runs = [
        engine.generate([1, 2], replace(WINDOW_CONFIG, sampling=replace(TOP_P_SAMPLING, seed=run if seeded else None)))
        for run in range(200)
    ]
    accepted = sum(run.stats.draft_tokens_accepted for run in runs)
    assert 0.2 < accepted / sum(run.stats.draft_tokens_proposed for run in runs) < 0.95
    with_bonus = sum(run.stats.step_sizes[1] == 3 for run in runs)  # the first step: two drafts and the bonus
    assert 0.05 < with_bonus / len(runs) < 0.95


# -- accounting: statistics and learning count what was committed ---------------------------------


class RecordingPolicy(FixedPolicy):
    """γ fixed; records what each step's verification reports."""

    def __init__(self, num_draft_tokens: int) -> None:
        super().__init__(num_draft_tokens)
        self.observed: list[tuple[int, int]] = []

    def observe(self, proposed: int, accepted: int) -> None:
        self.observed.append((proposed, accepted))


@pytest.mark.parametrize("finish_reason", ["eos", "stop"])
def test_drafts_after_the_end_are_not_counted(finish_reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft model equal to the target: six drafts pass, but the answer ends at the first of them."""
    target = BigramTableRuntime.random(VOCAB, seed=0, scale=1.5)
    tokenizer = word_tokenizer(VOCAB + 1)
    pipeline = Pipeline(
        target=target, draft=BigramTableRuntime(target.table), tokenizer=tokenizer, eos_token_ids=frozenset()
    )
    plain = pipeline.engine("none").generate([1, 2], GenerationConfig(max_new_tokens=8)).token_ids
    end_token = plain[1]
    assert plain[0] != end_token  # the answer can end at its second token
    engine = pipeline.engine("draft-model")
    if finish_reason == "eos":
        engine.eos_token_ids = frozenset({end_token})
    stop = (pipeline.tokenizer.decode([end_token]),) if finish_reason == "stop" else ()
    drafter_observed: list[tuple[int, int]] = []
    monkeypatch.setattr(engine.drafter, "observe", lambda *outcome: drafter_observed.append(outcome))
    policy = RecordingPolicy(6)
    result = engine.generate([1, 2], GenerationConfig(max_new_tokens=8, stop=stop), policy)
    assert result.finish_reason == finish_reason and result.token_ids == plain[:2]
    assert (result.stats.draft_tokens_proposed, result.stats.draft_tokens_accepted) == (6, 1)
    assert policy.observed == drafter_observed == [(1, 1)]  # drafts after the end: neither judged nor accepted


def test_tiny_pipeline_fixture_is_deterministic() -> None:
    a, b = tiny_pipeline(), tiny_pipeline()
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(
        a.target.forward(ids, a.target.new_cache(1)), b.target.forward(ids, b.target.new_cache(1)), rtol=0, atol=0
    )
