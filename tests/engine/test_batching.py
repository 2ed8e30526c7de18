"""Many requests in the engine at once, on tiny models: every request's output is what it gets alone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from conftest import FLAT, native_from_hf, native_pipeline, tiny_model

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.costs import BatchCostModel
from quickdraft.drafters import DRAFTERS, DrafterRecords
from quickdraft.drafters.none import NoDrafter
from quickdraft.engine import (
    CONFIDENCE_ROWS_PER_STEP,
    Engine,
    Event,
    GenerationResult,
    QueueFull,
    Request,
    RequestFinished,
    SchedulerSettings,
    StepReport,
    TokenDelta,
)
from quickdraft.engine.features import target_forward
from quickdraft.errors import ConfigError, PromptError
from quickdraft.runtime.base import BatchRow

# a batch whose forward costs little more for more tokens: drafting pays whatever the batch (goodput drafts)
CHEAP_BATCH = BatchCostModel({1: 100.0, 16: 101.0, 256: 110.0}, {1: 1.0, 64: 1.5})
# a compute-bound batch: every token of the step costs the same, drafted or not
COMPUTE_BOUND = BatchCostModel({1: 10.0, 2: 20.0, 8: 80.0, 64: 640.0}, {1: 5.0, 64: 320.0})


@pytest.fixture
def native() -> Pipeline:
    """Tiny native models whose drafters plan with the FLAT cost model (no calibrating) and have learned nothing."""
    pipeline = native_pipeline()
    for name in DRAFTERS.names():
        pipeline.records[name] = DrafterRecords(cost_model=FLAT)
    return pipeline


def batch_engine(pipeline: Pipeline, batch_costs: BatchCostModel = CHEAP_BATCH, **settings: int) -> Engine:
    return Engine(
        pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, SchedulerSettings(**settings), batch_costs
    )


def make_request(
    pipeline: Pipeline, prompt: tuple[int, ...], config: GenerationConfig, drafter: str = "hybrid", name: str = ""
) -> Request:
    return Request(prompt, config, pipeline.drafter(drafter), **({"request_id": name} if name else {}))


class Collector:
    """Events per request id, and what each step did."""

    def __init__(self, engine: Engine) -> None:
        self.events: dict[str, list[Event]] = {}
        self.reports: list[StepReport] = []
        engine.on_step = self.reports.append

    def sink(self, request_id: str):  # -> Sink
        return lambda event: self.events.setdefault(request_id, []).append(event)

    def result(self, request_id: str) -> GenerationResult:
        last = self.events[request_id][-1]
        assert isinstance(last, RequestFinished)
        return last.result

    def streamed(self, request_id: str) -> tuple[str, list[int]]:
        deltas = [event for event in self.events[request_id] if isinstance(event, TokenDelta)]
        return "".join(delta.text for delta in deltas), [token for delta in deltas for token in delta.token_ids]


def mixed_requests(pipeline: Pipeline, count: int, seed: int = 0) -> list[Request]:
    """Prompts of 1 to 40 tokens (some repetitive, for prompt lookup), budgets of 3 to 30 tokens, every drafter."""
    vocab_size = pipeline.target.vocab_size
    rng = random.Random(seed)
    kinds = [("none", None), ("draft-model", "fixed:3"), ("prompt-lookup", "fixed:4"), ("draft-model", "goodput")]
    kinds += [("prompt-lookup", "goodput"), ("draft-model", "fixed:1"), ("hybrid", "goodput"), ("hybrid", "fixed:3")]
    kinds += [("early-exit", "fixed:2"), ("hybrid", "heuristic")]
    requests = []
    for i in range(count):
        length = rng.choice([1, 2, 5, 13, 40])
        pattern = [rng.randrange(vocab_size - 1) for _ in range(rng.choice([2, 3, length]))]
        prompt = tuple((pattern * length)[:length])
        drafter, policy = kinds[i % len(kinds)]
        config = GenerationConfig(max_new_tokens=rng.choice([3, 11, 30]), policy=policy)
        requests.append(make_request(pipeline, prompt, config, drafter, f"r{i}"))
    return requests


def test_batched_greedy_equals_single_request_greedy_bitwise(native: Pipeline) -> None:
    """Requests of every drafter, mixed prompt lengths and budgets, joining and leaving mid-run, prompts read in
    chunks beside decoding requests: each gets the single-request engine's plain greedy tokens and text."""
    engine = batch_engine(native, max_running=5, prefill_tokens_per_step=7)
    collector = Collector(engine)
    requests = mixed_requests(native, 18)
    arrivals = {step: requests[3 * step : 3 * step + 3] for step in range(6)}  # three join every step
    step = 0
    while step in arrivals or not engine.idle:
        for request in arrivals.get(step, []):
            engine.submit(request, collector.sink(request.request_id))
        engine.step()
        step += 1
    for request in requests:
        plain = native.generate(list(request.prompt_ids), replace(request.config, policy="fixed:0"), drafter="none")
        result = collector.result(request.request_id)
        assert result.token_ids == plain.token_ids, request
        assert (result.text, result.finish_reason) == (plain.text, plain.finish_reason)
        assert collector.streamed(request.request_id) == (result.text, result.token_ids)
    reports = collector.reports
    assert max(report.decoding for report in reports) == 5  # steps full of requests
    assert any(report.decoding and report.prefill_tokens for report in reports)  # prompts read beside decoding
    for drafter in ("draft-model", "prompt-lookup", "hybrid", "early-exit"):  # every drafter drafted, most were right
        mine = [collector.result(r.request_id) for r in requests if r.drafter is native.drafter(drafter)]
        assert sum(result.stats.draft_tokens_proposed for result in mine) > 0, drafter
        assert drafter == "early-exit" or sum(result.stats.draft_tokens_accepted for result in mine) > 5, drafter


