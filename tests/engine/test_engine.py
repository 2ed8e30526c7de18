"""The engine on tiny random models, one request at a time: greedy equality, stopping, what policies hear, seeded
coupling whatever γ, and what statistics and learning count."""

from __future__ import annotations

import itertools
import random
import threading
from dataclasses import replace

import pytest
import torch
from conftest import BigramTableRuntime, native_pipeline, tiny_pipeline, use_records, word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.bench.peers import hf_greedy_generate
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.costs import CostModel
from quickdraft.drafters import DRAFTERS, DrafterRecords
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.engine import Request, RequestFailed, RequestFinished, generate
from quickdraft.errors import ConfigError, PromptError
from quickdraft.policies import UNKNOWN_STATE, AnswerLength, FixedPolicy, Policy, StepOutcome, StepState

PROMPTS = [[1, 2, 3], [5, 9, 5, 9, 5, 9, 5], [7] * 12, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def hf_greedy(pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = pipeline.target.model
    return hf_greedy_generate(
        model, prompt_ids, max_new_tokens, pipeline.eos_token_ids, pipeline.tokenizer.eos_token_id
    )


@pytest.mark.parametrize("prompt_ids", PROMPTS)
def test_greedy_speculation_equals_plain_and_transformers(pipeline: Pipeline, prompt_ids: list[int]) -> None:
    plain = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=24), drafter="none")
    assert plain.stats.mean_accepted_tokens == 1.0
    assert plain.token_ids == hf_greedy(pipeline, prompt_ids, 24)
    for drafter, gamma in itertools.product(["draft-model", "prompt-lookup", "hybrid"], [1, 2, 4, 7]):
        result = pipeline.generate(
            prompt_ids, GenerationConfig(max_new_tokens=24, num_draft_tokens=gamma), drafter=drafter
        )
        assert result.token_ids == plain.token_ids, (drafter, gamma)
        assert result.text == plain.text


def test_speculation_commits_several_tokens_per_target_forward(pipeline: Pipeline) -> None:
    result = pipeline.generate(PROMPTS[2], GenerationConfig(max_new_tokens=24), drafter="prompt-lookup")
    stats = result.stats
    assert stats.draft_tokens_proposed > 0 and stats.draft_tokens_accepted > 0
    assert stats.target_forwards < stats.new_tokens
    assert stats.mean_accepted_tokens == stats.new_tokens / stats.target_forwards
    assert stats.acceptance_rate == stats.draft_tokens_accepted / stats.draft_tokens_proposed


@pytest.mark.parametrize(("drafter", "gamma"), [("none", 0), ("draft-model", 3), ("prompt-lookup", 5), ("hybrid", 4)])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 5])
def test_token_budget_is_exact(pipeline: Pipeline, drafter: str, gamma: int, max_new_tokens: int) -> None:
    result = pipeline.generate(
        PROMPTS[1], GenerationConfig(max_new_tokens=max_new_tokens, num_draft_tokens=gamma), drafter=drafter
    )
    assert len(result.token_ids) == result.stats.new_tokens == max_new_tokens
    assert result.finish_reason == "length"


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_stream_deltas_add_up_to_the_text(pipeline: Pipeline, drafter: str) -> None:
    stream = pipeline.stream(PROMPTS[3], GenerationConfig(max_new_tokens=16), drafter=drafter)
    deltas = list(stream)
    assert stream.result is not None and "".join(deltas) == stream.result.text
    assert len(deltas) > 1


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_end_of_sequence_stops_and_is_kept(pipeline: Pipeline, drafter: str) -> None:
    plain = pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=16), drafter="none")
    eos = plain.token_ids[5]
    ends_at_eos = replace(pipeline, eos_token_ids=frozenset({eos}))
    result = ends_at_eos.generate(PROMPTS[3], GenerationConfig(max_new_tokens=16, num_draft_tokens=4), drafter)
    assert result.finish_reason == "eos"
    assert result.token_ids == plain.token_ids[: plain.token_ids.index(eos) + 1]


@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
def test_stop_string_ends_text_before_it(pipeline: Pipeline, drafter: str) -> None:
    plain = pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=16), drafter="none")
    words = plain.text.split(" ")
    stop = " ".join(words[4:6])
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=4, stop=(stop,))
    stream = pipeline.stream(PROMPTS[3], config, drafter=drafter)
    streamed = "".join(stream)
    result = stream.result
    assert result is not None and result.finish_reason == "stop" and result.stop_reason == stop
    assert result.text == streamed == plain.text[: plain.text.index(stop)]
    assert result.token_ids == plain.token_ids[: len(result.token_ids)]
    assert stop in pipeline.tokenizer.decode(result.token_ids)
    assert stop not in pipeline.tokenizer.decode(result.token_ids[:-1])


