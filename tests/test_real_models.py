"""Greedy equality and rollback on the shipped default pair (Qwen2.5-Coder 1.5B target, 0.5B draft).

These load real weights (prepared once into the cache: a few minutes the first time) and
run a few short generations; `make test-fast` skips them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from quickdraft.api import Pipeline
from quickdraft.bench.peers import hf_greedy_generate
from quickdraft.bench.prompts import PROMPTS
from quickdraft.config import GenerationConfig, LogitAdjustments, SamplingParams
from quickdraft.policies.acceptance_head import AcceptanceHead

pytestmark = pytest.mark.real_model

NEW_TOKENS = 48
CASES = [  # (prompt, chat template?, γ for draft-model, γ for prompt-lookup)
    ("Write a Python function that merges two sorted lists into one sorted list.", True, 1, 4),
    ('def quicksort(arr):\n    """Sort a list of numbers with quicksort."""\n', False, 2, 3),
    ("What are three good habits for staying productive when working from home?", True, 3, 2),
    (PROMPTS["summarization"], True, 4, 1),
    (PROMPTS["code-edit"], True, 3, 4),
    ("Explain what a hash table is and why its lookups are fast on average.", True, 2, 3),
]


@pytest.fixture(scope="module")
def pair() -> Pipeline:
    return Pipeline.load(runtime="transformers")


# The tests on the float32 transformers pair (8 GB, the longest of the suite) run on one pytest-xdist worker,
# which loads it once; the group, the largest, is handed out first.
ON_TRANSFORMERS = pytest.mark.xdist_group("transformers-fp32")


def transformers_greedy(pair: Pipeline, prompt_ids: list[int]) -> list[int]:
    model = pair.target.model
    return hf_greedy_generate(model, prompt_ids, NEW_TOKENS, pair.eos_token_ids, pair.tokenizer.pad_token_id)


TRANSFORMERS_CASES = [CASES[0], CASES[1], CASES[3]]  # float32 transformers is slow: γ 1, 2, 4 and 4, 3, 1


@ON_TRANSFORMERS
@pytest.mark.parametrize(("prompt", "chat", "draft_gamma", "lookup_gamma"), TRANSFORMERS_CASES)
def test_greedy_speculation_equals_transformers_generate(
    pair: Pipeline, prompt: str, chat: bool, draft_gamma: int, lookup_gamma: int
) -> None:
    """Speculation's tokens are transformers' own greedy ``generate``'s; our plain decoding's too, on the first
    prompt (the tiny models check it on every shape: here it would only decode the same tokens again)."""
    prompt_ids = pair.encode(prompt, chat=chat)
    reference = transformers_greedy(pair, prompt_ids)
    assert len(reference) == NEW_TOKENS or reference[-1] in pair.eos_token_ids
    runs: list[tuple[str, int | None]] = [("draft-model", draft_gamma), ("prompt-lookup", lookup_gamma)]
    if prompt == CASES[0][0]:
        runs.insert(0, ("none", None))
    texts = set()
    for drafter, gamma in runs:
        config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=gamma)
        result = pair.generate(prompt_ids, config, drafter=drafter)
        assert result.token_ids == reference, f"{drafter} γ={gamma} diverged"
        texts.add(result.text)
    assert len(texts) == 1


@ON_TRANSFORMERS
def test_rollback_matches_fresh_prefill(pair: Pipeline) -> None:
    prompt_ids = pair.encode("Write a haiku about caches.", chat=True)
    for runtime in (pair.target, pair.draft):
        assert runtime is not None
        cache = runtime.new_cache(1)
        runtime.forward(torch.tensor([prompt_ids]), cache)
        runtime.forward(torch.tensor([[785, 6119, 374, 264]]), cache)  # a verify block, then 2 rejections
        cache.truncate(len(prompt_ids) + 2)
        after_rollback = runtime.forward(torch.tensor([[13]]), cache)[0, -1]
        fresh = runtime.forward(torch.tensor([[*prompt_ids, 785, 6119, 13]]), runtime.new_cache(1))[0, -1]
        torch.testing.assert_close(after_rollback, fresh, rtol=1e-4, atol=2e-3)
        assert int(after_rollback.argmax()) == int(fresh.argmax())


def test_cli_json_on_the_default_pair() -> None:
    command = [
        sys.executable,
        "-m",
        "quickdraft",
        "generate",
        "Say hello.",
        "--chat",
        "--max-new-tokens",
        "8",
        "--policy",
        "fixed:2",  # goodput would save a calibration measured under the tests' load where a user's run loads it
        "--json",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(completed.stdout)
    assert result["stats"]["new_tokens"] == len(result["token_ids"]) > 0
    assert result["target"].endswith("qwen2.5-coder-1.5b-instruct/hf")
    assert result["runtime"] == "native"  # the default for this family
    assert result["draft"].endswith("qwen2.5-coder-0.5b-instruct/hf")


def test_models_command_lists_prepared_models() -> None:
    command = [sys.executable, "-m", "quickdraft", "models", "--json"]
    rows = json.loads(subprocess.run(command, capture_output=True, text=True, timeout=600, check=True).stdout)
    names = ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"]
    assert [row["name"] for row in rows] == names and all(row["problem"] is None for row in rows)


# --- the native runtime on the default pair ------------------------------------------------------


@pytest.fixture(scope="module")
def native_pair() -> Pipeline:
    return Pipeline.load(runtime="native")


PLAIN_TOKENS: dict[tuple[tuple[int, ...], int], list[int]] = {}


def native_plain(native_pair: Pipeline, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain decoding's tokens on the native pair, decoded once per prompt and length and shared by the checks
    below: plain decoding is deterministic, so decoding again would only cost time."""
    key = (tuple(prompt_ids), max_new_tokens)
    if key not in PLAIN_TOKENS:
        config = GenerationConfig(max_new_tokens=max_new_tokens)
        PLAIN_TOKENS[key] = native_pair.generate(prompt_ids, config, drafter="none").token_ids
    return PLAIN_TOKENS[key]


