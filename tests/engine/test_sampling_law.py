"""The sampling law through the engine on tiny random bigram models: χ² against the exact distribution, with
negative controls.

A run's new tokens 2, 3 and 4 are counted: with max_new_tokens 4 and γ 2, the first step drafts tokens 2 and 3,
so the window sees drafts accepted, corrections, and token 4 as the bonus of a step whose drafts all passed.
Seeded runs verify by shared-noise coupling, unseeded ones by rejection sampling (from generators seeded 0, 1,
2, ...). Requests run one at a time (each a batch of one) or 100 at a time (every step verifies many requests
together); negative controls plug a wrong rule or a wrong bonus token into the one engine, and the same test
rejects them either way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from conftest import BigramTableRuntime, adjusted_by_hand, chi_square_pvalue, listed_tokenizer, word_tokenizer

import quickdraft.drafters.draft_model
import quickdraft.engine.engine
import quickdraft.engine.request
import quickdraft.lossless.rules
from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DrafterOptions
from quickdraft.engine import Engine, Request, RequestFinished, SchedulerSettings
from quickdraft.lossless.adjustments import LogitAdjustments
from quickdraft.lossless.sampling import logits_to_probs, sample
from quickdraft.lossless.verify import VerificationResult
from quickdraft.vocabularies import VocabularyBridge

VOCAB, SAMPLES, TOP_P = 6, 3_000, 0.9
FITS, REJECTED = 1e-4, 1e-5  # p-values: above FITS the law holds; a negative control must fall below REJECTED
TOP_P_SAMPLING = SamplingParams(temperature=1.0, top_p=TOP_P)
TOP_K_SAMPLING = SamplingParams(temperature=1.0, top_k=3)
WINDOW_CONFIG = GenerationConfig(max_new_tokens=4, num_draft_tokens=2)
PROMPT_FOR = {"none": [1, 2], "draft-model": [1, 2], "prompt-lookup": [0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 1]}
PROMPT_FOR["hybrid"] = PROMPT_FOR["prompt-lookup"]  # copies where it repeats, the model elsewhere
AT_ONCE = 100  # requests in flight together, batched
RULES = pytest.mark.parametrize("seeded", [True, False], ids=["seeded", "unseeded"])
MODES = pytest.mark.parametrize("at_once", [1, AT_ONCE], ids=["alone", "batched"])
# a foreign draft's vocabulary: four of the target's words (w2 and w4 missing) in another order, three of its own
FOREIGN_WORDS = ["w3", "x0", "w1", "w0", "x1", "w5", "<eos>", "x2"]
NONE = LogitAdjustments()
# strong enough that a row adjusted as if the drafts before it were not there draws visibly another law
PENALTIES = LogitAdjustments({4: 1.0, 0: -1.5}, presence_penalty=1.0, frequency_penalty=1.0, repetition_penalty=1.5)


def table_pipeline(foreign: bool = False) -> Pipeline:
    """Bigram-table target and draft; ``foreign``: a draft with FOREIGN_WORDS for its vocabulary, through a bridge
    (TLI when sampling)."""
    target = BigramTableRuntime.random(VOCAB, seed=0, scale=1.5)
    tokenizer = word_tokenizer(VOCAB + 1)
    if not foreign:
        draft = BigramTableRuntime.random(VOCAB, seed=1, scale=1.5)
        return Pipeline(target=target, draft=draft, tokenizer=tokenizer, eos_token_ids=frozenset())
    draft = BigramTableRuntime.random(len(FOREIGN_WORDS), seed=1, scale=1.5)
    bridge = VocabularyBridge(tokenizer, listed_tokenizer(FOREIGN_WORDS), VOCAB, len(FOREIGN_WORDS))
    return Pipeline(target=target, draft=draft, tokenizer=tokenizer, eos_token_ids=frozenset(), bridge=bridge)


def window_distribution(target: BigramTableRuntime, prompt_ids: list[int], sampling: SamplingParams) -> torch.Tensor:
    """P(new tokens 2, 3, 4) ``[V, V, V]`` under plain sampling: p(y1) p(y2 | y1) p(y3 | y1 y2) p(y4 | y2 y3),
    enumerated and summed over y1."""
    probs = logits_to_probs(target.table, sampling).double()  # [V, V, V]: p(next | previous, current)
    first = probs[prompt_ids[-2], prompt_ids[-1]]  # [V]
    return torch.einsum("a,ab,abc,bcd->bcd", first, probs[prompt_ids[-1]], probs, probs)


def adjusted_window_distribution(
    target: BigramTableRuntime, prompt_ids: list[int], sampling: SamplingParams, adjustments: LogitAdjustments
) -> torch.Tensor:
    """:func:`window_distribution` with a logit bias and penalties: each position's distribution from its logits
    adjusted by hand after the answer before it, enumerated over new tokens 1 to 3."""

    def probs_after(answer: list[int]) -> torch.Tensor:  # [V]
        context = [*prompt_ids, *answer]
        logits = adjusted_by_hand(adjustments, target.table[context[-2], context[-1]].tolist(), prompt_ids, answer)
        return logits_to_probs(torch.tensor([logits]), sampling)[0].double()

    window = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    first = probs_after([])
    for y1, y2, y3 in itertools.product(range(VOCAB), repeat=3):
        before = first[y1] * probs_after([y1])[y2] * probs_after([y1, y2])[y3]
        window[y2, y3] += before * probs_after([y1, y2, y3])
    return window


def sampled_window(
    drafter: str,
    sampling: SamplingParams,
    seeded: bool,
    at_once: int,
    foreign: bool = False,
    adjustments: LogitAdjustments = NONE,
) -> torch.Tensor:
    """Counts ``[V, V, V]`` of new tokens 2, 3, 4 over SAMPLES requests (seeds 0, 1, ... when seeded), ``at_once``
    of them in flight together."""
    pipeline, prompt = table_pipeline(foreign), tuple(PROMPT_FOR[drafter])
    settings = SchedulerSettings(  # the prompts of a whole batch read in one step
        max_running=at_once, max_waiting=SAMPLES, prefill_tokens_per_step=at_once * len(prompt)
    )
    engine = Engine(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, settings)
    drafter_object = pipeline.drafter(drafter, DrafterOptions(prompt_lookup_max_ngram=2))
    decoded: list[list[int]] = []

    def sink(event: object) -> None:
        if isinstance(event, RequestFinished):
            decoded.append(event.result.token_ids)

    for run in range(SAMPLES):
        config = replace(
            WINDOW_CONFIG, sampling=replace(sampling, seed=run if seeded else None), adjustments=adjustments
        )
        engine.submit(Request(prompt, config, drafter_object), sink)
    steps = 0
    while engine.step() is not None:
        steps += 1
    assert len(decoded) == SAMPLES
    assert at_once == 1 or steps < 4 * SAMPLES / at_once + 4  # many requests per step
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    for token_ids in decoded:
        counts[tuple(token_ids[1:4])] += 1
    return counts


def window_pvalue(
    drafter: str,
    sampling: SamplingParams,
    seeded: bool,
    at_once: int = 1,
    foreign: bool = False,
    adjustments: LogitAdjustments = NONE,
) -> float:
    counts = sampled_window(drafter, sampling, seeded, at_once, foreign, adjustments)
    target, prompt = table_pipeline().target, PROMPT_FOR[drafter]
    if adjustments.changes_logits:
        return chi_square_pvalue(counts, adjusted_window_distribution(target, prompt, sampling, adjustments))
    return chi_square_pvalue(counts, window_distribution(target, prompt, sampling))


@RULES
@pytest.mark.parametrize("drafter", ["none", "draft-model", "prompt-lookup", "hybrid"])
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_sampled_tokens_follow_the_target_distribution(drafter: str, seeded: bool) -> None:
    assert window_pvalue(drafter, TOP_P_SAMPLING, seeded) > FITS


@RULES
@pytest.mark.parametrize("drafter", ["draft-model", "hybrid"])
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_batched_sampled_tokens_follow_the_target_distribution(drafter: str, seeded: bool) -> None:
    assert window_pvalue(drafter, TOP_P_SAMPLING, seeded, AT_ONCE) > FITS


@pytest.mark.parametrize(("seeded", "at_once"), [(True, 1), (False, 1), (False, AT_ONCE)])
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_foreign_draft_sampled_tokens_follow_the_target_distribution(seeded: bool, at_once: int) -> None:
    """A draft with a vocabulary of its own (TLI: its distribution over the shared words, in target ids)."""
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded, at_once, foreign=True) > FITS


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_top_k_sampled_tokens_follow_the_target_distribution(seeded: bool) -> None:
    assert window_pvalue("draft-model", TOP_K_SAMPLING, seeded) > FITS


@RULES
@MODES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_penalized_sampled_tokens_follow_the_adjusted_distribution(seeded: bool, at_once: int) -> None:
    """Logit bias and penalties: every position samples the target's adjusted distribution after the tokens before
    it, drafts included."""
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded, at_once, adjustments=PENALTIES) > FITS


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_penalties_that_forget_the_drafts(seeded: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: every verified row penalized as if the drafts before it were not there must fail."""
    real = quickdraft.engine.request.adjust_logits

    def forgetting_the_drafts(adjustments, logits, prompt_ids, answer_ids, draft_ids=()):
        return torch.cat([real(adjustments, row[None], prompt_ids, answer_ids) for row in logits])

    monkeypatch.setattr(quickdraft.engine.request, "adjust_logits", forgetting_the_drafts)
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded, adjustments=PENALTIES) < REJECTED


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