def test_seeded_output_does_not_depend_on_the_batch(native: Pipeline) -> None:
    """A seeded sampled request gives the same tokens alone and among others (other prompts, drafters, γ, seeds,
    sampling settings), and those are seeded plain decoding's."""
    sampling = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    config = GenerationConfig(max_new_tokens=20, sampling=sampling, policy="fixed:3")
    prompt = (5, 9, 5, 9, 5)
    plain = native.generate(list(prompt), replace(config, policy="fixed:0"), drafter="none")
    drafters = ("hybrid", "draft-model", "prompt-lookup", "early-exit", "none")
    for companions in (0, 3, 9):
        engine = batch_engine(native, prefill_tokens_per_step=4 + companions)
        collector = Collector(engine)
        others = mixed_requests(native, companions, seed=companions)
        for i, other in enumerate(others):
            other_sampling = SamplingParams(temperature=0.7 * (i % 3), top_k=i % 4, seed=i if i % 2 else None)
            other = replace(other, config=replace(other.config, sampling=other_sampling))
            engine.submit(other, collector.sink(other.request_id))
        for drafter in drafters:
            engine.submit(make_request(native, prompt, config, drafter, drafter), collector.sink(drafter))
        engine.run_until_idle()
        for drafter in drafters:
            assert collector.result(drafter).token_ids == plain.token_ids, (companions, drafter)


def test_stop_strings_and_end_of_sequence_as_the_single_engine(native: Pipeline) -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    plain = native.generate(prompt, GenerationConfig(max_new_tokens=16), drafter="none")
    eos = next(token for i, token in enumerate(plain.token_ids) if i >= 6 and token not in plain.token_ids[:i])
    stop = " ".join(plain.text.split(" ")[3:5])
    native = replace(native, eos_token_ids=frozenset({eos}))
    engine = batch_engine(native)
    collector = Collector(engine)
    configs = {"stop": GenerationConfig(max_new_tokens=16, stop=(stop,), policy="fixed:3")}
    configs["eos"] = GenerationConfig(max_new_tokens=16, policy="fixed:4")
    for name, config in configs.items():
        engine.submit(make_request(native, tuple(prompt), config, "draft-model", name), collector.sink(name))
    engine.run_until_idle()
    for name, config in configs.items():
        expected = native.generate(prompt, config, "draft-model")
        result = collector.result(name)
        assert (result.token_ids, result.text, result.finish_reason) == (
            expected.token_ids,
            expected.text,
            expected.finish_reason,
        )
        assert result.finish_reason == name
        assert collector.streamed(name)[0] == result.text


def test_cancelling_frees_the_slot_at_the_next_step(native: Pipeline) -> None:
    engine = batch_engine(native, max_running=1)
    collector = Collector(engine)
    config = GenerationConfig(max_new_tokens=30, policy="fixed:2")
    for name in ("long", "queued", "next"):
        engine.submit(make_request(native, (1, 2, 3), config, "draft-model", name), collector.sink(name))
    for _ in range(3):
        engine.step()
    (running,) = engine.scheduler.running
    assert running.request.request_id == "long" and not running.finished
    engine.cancel("long")
    engine.cancel("queued")
    engine.step()
    assert collector.result("long").finish_reason == "cancelled" and running.finished
    assert running not in engine.scheduler.running  # its caches go with it
    assert collector.result("queued").finish_reason == "cancelled"
    assert [state.request.request_id for state in engine.scheduler.running] == ["next"]
    engine.run_until_idle()
    assert len(collector.result("next").token_ids) == 30 and engine.idle