@pytest.mark.parametrize(("prompt", "chat", "draft_gamma", "lookup_gamma"), CASES)
def test_native_greedy_speculation_equals_plain_decoding(
    native_pair: Pipeline, prompt: str, chat: bool, draft_gamma: int, lookup_gamma: int
) -> None:
    prompt_ids = native_pair.encode(prompt, chat=chat)
    plain = native_plain(native_pair, prompt_ids, NEW_TOKENS)
    for drafter, gamma in [("draft-model", draft_gamma), ("prompt-lookup", lookup_gamma)]:
        config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=gamma)
        result = native_pair.generate(prompt_ids, config, drafter=drafter)
        assert result.token_ids == plain, f"{drafter} γ={gamma} diverged"


@pytest.mark.parametrize("policy", ["heuristic", "confidence:0.4", "goodput"])
def test_every_policy_equals_plain_decoding_on_real_prompts(native_pair: Pipeline, policy: str) -> None:
    for drafter in ("hybrid", "draft-model", "prompt-lookup"):
        for prompt, chat, _, _ in CASES[:2]:
            prompt_ids = native_pair.encode(prompt, chat=chat)
            plain = native_plain(native_pair, prompt_ids, 32)
            config = GenerationConfig(max_new_tokens=32, policy=policy)
            result = native_pair.generate(prompt_ids, config, drafter=drafter)
            assert result.token_ids == plain, f"{drafter} with {policy} diverged"


def test_penalties_and_endings_keep_greedy_and_seeded_equality_on_real_prompts(native_pair: Pipeline) -> None:
    """Logit bias, penalties and vLLM's endings over the real 151,936-token vocabulary: speculation gives plain
    decoding's tokens, greedy and seeded."""
    prompt_ids = native_pair.encode(CASES[2][0], chat=True)
    adjustments = LogitAdjustments({13: -100.0}, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1)
    for sampling in (SamplingParams(), SamplingParams(temperature=0.7, seed=3, min_p=0.05)):
        config = GenerationConfig(  # token 382 is ".\n\n"
            max_new_tokens=32, sampling=sampling, adjustments=adjustments, min_tokens=8, stop_token_ids=(382,)
        )
        plain = native_pair.generate(prompt_ids, config, drafter="none")
        assert 13 not in plain.token_ids  # "." banned
        for drafter in ("hybrid", "draft-model"):
            result = native_pair.generate(prompt_ids, replace(config, policy="fixed:3"), drafter=drafter)
            assert result.token_ids == plain.token_ids and result.text == plain.text, (sampling, drafter)