def test_prompt_errors(pipeline: Pipeline) -> None:
    with pytest.raises(PromptError, match="empty"):
        pipeline.generate([], GenerationConfig(), "none")
    with pytest.raises(PromptError, match="context holds 512"):
        pipeline.generate([1] * 510, GenerationConfig(max_new_tokens=5), "none")
    assert pipeline.engine.idle  # nothing was queued
    with pytest.raises(PromptError, match="empty"):
        pipeline.encode("   ")


def test_seeded_sampling_is_reproducible(pipeline: Pipeline) -> None:
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingParams(temperature=1.0, top_k=8, seed=3))
    first = pipeline.generate(PROMPTS[0], config, drafter="draft-model")
    assert first.token_ids == pipeline.generate(PROMPTS[0], config, drafter="draft-model").token_ids
    other_seeds = [replace(config, sampling=replace(config.sampling, seed=seed)) for seed in (4, 5, 2**64 - 1)]
    others = {tuple(pipeline.generate(PROMPTS[0], other, drafter="draft-model").token_ids) for other in other_seeds}
    assert len(others | {tuple(first.token_ids)}) == 4


@pytest.mark.parametrize("seed", [None, 7])
def test_a_tiny_temperature_gives_the_greedy_tokens(pipeline: Pipeline, seed: int | None) -> None:
    greedy = pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=12), drafter="none").token_ids
    sampling = SamplingParams(temperature=1e-300, seed=seed)
    for drafter in ("none", "draft-model"):
        config = GenerationConfig(max_new_tokens=12, num_draft_tokens=3, sampling=sampling)
        assert pipeline.generate(PROMPTS[3], config, drafter=drafter).token_ids == greedy, drafter


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


class AlternatingPolicy(Policy):
    """γ = 0, 2, 0, 2, …; records which tokens it saw as plain and how many drafts each step proposed."""

    def __init__(self) -> None:
        self.chosen: list[int] = []
        self.proposed: list[int] = []
        self.confidences: list[float] = []  # the target's top probability at each token chosen without drafts
        self.step_times: list[tuple[int, float]] = []
        self.ends: list[AnswerLength] = []

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        self.chosen.append(0 if len(self.chosen) % 2 == 0 else 2)
        return self.chosen[-1]

    def observe(self, outcome: StepOutcome) -> None:
        self.proposed.append(outcome.num_judged)
        if outcome.step_ms is not None:
            self.step_times.append((outcome.num_drafted, outcome.step_ms))

    def wants_confidence(self) -> bool:
        return True

    def observe_confidence(self, probability: float) -> None:
        self.confidences.append(probability)

    def observe_end(self, num_tokens: int, cut_by_budget: bool) -> None:
        self.ends.append(AnswerLength(num_tokens, cut_by_budget))


def test_policy_hears_the_targets_confidence_at_every_plain_token(pipeline: Pipeline) -> None:
    """The prompt's last position and each step that proposed nothing, while the answer goes on; never a step with
    drafts."""
    policy = AlternatingPolicy()
    pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), "draft-model", policy=policy)
    assert policy.chosen[:4] == [0, 2, 0, 2] and policy.proposed[:4] == [0, 2, 0, 2]
    assert len(policy.confidences) == 1 + policy.proposed[:-1].count(0)  # the last step ended the answer
    assert all(0 < probability <= 1 for probability in policy.confidences)


def test_policy_is_told_how_long_each_step_took(pipeline: Pipeline) -> None:
    policy = AlternatingPolicy()
    pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), "draft-model", policy=policy)
    assert [proposed for proposed, _ in policy.step_times] == policy.proposed  # every step, once it is committed
    assert all(elapsed_ms > 0 for _, elapsed_ms in policy.step_times)