def test_an_id_names_one_live_request_and_a_stray_cancel_changes_nothing(native: Pipeline) -> None:
    engine = batch_engine(native)
    collector = Collector(engine)
    request = make_request(native, (1, 2, 3), GenerationConfig(max_new_tokens=3), "none", "once")
    engine.cancel("nobody")  # unknown: ignored, so the engine stays idle
    assert engine.idle
    engine.submit(request, collector.sink("once"))
    with pytest.raises(ConfigError, match="'once' is already queued or running"):
        engine.submit(request, collector.sink("twice"))
    engine.run_until_idle()
    assert len(collector.result("once").token_ids) == 3 and engine.idle
    engine.cancel("once")  # it has finished: nothing to stop
    assert engine.idle
    engine.submit(request, collector.sink("again"))  # a finished request's id is free again
    engine.run_until_idle()
    assert collector.result("again").token_ids == collector.result("once").token_ids


def test_a_full_queue_refuses_requests(native: Pipeline) -> None:
    engine = batch_engine(native, max_running=1, max_waiting=2)
    plain = make_request(native, (1, 2), GenerationConfig(max_new_tokens=2), "none")
    for _ in range(3):  # the one free slot's, and two waiting for a slot
        engine.submit(replace(plain, request_id=str(_)), lambda _: None)
    with pytest.raises(QueueFull, match="2 requests waiting"):
        engine.submit(plain, lambda _: None)
    while engine.scheduler.num_waiting > 1:
        engine.step()  # the first finishes, the second takes its slot: room again
    engine.submit(plain, lambda _: None)


def test_requests_reserve_their_positions_and_the_oldest_waits_for_room(native: Pipeline) -> None:
    """Under ``max_positions``, a request is admitted while its prompt and budget fit beside the running ones'; the
    oldest waits for room rather than be passed by a smaller one; one that can never fit is refused at once."""
    engine = batch_engine(native, max_positions=40)
    collector = Collector(engine)
    sizes = {"a": (10, 10), "b": (10, 15), "c": (2, 2)}  # a and b do not fit together (45); a and c would (24)
    for name, (prompt, budget) in sizes.items():
        config = GenerationConfig(max_new_tokens=budget, policy="fixed:2")
        engine.submit(make_request(native, (1,) * prompt, config, "draft-model", name), collector.sink(name))
    admitted: list[set[str]] = []
    while not engine.idle:
        engine.step()
        admitted.append({state.request.request_id for state in engine.scheduler.running})
    assert admitted[0] == {"a"} and all("b" not in running for running in admitted if "a" in running)
    assert next(running for running in admitted if "c" in running) >= {"b"}  # c came in behind b, not before it
    alone = GenerationConfig(max_new_tokens=10, policy="fixed:2")
    for name, (prompt, budget) in sizes.items():
        config = replace(alone, max_new_tokens=budget)
        expected = native.generate(list((1,) * prompt), config, drafter="draft-model").token_ids
        assert collector.result(name).token_ids == expected
    with pytest.raises(ConfigError, match=r"reserves 41 positions .* more than the 40") as error:
        engine.submit(make_request(native, (1,) * 31, GenerationConfig(max_new_tokens=10)), lambda _: None)
    assert error.value.setting == "max_new_tokens" and engine.idle


def test_bad_requests_are_refused_at_submission(native: Pipeline) -> None:
    engine = batch_engine(native)
    with pytest.raises(PromptError, match="empty"):
        engine.submit(make_request(native, (), GenerationConfig()), lambda _: None)
    with pytest.raises(PromptError, match="context holds 256"):
        engine.submit(make_request(native, (1,) * 250, GenerationConfig(max_new_tokens=10)), lambda _: None)
    no_draft = replace(native, draft=None, records={})
    with pytest.raises(ConfigError, match="needs a draft model"):
        no_draft.drafter("hybrid")
    uncalibrated = make_request(no_draft, (1,), GenerationConfig(max_new_tokens=4), "prompt-lookup")
    uncalibrated.drafter.records.measure_costs = None  # a drafter with no costs and no way to measure them
    with pytest.raises(ConfigError, match="needs a cost model"):
        engine.submit(uncalibrated, lambda _: None)
    assert engine.idle