@MODES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_acceptance_rule(at_once: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the same test with a wrong rule plugged into the engine must fail.

    (With one-hot drafts the wrong rule only accepts where p(x) = 1 and otherwise samples p,
    which happens to be right, so the control uses the draft model.)
    """
    monkeypatch.setattr(quickdraft.lossless.rules, "block_verify", wrong_rule)
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded=False, at_once=at_once) < REJECTED


@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_foreign_drafts_that_report_another_q(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control for the foreign draft's law: drafts drawn from TLI's q but reported with another (its square,
    renormalized: the mistake of verifying against the wrong distribution) must fail."""
    real = quickdraft.drafters.draft_model.draw

    def draw_reporting_another_q(*args: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens, probs = real(*args)
        return tokens, None if probs is None else probs**2 / (probs**2).sum(-1, keepdim=True)

    monkeypatch.setattr(quickdraft.drafters.draft_model, "draw", draw_reporting_another_q)
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded=False, foreign=True) < REJECTED


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
@MODES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_wrong_bonus_token(seeded: bool, at_once: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: every third bonus token (all drafts accepted) replaced by token 0 must fail."""
    wrong = every_third_bonus_to_token_0(quickdraft.engine.engine.verify_drafts)
    monkeypatch.setattr(quickdraft.engine.engine, "verify_drafts", wrong)
    assert window_pvalue("draft-model", TOP_P_SAMPLING, seeded, at_once) < REJECTED


@RULES
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_speculative_sampling_drafts_were_accepted(seeded: bool) -> None:
    """The law above is not trivially met by rejecting everything, and its window sees bonus tokens."""
    pipeline = table_pipeline()
    runs = [
        pipeline.generate(
            [1, 2],
            replace(WINDOW_CONFIG, sampling=replace(TOP_P_SAMPLING, seed=run if seeded else None)),
            "draft-model",
        )
        for run in range(200)
    ]
    accepted = sum(run.stats.draft_tokens_accepted for run in runs)
    assert 0.2 < accepted / sum(run.stats.draft_tokens_proposed for run in runs) < 0.95
    with_bonus = sum(run.stats.step_sizes[1] == 3 for run in runs)  # the first step: two drafts and the bonus
    assert 0.05 < with_bonus / len(runs) < 0.95
