"""The engine on a CUDA GPU: the transformers runtime there, the lossless rules on device tensors, and the host
round trips of a step. Skipped without CUDA; ``tools/gpu_checks.py`` runs them where a GPU is."""

from __future__ import annotations

import warnings

import pytest
import torch
from scipy.stats import chi2

from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import SamplingParams, make_generator
from quickdraft.lossless.verify import block_verify
from quickdraft.runtime import HFRuntime, runtime_for
from quickdraft.runtime.device import resolve_device

from .conftest import VOCAB, cuda_pipeline

pytestmark = pytest.mark.gpu
PROMPTS = [[3, 17, 5], [9, 9, 40, 2, 11], [60, 1], [25, 24, 23, 22], [7], [33, 12, 50, 8, 19, 44]]
MAX_NEW = 24


def prefix_agreement(ours: list[int], theirs: list[int]) -> float:
    """The share of ``theirs`` that ``ours`` repeats before the first difference."""
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), len(theirs))
    return same / len(theirs)


def test_device_resolves_to_the_gpu_and_picks_the_transformers_runtime(tmp_path):
    assert resolve_device("auto").type == "cuda" and resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match="CUDA GPU"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
    assert runtime_for("auto", tmp_path, torch.device("cuda", 0)) is HFRuntime
    with pytest.raises(ConfigError, match="CPU only"):
        runtime_for("native", tmp_path, torch.device("cuda", 0))


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_logits_are_float32_on_the_gpu(family):
    pipeline = cuda_pipeline(family, torch.bfloat16)
    logits = pipeline.target.forward(torch.tensor([[1, 2, 3]]), pipeline.target.new_cache())
    assert logits.device.type == "cuda" and logits.dtype == torch.float32 and logits.shape == (1, 3, VOCAB)
    assert "NVIDIA" in pipeline.target.build or "cuda" in str(pipeline.target.device)


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_greedy_speculation_repeats_plain_decoding_in_fp32(family):
    """fp32 without TF32: verifying a block gives the argmax a token alone gives (sharp logits)."""
    pipeline = cuda_pipeline(family, torch.float32)
    for prompt in PROMPTS:
        plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW), drafter="none")
        for gamma in (1, 4):
            config = GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=gamma)
            ours = pipeline.generate(prompt, config, drafter="draft-model")
            assert ours.token_ids == plain.token_ids, (prompt, gamma)
            assert ours.stats.draft_tokens_accepted > 0


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_greedy_agreement_in_bf16_stays_high(family):
    """bf16 is not batch-invariant: a block's rounding can differ from a token's, so what holds is agreement, at a
    stated level (docs/gpu.md): at least 0.9 of plain decoding's tokens before the first difference, on average."""
    pipeline = cuda_pipeline(family, torch.bfloat16)
    shares = []
    for prompt in PROMPTS:
        plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW), drafter="none")
        ours = pipeline.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=4), "draft-model")
        shares.append(prefix_agreement(ours.token_ids, plain.token_ids))
    print(f"{family} bf16 greedy prefix agreement: {sum(shares) / len(shares):.3f} {shares}")
    assert sum(shares) / len(shares) >= 0.9


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_seeded_speculation_repeats_seeded_plain_decoding_in_fp32(family):
    pipeline = cuda_pipeline(family, torch.float32, logit_scale=3.0)
    sampling = SamplingParams(temperature=0.8, seed=1234)
    for prompt in PROMPTS[:3]:
        plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW, sampling=sampling), "none")
        config = GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=3, sampling=sampling)
        assert pipeline.generate(prompt, config, drafter="draft-model").token_ids == plain.token_ids


def test_unseeded_speculation_runs_on_the_gpu_generator():
    pipeline = cuda_pipeline("qwen2", torch.bfloat16, logit_scale=3.0)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=3, sampling=SamplingParams(temperature=1.0))
    result = pipeline.generate(PROMPTS[0], config, drafter="draft-model")
    assert len(result.token_ids) == MAX_NEW and result.stats.draft_tokens_proposed > 0


