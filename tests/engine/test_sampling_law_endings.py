"""The unseeded sampling law where answers end and γ depends on the drafts: an end-of-sequence token drafted inside a
block with an adaptive policy (confidence), a stop string, a grammar's mask, vLLM's min_tokens (no end before two
tokens), stop_token_ids and ignore_eos. χ² of the first new tokens (padded
after an end) against the exact law, enumerated, with a negative control."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from conftest import BigramTableRuntime, chi_square_pvalue, word_tokenizer

import quickdraft.lossless.rules
from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.engine import Engine, Request, RequestFinished, SchedulerSettings
from quickdraft.grammar import GrammarKind, GrammarSpec
from quickdraft.lossless.sampling import logits_to_probs, sample
from quickdraft.lossless.verify import VerificationResult

VOCAB, EOS, STOP_TOKEN = 7, 6, 3  # w0 .. w5 and <eos>; the stop string is w3's text
LENGTH, PAD, SAMPLES = 4, VOCAB, 3_000  # the first LENGTH new tokens, PAD after an end
FITS, REJECTED = 1e-4, 1e-5
SAMPLING = SamplingParams(temperature=1.0, top_p=0.95)
PROMPT = (1, 2)
WORDS = GrammarSpec(GrammarKind.REGEX, "(w1|w2|w3|w4)+")  # then the answer may end


def grammar_allows(position: int) -> set[int]:
    return {1, 2, 3, 4} if position == 0 else {1, 2, 3, 4, EOS}


def no_end_before_two(position: int) -> set[int]:
    return set(range(VOCAB)) - ({EOS} if position < 2 else set())


CASES: dict[str, tuple[GenerationConfig, Callable[[int], set[int]] | None]] = {
    "eos, confidence": (GenerationConfig(policy="confidence:0.45"), None),
    "stop string": (GenerationConfig(policy="fixed:4", stop=("w3",)), None),
    "grammar": (GenerationConfig(policy="fixed:3", grammar=WORDS), grammar_allows),
    "min_tokens": (GenerationConfig(policy="fixed:3", min_tokens=2), no_end_before_two),
    "stop token, ignore_eos": (GenerationConfig(policy="fixed:3", ignore_eos=True, stop_token_ids=(4,)), None),
}


def exact_law(target: BigramTableRuntime, ends: set[int], allows: Callable[[int], set[int]] | None) -> torch.Tensor:
    """P(the first LENGTH new tokens) ``[V + 1] * LENGTH`` under plain sampling, PAD after an end."""
    law = torch.zeros([VOCAB + 1] * LENGTH, dtype=torch.float64)

    def walk(context: list[int], answer: list[int], probability: float) -> None:
        if len(answer) == LENGTH or (answer and answer[-1] in ends):
            law[tuple(answer + [PAD] * (LENGTH - len(answer)))] += probability
            return
        logits = target.table[context[-2], context[-1]].clone()  # [V]
        if allows is not None:
            logits[[token for token in range(VOCAB) if token not in allows(len(answer))]] = -torch.inf
        probs = logits_to_probs(logits[None], SAMPLING)[0].double()  # [V]
        for token in (token for token in range(VOCAB) if probs[token] > 0):
            walk([*context, token], [*answer, token], probability * float(probs[token]))

    walk(list(PROMPT), [], 1.0)
    return law


def pvalue(case: str) -> float:
    config, allows = CASES[case]
    target, draft = (BigramTableRuntime.random(VOCAB, seed=seed, scale=1.5) for seed in (0, 1))
    pipeline = Pipeline(target=target, draft=draft, tokenizer=word_tokenizer(VOCAB), eos_token_ids=frozenset({EOS}))
    engine = Engine(target, pipeline.tokenizer, pipeline.eos_token_ids, SchedulerSettings(max_waiting=SAMPLES))
    drafter = pipeline.drafter("draft-model")
    counts = torch.zeros([VOCAB + 1] * LENGTH, dtype=torch.float64)

    def sink(event: object) -> None:
        if isinstance(event, RequestFinished):
            tokens = list(event.result.token_ids)
            if event.result.finish_reason == "stop" and tokens[-1:] != [STOP_TOKEN]:  # the stop string's token
                tokens.append(STOP_TOKEN)
            tokens = tokens[:LENGTH]
            counts[tuple(tokens + [PAD] * (LENGTH - len(tokens)))] += 1

    config = replace(config, max_new_tokens=LENGTH + 2, sampling=SAMPLING, max_draft_tokens=6)
    for _ in range(SAMPLES):
        engine.submit(Request(PROMPT, config, drafter), sink)
    engine.run_until_idle()
    ends = set(config.end_token_ids(frozenset({EOS}))) | ({STOP_TOKEN} if config.stop else set())
    return chi_square_pvalue(counts, exact_law(target, ends, allows))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_answers_that_end_follow_the_target_distribution(case: str) -> None:
    assert pvalue(case) > FITS


def accept_every_draft(draft_token_ids, draft_probs, target_probs, generator) -> VerificationResult:
    """A wrong rule: every draft accepted, the bonus token drawn from the target."""
    batch_size, num_drafts = draft_token_ids.shape
    num_accepted = torch.full((batch_size,), num_drafts, dtype=torch.long)
    return VerificationResult(num_accepted, sample(target_probs[torch.arange(batch_size), num_accepted], generator))


@pytest.mark.usefixtures("one_thread", "numbered_generators")
def test_chi_square_catches_a_rule_that_accepts_every_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quickdraft.lossless.rules, "block_verify", accept_every_draft)
    assert pvalue("eos, confidence") < REJECTED