def test_policy_is_told_how_long_the_answer_ran(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    records = use_records(monkeypatch, pipeline, "draft-model")  # this test's records only: other tests keep theirs
    policy = AlternatingPolicy()
    result = pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=10), "draft-model", policy=policy)
    assert policy.ends == [AnswerLength(len(result.token_ids), cut_by_budget=result.finish_reason == "length")]
    result = pipeline.generate(PROMPTS[3], GenerationConfig(max_new_tokens=7, policy="goodput"), drafter="draft-model")
    answers = records.answer_lengths.answers  # goodput keeps its answers' lengths
    assert list(answers) == [AnswerLength(len(result.token_ids), cut_by_budget=result.finish_reason == "length")]
    pipeline.forget_answers()
    assert not records.answer_lengths.answers and records.acceptance.first.total == 0


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
    plain = pipeline.generate(prompt_ids, config, drafter="none").token_ids
    runs = {
        f"fixed:{gamma}": pipeline.generate(prompt_ids, replace(config, policy=f"fixed:{gamma}"), "draft-model")
        for gamma in (1, 3, 5)
    }
    runs["alternating"] = pipeline.generate(prompt_ids, config, "draft-model", policy=AlternatingPolicy())
    runs |= {
        f"random γ {seed}": pipeline.generate(prompt_ids, config, "draft-model", policy=RandomGammaPolicy(seed))
        for seed in range(3)
    }
    runs["prompt-lookup"] = pipeline.generate(prompt_ids, replace(config, policy="fixed:3"), drafter="prompt-lookup")
    cost_model = CostModel({1: 100.0, 2: 100.01, 4: 100.02, 8: 100.04, 17: 100.08}, draft_ms=0.001)
    use_records(monkeypatch, pipeline, "draft-model", DrafterRecords(cost_model=cost_model))  # no calibrating
    runs["goodput"] = pipeline.generate(prompt_ids, replace(config, policy="goodput"), drafter="draft-model")
    for name, result in runs.items():
        assert result.token_ids == plain, name
    assert sum(result.stats.draft_tokens_accepted for result in runs.values()) > 0


def test_drafters_are_found_by_name() -> None:
    assert set(DRAFTERS.names()) == {
        "draft-model",
        "prompt-lookup",
        "suffix",
        "early-exit",
        "eagle",
        "hybrid",
        "hybrid-eagle",
        "hybrid-suffix",
        "none",
    }
    assert DRAFTERS.get("draft-model").needs_draft_model and DRAFTERS.get("hybrid").needs_draft_model
    assert not DRAFTERS.get("prompt-lookup").needs_draft_model


# -- accounting: statistics and learning count what was committed ---------------------------------


class RecordingPolicy(FixedPolicy):
    """γ fixed; records what each step's verification reports."""

    def __init__(self, num_draft_tokens: int) -> None:
        super().__init__(num_draft_tokens)
        self.observed: list[tuple[int, int]] = []

    def observe(self, outcome: StepOutcome) -> None:
        self.observed.append((outcome.num_judged, outcome.num_accepted))