def test_specdec_and_early_exit_equal_plain_decoding_on_real_prompts(native_pair: Pipeline) -> None:
    """The remaining policy and drafter of issue 5 on the real pair. The acceptance head is made up
    (every draft accepted with probability 0.88): a head changes how long blocks are, never the tokens."""
    assert native_pair.draft_path is not None
    features = json.loads((native_pair.draft_path / "config.json").read_text())["hidden_size"] + 2
    native_pair.drafter_records("draft-model").acceptance_head = AcceptanceHead(
        weight=torch.zeros(features), bias=torch.tensor(2.0), mean=torch.zeros(features), scale=torch.ones(features)
    )
    runs = [("draft-model", "specdec++"), ("early-exit", "fixed"), ("early-exit", "goodput")]
    for prompt, chat, _, _ in CASES[:2]:
        prompt_ids = native_pair.encode(prompt, chat=chat)
        plain = native_plain(native_pair, prompt_ids, 32)
        for drafter, policy in runs:
            config = GenerationConfig(max_new_tokens=32, policy=policy)
            result = native_pair.generate(prompt_ids, config, drafter=drafter)
            assert result.token_ids == plain, f"{drafter} with {policy} diverged"


def test_native_logits_are_bitwise_equal_in_steps_and_blocks(native_pair: Pipeline) -> None:
    prompt_ids = native_pair.encode("Write a haiku about caches.", chat=True)
    block = [785, 6119, 374, 264, 13, 576]
    for runtime in (native_pair.target, native_pair.draft):
        assert runtime is not None
        stepped_cache, block_cache = runtime.new_cache(1), runtime.new_cache(1)
        runtime.forward(torch.tensor([prompt_ids]), stepped_cache, last_only=True)
        runtime.forward(torch.tensor([prompt_ids[:-3]]), block_cache, last_only=True)
        runtime.forward(torch.tensor([prompt_ids[-3:]]), block_cache)  # the same prefix, cut differently
        stepped = torch.cat([runtime.forward(torch.tensor([[token]]), stepped_cache) for token in block], dim=1)
        in_block = runtime.forward(torch.tensor([block]), block_cache)
        assert torch.equal(stepped, in_block)
        block_cache.truncate(len(prompt_ids) + 2)  # roll back, recompute
        assert torch.equal(runtime.forward(torch.tensor([block[2:]]), block_cache), in_block[:, 2:])


GUARD_TEXT = PROMPTS["summarization"] + "\n\n" + PROMPTS["code-edit"]  # the perplexity guard's text


def perplexity(logits: torch.Tensor, token_ids: torch.Tensor) -> float:
    """exp(mean negative log-likelihood) of ``token_ids [1, T]`` under ``logits [1, T, V]``."""
    log_probs = torch.log_softmax(logits[0, :-1].double(), dim=-1)
    return float(torch.exp(-log_probs.gather(1, token_ids[0, 1:, None]).mean()))


@ON_TRANSFORMERS
def test_native_perplexity_is_within_3_percent_of_transformers_fp32(pair: Pipeline, native_pair: Pipeline) -> None:
    token_ids = torch.tensor([pair.tokenizer(GUARD_TEXT).input_ids])  # [1, T]
    with torch.no_grad():
        reference = perplexity(pair.target.model(token_ids).logits, token_ids)
    native = perplexity(native_pair.target.forward(token_ids, native_pair.target.new_cache()), token_ids)
    assert token_ids.shape[1] > 250
    assert abs(native / reference - 1) < 0.03, (native, reference)