def test_goodput_drafts_alone_and_decodes_plainly_in_a_busy_compute_bound_batch(native: Pipeline) -> None:
    """SmartSpec's point: the same requests speculate while a drafted token is cheap to verify and stop when
    every token of the step costs as much as any other."""
    prompt = (5, 9, 5, 9, 5, 9, 5, 9)  # prompt lookup's drafts are accepted here
    config = GenerationConfig(max_new_tokens=12, policy="goodput")
    for batch_costs, count, drafts in ((CHEAP_BATCH, 8, True), (COMPUTE_BOUND, 8, False), (COMPUTE_BOUND, 1, True)):
        engine = batch_engine(native, batch_costs, max_running=8, prefill_tokens_per_step=64)
        native.drafter_records("prompt-lookup").acceptance.first.accepted = 50.0  # goodput knows the drafts are good
        collector = Collector(engine)
        for i in range(count):
            engine.submit(make_request(native, prompt, config, "prompt-lookup", f"r{i}"), collector.sink(f"r{i}"))
        engine.run_until_idle()
        gammas = [gamma for report in collector.reports for gamma in report.gammas]
        assert (sum(gammas) > 0) == drafts, (batch_costs, count, gammas)
        for i in range(count):  # a lone request decides as the single-request policy does
            assert (
                collector.result(f"r{i}").token_ids == native.generate(list(prompt), config, drafter="none").token_ids
            )


def test_a_few_requests_a_step_hear_the_targets_confidence_the_longest_unheard_first(native: Pipeline) -> None:
    """Goodput learns from the target's top probability after plain tokens; in a busy batch only
    CONFIDENCE_ROWS_PER_STEP requests a step pay the pass over the vocabulary, taking turns."""
    engine = batch_engine(native, COMPUTE_BOUND, max_running=10, prefill_tokens_per_step=64)
    collector = Collector(engine)
    config = GenerationConfig(max_new_tokens=12, policy="goodput")
    for i in range(10):
        engine.submit(make_request(native, (3 + i, 4, 5), config, "draft-model", f"r{i}"), collector.sink(f"r{i}"))
    heard: list[list[tuple[str, float]]] = [[]]  # per step: (request, probability)
    engine.on_step = lambda report: heard.append([])
    for state in engine.scheduler.waiting:
        state.policy.observe_confidence = lambda p, name=state.request.request_id: heard[-1].append((name, p))
    engine.run_until_idle()
    assert max(len(step) for step in heard) == CONFIDENCE_ROWS_PER_STEP
    assert all(0 < p <= 1 for step in heard for _, p in step)
    full_steps = [sorted(name for name, _ in step) for step in heard if len(step) == CONFIDENCE_ROWS_PER_STEP]
    assert full_steps[0] != full_steps[1]  # turns, not the same four every step
    assert {name for step in heard for name, _ in step} == {f"r{i}" for i in range(10)}


def test_a_request_can_decode_plainly_beside_speculating_ones(native: Pipeline) -> None:
    engine = batch_engine(native)
    collector = Collector(engine)
    config = GenerationConfig(max_new_tokens=10, policy="fixed:4")
    for drafter in ("none", "prompt-lookup"):
        engine.submit(make_request(native, (7,) * 9, config, drafter, drafter), collector.sink(drafter))
    engine.run_until_idle()
    assert collector.result("none").stats.draft_tokens_proposed == 0
    assert collector.result("prompt-lookup").stats.draft_tokens_accepted > 0
    assert collector.result("none").token_ids == collector.result("prompt-lookup").token_ids


def test_the_step_reports_add_up(native: Pipeline) -> None:
    engine = batch_engine(native, prefill_tokens_per_step=5)
    collector = Collector(engine)
    requests = mixed_requests(native, 6, seed=3)
    for request in requests:
        engine.submit(request, collector.sink(request.request_id))
    engine.run_until_idle()
    results = [collector.result(request.request_id) for request in requests]
    reports = collector.reports
    assert sum(report.new_tokens for report in reports) == sum(len(result.token_ids) for result in results)
    assert sum(report.prefill_tokens for report in reports) == sum(len(request.prompt_ids) for request in requests)
    assert sum(report.accepted for report in reports) == sum(r.stats.draft_tokens_accepted for r in results)
    assert sum(report.finished for report in reports) == len(requests)
    assert all(report.prefill_tokens <= 5 for report in reports if report.decoding)  # chunks beside decoding
    assert torch.tensor([report.seconds for report in reports]).min() > 0