def first_token_counts(accept_all: bool, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification of 2 drafts from q against p, on the GPU, ``rows`` times at once: the counts of the first
    committed token, and p. ``accept_all`` is a broken rule (the drafts always pass): the negative control."""
    vocab = 5
    generator = make_generator(7, "cuda")
    target_probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], device="cuda")  # p at every position, [V]
    draft_probs = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2], device="cuda")  # q at every position, [V]
    drafts = torch.multinomial(draft_probs.expand(rows, vocab), 2, replacement=True, generator=generator)  # [B, 2]
    q = draft_probs.expand(rows, 2, vocab)  # [B, γ, V]
    p = target_probs.expand(rows, 3, vocab)  # [B, γ + 1, V]
    wrong = draft_probs.expand(rows, 3, vocab)  # judged against q itself: every draft passes, the output is q
    result = block_verify(drafts, q, wrong if accept_all else p, generator)
    first = torch.where(result.num_accepted > 0, drafts[:, 0], result.next_token_ids)  # [B]
    return torch.bincount(first, minlength=vocab).double().cpu(), target_probs.double().cpu()


@pytest.mark.parametrize("accept_all", [False, True])
def test_block_verification_on_device_tensors_keeps_the_target_distribution(accept_all):
    rows = 200_000
    counts, target = first_token_counts(accept_all, rows)
    statistic = float(((counts - rows * target) ** 2 / (rows * target)).sum())
    threshold = chi2.ppf(0.999, df=len(target) - 1)
    assert (statistic > threshold) if accept_all else (statistic < threshold), statistic


def test_host_round_trips_per_step_are_counted():
    """Synchronizing CUDA calls in a step: one per drafted token (to choose the next one) and a few per
    verification (the accepted count and token go to the host, which commits them). The count is bounded."""
    pipeline = cuda_pipeline("qwen2", torch.bfloat16)
    gamma = 4
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=gamma)
    pipeline.generate(PROMPTS[0], config, drafter="draft-model")  # warm-up
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = pipeline.generate(PROMPTS[1], config, drafter="draft-model")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(warning.message) for warning in caught)
    steps = result.stats.target_forwards
    per_step = syncs / steps
    print(f"synchronizing calls: {syncs} over {steps} target forwards, {per_step:.1f} a step at γ {gamma}")
    assert per_step <= 3 * gamma + 8


def test_prompt_and_answer_logprobs_are_read_from_device_logits():
    """Echo's prompt log-probabilities and an answer's, on GPU tensors: each prompt token's is the model's own at its
    position (a direct forward's, to fp32 rounding), and speculation changes neither."""
    pipeline = cuda_pipeline("qwen2", torch.float32, logit_scale=3.0)
    prompt = PROMPTS[5]
    logits = pipeline.target.forward(torch.tensor([prompt]), pipeline.target.new_cache())[0]  # [P, V]
    expected = torch.log_softmax(logits.float(), dim=-1)[torch.arange(len(prompt) - 1), prompt[1:]].tolist()  # [P-1]
    config = GenerationConfig(max_new_tokens=MAX_NEW, prompt_logprobs=2, logprobs=2, num_draft_tokens=3)
    results = [pipeline.generate(prompt, config, drafter=drafter) for drafter in ("none", "draft-model")]
    for result in results:
        assert [entry.logprob for entry in result.prompt_logprobs] == pytest.approx(expected, abs=1e-4)
        assert all(len(entry.top) == 2 for entry in result.prompt_logprobs + result.logprobs)
    plain, ours = results
    assert ours.token_ids == plain.token_ids and ours.stats.draft_tokens_accepted > 0
    assert [entry.logprob for entry in ours.logprobs] == pytest.approx([e.logprob for e in plain.logprobs], abs=1e-4)