@ON_TRANSFORMERS
def test_the_targets_q4_k_tensors_are_loaded_exactly(pair: Pipeline, native_pair: Pipeline) -> None:
    """The GGUF file's Q4_K tensors become q4 parts with no second quantization: their weights are exactly the
    float weights transformers dequantized from the same file. q and k of every layer are Q4_K there, v only in
    some layers (Q6_K in the others), so the first part holds q and k and, where v is Q4_K too, v."""
    weights = pair.target.model.state_dict()
    for index, layer in enumerate(native_pair.target.decoder.layers):
        q4 = layer.qkv.parts[0]
        assert q4.kind == "q4", index
        prefix = f"model.layers.{index}.self_attn."
        qkv = torch.cat([weights[prefix + name + "_proj.weight"] for name in ("q", "k", "v")])  # [Q+K+V, H]
        dequantized = q4.dequantize()  # [rows, H]
        num_qk_rows = weights[prefix + "q_proj.weight"].shape[0] + weights[prefix + "k_proj.weight"].shape[0]
        assert dequantized.shape[0] in (num_qk_rows, qkv.shape[0]), index
        assert torch.equal(dequantized, qkv[: dequantized.shape[0]].float()), index


def test_concurrent_greedy_requests_in_batches_equal_plain_decoding(native_pair: Pipeline) -> None:
    """Continuous batching on the default pair: 9 greedy requests of mixed prompts, budgets and drafters, decoded
    together (prompts read in chunks beside decoding requests) give bitwise single-request plain decoding's tokens."""
    from quickdraft.engine import Engine, Request, RequestFinished, SchedulerSettings

    settings = SchedulerSettings(max_running=9, prefill_tokens_per_step=64)
    engine = Engine(native_pair.target, native_pair.tokenizer, native_pair.eos_token_ids, settings)
    prompts = [(prompt, chat) for prompt, chat, _, _ in CASES] + [
        ("def fibonacci(n):", False),
        ("Translate to German: The cache is warm.", True),
        ("List three prime numbers.", True),
    ]
    drafters = [("draft-model", "fixed:3"), ("prompt-lookup", "fixed:4"), ("none", None), ("hybrid", "fixed:3")]
    results: dict[int, list[int]] = {}
    requests = []
    for i, (prompt, chat) in enumerate(prompts):
        drafter, policy = drafters[i % len(drafters)]
        config = GenerationConfig(max_new_tokens=32 + i % 3 * 4, policy=policy)  # long enough to overlap
        prompt_ids = tuple(native_pair.encode(prompt, chat=chat))
        requests.append(Request(prompt_ids, config, native_pair.drafter(drafter), str(i)))

    def sink(i: int):  # -> Sink
        return lambda event: isinstance(event, RequestFinished) and results.setdefault(i, event.result.token_ids)

    for i, request in enumerate(requests):
        engine.submit(request, sink(i))
    batch_sizes = []
    while (report := engine.step()) is not None:
        batch_sizes.append(report.decoding)
    assert max(batch_sizes) >= 8
    for i, request in enumerate(requests):
        plain = native_plain(native_pair, list(request.prompt_ids), request.config.max_new_tokens)
        assert results[i] == plain, (i, drafters[i % len(drafters)])


def test_openais_weather_example_becomes_a_tool_call(native_pair: Pipeline) -> None:
    """The default target's template renders the tools; its answer (a json fence on this model) is parsed as the
    call, the same with and without speculation."""
    from quickdraft.server.tool_formats import tool_format_of
    from quickdraft.server.tools import ToolRequest

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}  # fmt: skip
    prompt_ids = native_pair.encode_chat(
        [{"role": "user", "content": "What's the weather like in Boston today?"}], [weather]
    )
    answers = [
        native_pair.generate(prompt_ids, GenerationConfig(max_new_tokens=48, num_draft_tokens=gamma), drafter)
        for drafter, gamma in (("none", 0), ("hybrid", 3))
    ]
    assert answers[0].token_ids == answers[1].token_ids
    found = tool_format_of(native_pair.tokenizer)
    assert found is not None and found.name.startswith("Hermes")
    _, calls = ToolRequest((weather,), "auto", frozenset({"get_weather"}), found).split_calls(answers[0].text)
    assert [call["function"]["name"] for call in calls] == ["get_weather"]
    assert "Boston" in json.loads(calls[0]["function"]["arguments"])["location"]