def test_a_request_alone_reads_its_prompt_in_one_step_and_drafts_at_once(native: Pipeline) -> None:
    """Chunks keep a long prompt from stalling decoding requests; with none decoding, the oldest prompt is read
    whole (one forward, not one per chunk), and a request alone in its steps has its draft model read the
    prompt and draft in the same step. A request arriving while another decodes reads in chunks."""
    engine = batch_engine(native, prefill_tokens_per_step=5)
    collector = Collector(engine)
    prompt = tuple(range(3, 43))  # 40 tokens
    first = make_request(native, prompt, GenerationConfig(max_new_tokens=30, policy="fixed:3"), "draft-model", "first")
    engine.submit(first, collector.sink("first"))
    engine.step()
    assert collector.reports[0].prefill_tokens == 40
    engine.step()
    assert collector.reports[1].proposed > 0  # read the prompt and drafted in one step
    second = make_request(native, prompt[::-1], GenerationConfig(max_new_tokens=4), "none", "second")
    engine.submit(second, collector.sink("second"))
    engine.run_until_idle()
    beside = [report.prefill_tokens for report in collector.reports[2:] if report.decoding]
    assert beside and max(beside) == 5
    plain = native.generate(list(prompt), replace(first.config, policy="fixed:0"), drafter="none")
    assert collector.result("first").token_ids == plain.token_ids


def test_a_long_prompt_alone_is_read_in_forwards_of_bounded_size(
    native: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt longer than PROMPT_FORWARD_TOKENS, alone, is read in forwards of that many tokens (activations stay
    bounded: a 32k-token prompt read whole would need gigabytes), and answers as plain decoding does."""
    import quickdraft.engine.scheduler as scheduler

    monkeypatch.setattr(scheduler, "PROMPT_FORWARD_TOKENS", 16)
    engine = batch_engine(native, prefill_tokens_per_step=5)
    collector = Collector(engine)
    prompt = tuple(range(3, 43))  # 40 tokens: 16 + 16 + 8
    request = make_request(native, prompt, GenerationConfig(max_new_tokens=4), "none", "long")
    engine.submit(request, collector.sink("long"))
    engine.run_until_idle()
    assert [report.prefill_tokens for report in collector.reports[:3]] == [16, 16, 8]
    plain = native.generate(list(prompt), GenerationConfig(max_new_tokens=4), drafter="none")
    assert collector.result("long").token_ids == plain.token_ids


def test_a_draft_model_over_part_of_the_vocabulary_also_computes_the_prompts_tokens() -> None:
    """A draft model whose LM head computes the frequent tokens only also computes the tokens of every running
    prompt it drafts for (a request alone: its one prompt's); the output stays plain greedy."""
    pipeline = native_pipeline()
    decoder = pipeline.draft.decoder  # type: ignore[union-attr]
    decoder.restrict_vocabulary(torch.arange(8))
    config = GenerationConfig(max_new_tokens=8, policy="fixed:2")
    requests = [
        make_request(pipeline, (20, 21, 20, 21), config, "draft-model", "a"),
        make_request(pipeline, (30, 3, 30), config, "hybrid", "b"),
        make_request(pipeline, (40, 41), config, "none", "c"),  # no draft model: not its tokens
    ]
    engine = batch_engine(pipeline)
    collector = Collector(engine)
    for each in requests:
        engine.submit(each, collector.sink(each.request_id))
    engine.step()
    assert decoder.focus.tolist() == [20, 21, 30]
    engine.run_until_idle()
    for each in requests:
        plain = pipeline.generate(list(each.prompt_ids), replace(config, policy="fixed:0"), drafter="none")
        assert collector.result(each.request_id).token_ids == plain.token_ids
    pipeline.generate([25, 2, 26], config, drafter="draft-model")
    assert decoder.focus.tolist() == [25, 26]


def test_one_forward_gives_each_drafter_the_layers_it_reads() -> None:
    """The step's forward captures the union of the layers its requests' drafters read and hands each its own;
    the logits are the plain forward's."""
    target = native_from_hf(tiny_model(64, seed=3, num_layers=3))
    reads_one, reads_two, reads_none = NoDrafter(), NoDrafter(), NoDrafter()
    reads_one.feature_layers, reads_two.feature_layers = (2,), (1, 2)
    tokens = [[5, 9, 2], [7, 1], [3]]
    logits, features = target_forward(
        target, [BatchRow(target.new_cache(1), ids) for ids in tokens], [reads_one, reads_two, reads_none]
    )
    _, alone = target.forward_batch_with_features([BatchRow(target.new_cache(1), ids) for ids in tokens], [1, 2])
    width = target.hidden_size
    assert torch.equal(features[0], alone[0][:, width:]) and torch.equal(features[1], alone[1])
    assert features[2] is None
    plain = target.forward_batch([BatchRow(target.new_cache(1), ids) for ids in tokens])
    assert all(torch.equal(a, b) for a, b in zip(logits, plain, strict=True))