@pytest.mark.parametrize("finish_reason", ["eos", "stop"])
def test_drafts_after_the_end_are_not_counted(finish_reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft model equal to the target: six drafts pass, but the answer ends at the first of them."""
    target = BigramTableRuntime.random(6, seed=0, scale=1.5)
    tokenizer = word_tokenizer(7)
    pipeline = Pipeline(
        target=target, draft=BigramTableRuntime(target.table), tokenizer=tokenizer, eos_token_ids=frozenset()
    )
    plain = pipeline.generate([1, 2], GenerationConfig(max_new_tokens=8), drafter="none").token_ids
    end_token = plain[1]
    assert plain[0] != end_token  # the answer can end at its second token
    if finish_reason == "eos":
        pipeline = replace(pipeline, eos_token_ids=frozenset({end_token}))
    stop = (pipeline.tokenizer.decode([end_token]),) if finish_reason == "stop" else ()
    drafter_observed: list[tuple[int, int]] = []
    drafter = pipeline.drafter("draft-model")
    monkeypatch.setattr(drafter, "observe", lambda state, *outcome: drafter_observed.append(outcome))
    policy = RecordingPolicy(6)
    result = pipeline.generate([1, 2], GenerationConfig(max_new_tokens=8, stop=stop), "draft-model", policy=policy)
    assert result.finish_reason == finish_reason and result.token_ids == plain[:2]
    assert (result.stats.draft_tokens_proposed, result.stats.draft_tokens_accepted) == (6, 1)
    assert policy.observed == drafter_observed == [(1, 1)]  # drafts after the end: neither judged nor accepted


def test_tiny_pipeline_fixture_is_deterministic() -> None:
    a, b = tiny_pipeline(), tiny_pipeline()
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(
        a.target.forward(ids, a.target.new_cache(1)), b.target.forward(ids, b.target.new_cache(1)), rtol=0, atol=0
    )


def test_a_drafters_costs_are_ready_when_a_policy_first_needs_them() -> None:
    """No setup step first: the first goodput request a drafter serves loads or measures its costs, once; a drafter
    made without a way to measure them is refused with a clear error."""
    pipeline = native_pipeline()
    drafter = pipeline.drafter("draft-model")
    assert drafter.records.cost_model is None and drafter.records.measure_costs is not None
    measure, asked = drafter.records.measure_costs, []
    drafter.records.measure_costs = lambda max_draft_tokens: asked.append(max_draft_tokens) or measure(max_draft_tokens)
    config = GenerationConfig(max_new_tokens=4, policy="goodput", max_draft_tokens=6)
    for prompt in ([3, 1, 4], [1, 5, 9]):  # straight to the engine, as a server's requests come
        assert len(generate(pipeline.engine, Request(tuple(prompt), config, drafter)).token_ids) == 4
    assert asked == [6] and drafter.records.cost_model is not None
    bare = DraftModelDrafter(pipeline.draft, pipeline.target.vocab_size)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="cost model"):
        generate(pipeline.engine, Request((3, 1, 4), config, bare))


def test_a_sink_may_submit_the_next_turn_before_its_drafters_costs_are_measured() -> None:
    """A sink runs on the stepping thread, which holds the step lock: the next turn's costs are measured there,
    between the step's forwards (taking the lock again deadlocked the step), and its answer is plain decoding's."""
    pipeline = native_pipeline()
    config = GenerationConfig(max_new_tokens=4, policy="goodput")
    follow_up = Request((1, 2, 3), config, pipeline.drafter("prompt-lookup"), request_id="next")
    heard: list[object] = []

    def sink(event: object) -> None:
        if isinstance(event, RequestFinished):
            pipeline.engine.submit(follow_up, heard.append)

    first = Request((4, 5, 6), GenerationConfig(max_new_tokens=2), pipeline.drafter("none"), request_id="first")
    pipeline.engine.submit(first, sink)
    stepping = threading.Thread(target=pipeline.engine.run_until_idle, daemon=True)
    stepping.start()
    stepping.join(120)
    assert not stepping.is_alive() and isinstance(heard[-1], RequestFinished)
    plain = pipeline.generate([1, 2, 3], GenerationConfig(max_new_tokens=4), drafter="none")
    assert heard[-1].result.token_ids == plain.token_ids
    cancelled = Request((4, 5, 6), GenerationConfig(max_new_tokens=2), pipeline.drafter("none"), request_id="gone")
    again = Request((1, 2, 3), config, pipeline.drafter("draft-model"), request_id="again")  # costs not measured yet
    pipeline.engine.submit(cancelled, lambda event: pipeline.engine.submit(again, heard.append))
    cancelling = threading.Thread(target=pipeline.engine.cancel, args=("gone", True), daemon=True)
    cancelling.start()  # frees its caches at once, on this thread, whose sink submits a turn of unmeasured costs
    cancelling.join(120)
    assert not cancelling.is_alive()


def test_a_request_whose_start_fails_is_answered_by_the_failure_path_not_lost() -> None:
    """A drafter that fails to start a request makes the step fail: that request and the ones admitted with it each
    hear ``RequestFailed`` (a server answers each with an error), and the engine serves the next ones."""
    pipeline = native_pipeline()

    class Broken(DraftModelDrafter):
        def start(self, prompt_ids, target_cache):  # type: ignore[no-untyped-def]
            raise RuntimeError("no cache for you")

    broken = Broken(pipeline.draft, pipeline.target.vocab_size)  # type: ignore[arg-type]
    config = GenerationConfig(max_new_tokens=3, policy="fixed:2")
    heard: dict[str, list[object]] = {"first": [], "broken": [], "after": []}
    for name, drafter in (("first", pipeline.drafter("none")), ("broken", broken), ("after", pipeline.drafter("none"))):
        pipeline.engine.submit(Request((3, 1, 4), config, drafter, request_id=name), heard[name].append)
    with pytest.raises(RuntimeError, match="no cache for you"):
        pipeline.engine.step()
    for events in heard.values():
        assert isinstance(events[-1], RequestFailed) and "a step failed while this request ran" in events[-1].message
    assert pipeline.engine.idle and not pipeline.engine.fail_running()
    assert len(generate(pipeline.engine, Request((1, 5), config, pipeline.drafter("none"))).token_ids) == 3
