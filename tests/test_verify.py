"""Verification rules: exact enumeration of the acceptance step, and direct checks."""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2, chisquare

from quickdraft.config import SamplingParams
from quickdraft.lossless.rules import verify_drafts
from quickdraft.lossless.sampling import gumbel_argmax, position_noise
from quickdraft.lossless.verify import (
    TreeVerification,
    accept_tree,
    acceptance_probs,
    block_coins,
    block_judgement,
    block_verify,
    coupled_verify,
    greedy_verify,
    rejection_sample,
    residual_probs,
    seeded_verify,
)


def distributions(vocab_size: int, count: int) -> st.SearchStrategy[torch.Tensor]:
    """``count`` random distributions over ``vocab_size`` tokens, zeros included."""
    weight = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1.0))
    rows = st.lists(weight, min_size=vocab_size, max_size=vocab_size).filter(lambda row: sum(row) > 0)
    return st.lists(rows, min_size=count, max_size=count).map(
        lambda table: (lambda t: t / t.sum(-1, keepdim=True))(torch.tensor(table, dtype=torch.float64))
    )


def step_distribution(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the token one acceptance step commits at a position.

    Enumerates every draft token x ~ q: with acceptance_probs(x) the output is x, otherwise
    a sample of residual_probs. ``target``, ``draft``: [V].
    """
    vocab_size = target.shape[0]
    out = torch.zeros(vocab_size, dtype=torch.float64)
    residual = residual_probs(target[None, None], draft[None, None])[0, 0]
    for x in range(vocab_size):
        if draft[x] == 0:
            continue
        accept = acceptance_probs(torch.tensor([[x]]), draft[None, None], target[None, None])[0, 0]
        out[x] += draft[x] * accept
        out += draft[x] * (1 - accept) * residual
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(distributions(v, 1), distributions(v, 1))))
def test_one_step_reproduces_target_distribution_exactly(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    target, draft = pair[0][0], pair[1][0]
    assert torch.allclose(step_distribution(target, draft), target, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda v: st.tuples(distributions(v, 1 + v), distributions(v, 1 + v), distributions(v, 1 + v * v))
    )
)
def test_two_drafts_reproduce_joint_target_distribution_exactly(
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """γ = 2 with context-dependent p and q: the joint law of the first two committed tokens is p1·p2.

    target/draft rows: [0] = first position, [1 + x1] = second position after x1. The third
    table is what the next step's target would sample after a rejection at position 1.
    """
    target, draft, _ = tables
    vocab_size = target.shape[1]
    joint = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)
    residual_1 = residual_probs(target[None, :1], draft[None, :1])[0, 0]
    for x1, x2 in itertools.product(range(vocab_size), repeat=2):
        q = draft[0, x1] * draft[1 + x1, x2]
        if q == 0:
            continue
        drafts = torch.tensor([[x1, x2]])
        draft_probs = torch.stack([draft[0], draft[1 + x1]])[None]  # [1, 2, V]
        target_probs = torch.stack([target[0], target[1 + x1], target[0]])[None]  # [1, 3, V]; bonus unused
        accept_1, accept_2 = acceptance_probs(drafts, draft_probs, target_probs)[0]
        residual_2 = residual_probs(target_probs[:, 1:2], draft_probs[:, 1:2])[0, 0]
        # rejected at 1: token 1 from the residual, token 2 from the next step's target
        joint += q * (1 - accept_1) * residual_1[:, None] * target[1:]
        # accepted at 1: token 2 is x2 if accepted, else from the residual at 2
        joint[x1, x2] += q * accept_1 * accept_2
        joint[x1] += q * accept_1 * (1 - accept_2) * residual_2
    expected = target[0][:, None] * target[1:]
    assert torch.allclose(joint, expected, atol=1e-6)


def test_rejection_sample_draws_from_target_distribution() -> None:
    """The function itself, many rows at once: first committed token ~ p (χ² test)."""
    generator = torch.Generator().manual_seed(0)
    rows, vocab_size = 40_000, 6
    target = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.0, 0.30])
    draft = torch.tensor([0.40, 0.10, 0.20, 0.10, 0.15, 0.05])
    draft_token_ids = torch.multinomial(draft, rows, replacement=True, generator=generator)[:, None]  # [B, 1]
    result = rejection_sample(
        draft_token_ids, draft.expand(rows, 1, vocab_size), target.expand(rows, 2, vocab_size), generator
    )
    first = torch.where(result.num_accepted > 0, draft_token_ids[:, 0], result.next_token_ids)
    counts = torch.bincount(first, minlength=vocab_size).double()
    assert counts[4] == 0  # p = 0 is never produced
    keep = target > 0
    expected = rows * target[keep].double() / target[keep].double().sum()
    assert chisquare(counts[keep], expected).pvalue > 1e-3


def test_rejection_sample_one_hot_draft_and_bonus() -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])  # [1, 3, 3]
    accepted_all = rejection_sample(torch.tensor([[1, 2]]), None, target, generator)
    assert accepted_all.num_accepted.tolist() == [2] and accepted_all.next_token_ids.tolist() == [0]
    rejected = rejection_sample(torch.tensor([[0, 2]]), None, target, generator)
    assert rejected.num_accepted.tolist() == [0] and rejected.next_token_ids.tolist() == [1]


def test_rejection_sample_with_no_drafts_samples_the_target() -> None:
    target = torch.tensor([[[0.0, 0.0, 1.0]]])
    result = rejection_sample(torch.empty(1, 0, dtype=torch.long), None, target, None)
    assert result.num_accepted.tolist() == [0] and result.next_token_ids.tolist() == [2]


def test_residual_of_equal_distributions_is_the_target() -> None:
    p = torch.tensor([[[0.5, 0.5]]])
    assert torch.equal(residual_probs(p, p), p)


def test_greedy_verify_accepts_longest_matching_prefix() -> None:
    logits = torch.nn.functional.one_hot(torch.tensor([[3, 1, 4, 1]]), 5).float()  # target argmax 3 1 4 | 1
    full = greedy_verify(torch.tensor([[3, 1, 4]]), logits)
    assert full.num_accepted.tolist() == [3] and full.next_token_ids.tolist() == [1]
    assert full.committed_token_ids(torch.tensor([[3, 1, 4]])) == [3, 1, 4, 1]
    partial = greedy_verify(torch.tensor([[3, 2, 4]]), logits)
    assert partial.num_accepted.tolist() == [1] and partial.next_token_ids.tolist() == [1]
    none = greedy_verify(torch.tensor([[0, 1, 4]]), logits)
    assert none.num_accepted.tolist() == [0] and none.next_token_ids.tolist() == [3]


def test_greedy_verify_batch_rows_are_independent() -> None:
    logits = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3], [1, 2, 3]]), 4).float()
    result = greedy_verify(torch.tensor([[1, 2], [1, 0]]), logits)
    assert result.num_accepted.tolist() == [2, 1] and result.next_token_ids.tolist() == [3, 2]


# -- shared-noise coupling (seeded sampling) -------------------------------------------------------


def test_coupled_verify_accepts_drafts_equal_to_the_targets_samples() -> None:
    """Uniform p and noise that singles out tokens 3 1 4 | 0: those are the target's samples."""
    target_probs = torch.full((1, 4, 5), 0.2)  # [1, γ + 1, V]
    noise = 10.0 * torch.nn.functional.one_hot(torch.tensor([[3, 1, 4, 0]]), 5)  # [1, γ + 1, V]
    target_probs = target_probs.log()  # scores
    full = coupled_verify(torch.tensor([[3, 1, 4]]), target_probs, noise)
    assert full.num_accepted.tolist() == [3] and full.next_token_ids.tolist() == [0]
    partial = coupled_verify(torch.tensor([[3, 2, 4]]), target_probs, noise)
    assert partial.num_accepted.tolist() == [1] and partial.next_token_ids.tolist() == [1]
    plain = coupled_verify(torch.empty(1, 0, dtype=torch.long), target_probs[:, :1], noise[:, :1])
    assert plain.num_accepted.tolist() == [0] and plain.next_token_ids.tolist() == [3]
    never = coupled_verify(torch.tensor([[3]]), torch.tensor([[[0.5, 0.5, 0, 0, 0]] * 2]).log(), noise[:, :2])
    assert never.num_accepted.tolist() == [0] and never.next_token_ids.tolist() in ([0], [1])  # p = 0: never


@pytest.mark.parametrize("num_drafts", [0, 1, 3, 6])
def test_seeded_verify_is_coupled_verify_under_the_positions_noise(num_drafts: int) -> None:
    """The fast path against the reference: the same choices on random scores, with drafts that match the target's
    samples for a while (every number of accepted drafts occurs)."""
    generator, accepted = torch.Generator().manual_seed(num_drafts), set()
    for trial in range(40):
        scores = torch.log_softmax(3 * torch.randn(1, num_drafts + 1, 500, generator=generator), -1)  # [1, γ + 1, V]
        noise = position_noise(9, range(100 + trial, 101 + trial + num_drafts), 500)  # [γ + 1, V]
        target_choices = gumbel_argmax(scores, noise[None])  # [1, γ + 1]
        draft_token_ids = target_choices[:, :num_drafts].clone()  # [1, γ]
        draft_token_ids[0, trial % (num_drafts + 1) :] += 1  # wrong from there (none wrong at γ)
        expected = coupled_verify(draft_token_ids, scores, noise[None])
        result = seeded_verify(draft_token_ids, scores.clone(), 9, 100 + trial)
        assert torch.equal(result.num_accepted, expected.num_accepted)
        assert torch.equal(result.next_token_ids, expected.next_token_ids)
        accepted.add(int(result.num_accepted[0]))
    assert accepted == set(range(num_drafts + 1))


@pytest.mark.parametrize("sampling", [SamplingParams(0.7, seed=3), SamplingParams(0.7, 5, 0.9, 3), SamplingParams(0.7)])
def test_verify_drafts_leaves_the_targets_logits_alone(sampling: SamplingParams) -> None:
    """The engine reads the target's logits again after verifying (log-probabilities): the seeded rule's in-place
    noise and the unseeded rule work on tensors of their own."""
    generator = torch.Generator().manual_seed(1)
    target_logits = torch.randn(1, 4, 300, generator=generator)  # [1, γ + 1, V]
    draft_probs = None if sampling.is_seeded else torch.softmax(torch.randn(1, 3, 300, generator=generator), -1)
    before = target_logits.clone()
    verify_drafts(torch.tensor([[1, 2, 3]]), draft_probs, target_logits, sampling, generator, 50)
    assert torch.equal(target_logits, before)


VOCAB = 4
TABLES = torch.softmax(2.0 * torch.randn(2, 1 + VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)), dim=-1)
TARGET, DRAFT = TABLES.double()  # [1 + V, V] each: row 0 = the first position, row 1 + x1 = the second after x1
TARGET[0, 2] = 0.0  # a token the target never chooses first
TARGET[0] /= TARGET[0].sum()


def coupled_tokens(target: torch.Tensor, draft: torch.Tensor, noise: torch.Tensor) -> tuple[list[int], int]:
    """The first two tokens of γ = 2 speculation by the coupled rule, and the drafts accepted in its first step.

    noise: [3, V], positions 1, 2 and the bonus. A rejection at position 1 is followed by a plain step.
    """
    draft_1 = int(gumbel_argmax(draft[0].log(), noise[0]))
    draft_2 = int(gumbel_argmax(draft[1 + draft_1].log(), noise[1]))
    draft_token_ids = torch.tensor([[draft_1, draft_2]])  # [1, γ]
    target_probs = torch.stack([target[0], target[1 + draft_1], target[0]])[None]  # [1, γ + 1, V]; bonus unused
    result = coupled_verify(draft_token_ids, target_probs.log(), noise[None])
    tokens = result.committed_token_ids(draft_token_ids)
    if len(tokens) == 1:
        tokens.append(int(gumbel_argmax(target[1 + tokens[0]].log(), noise[1])))
    return tokens[:2], int(result.num_accepted[0])


def coupled_joint(noise_of_seed: Callable[[int], torch.Tensor], samples: int = 10_000) -> tuple[torch.Tensor, float]:
    """Counts ``[V, V]`` of the first two tokens over seeds 0, 1, ...; and the first draft's acceptance rate."""
    counts = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    accepted = 0
    for seed in range(samples):
        (first, second), num_accepted = coupled_tokens(TARGET, DRAFT, noise_of_seed(seed))
        counts[first, second] += 1
        accepted += num_accepted > 0
    return counts, accepted / samples


def joint_pvalue(counts: torch.Tensor) -> float:
    expected = TARGET[0][:, None] * TARGET[1:]  # [V, V]: p1(y1) p2(y2 | y1)
    if counts[expected == 0].sum() > 0:
        return 0.0
    keep = expected > 0
    statistic = float(((counts[keep] - counts.sum() * expected[keep]) ** 2 / (counts.sum() * expected[keep])).sum())
    return float(chi2.sf(statistic, df=int(keep.sum()) - 1))


@pytest.mark.usefixtures("one_thread")
def test_coupled_speculation_draws_the_targets_joint_distribution() -> None:
    """Over 10,000 seeds, the first two committed tokens follow p1·p2 (χ²), though drafts come from q."""
    counts, first_accepted = coupled_joint(lambda seed: position_noise(seed, range(3), VOCAB))
    assert joint_pvalue(counts) > 1e-4
    assert 0.2 < first_accepted < 0.95  # drafts from q were accepted, and rejected


@pytest.mark.usefixtures("one_thread")
def test_coupled_chi_square_catches_noise_shared_between_positions() -> None:
    """Negative control: one noise for every position (seeded by the seed alone) correlates the tokens."""
    counts, _ = coupled_joint(lambda seed: position_noise(seed, range(1), VOCAB).expand(3, VOCAB))
    assert joint_pvalue(counts) < 1e-6


def test_a_draft_equal_to_the_target_is_always_accepted_with_shared_noise() -> None:
    for seed in range(200):
        _, num_accepted = coupled_tokens(TARGET, TARGET, position_noise(seed, range(3), VOCAB))
        assert num_accepted == 2


def prefix_tables(vocab_size: int, depth: int, seed: int, one_hot: bool = False) -> dict[tuple[int, ...], torch.Tensor]:
    """A random distribution ``[V]`` after every prefix of up to ``depth`` tokens, some entries zero (one-hot:
    a drafter without probabilities)."""
    generator = torch.Generator().manual_seed(seed)
    tables = {}
    for length in range(depth + 1):
        for prefix in itertools.product(range(vocab_size), repeat=length):
            weights = torch.rand(vocab_size, generator=generator, dtype=torch.float64) ** 3
            weights[torch.rand(vocab_size, generator=generator) < 0.3] = 0.0
            if one_hot or weights.sum() == 0:
                weights = torch.nn.functional.one_hot(weights.argmax(), vocab_size).double()
            tables[prefix] = weights / weights.sum()
    return tables


def block_step_law(
    target: dict[tuple[int, ...], torch.Tensor], draft: dict[tuple[int, ...], torch.Tensor], gamma: int, vocab: int
) -> tuple[torch.Tensor, float]:
    """Exact law of one block-verification step's tokens, completed by the target to γ + 1 tokens ``[V] * (γ + 1)``,
    and the expected number of accepted drafts, enumerating every draft block and every coin outcome."""
    joint, expected_accepted = torch.zeros([vocab] * (gamma + 1), dtype=torch.float64), 0.0
    for block in itertools.product(range(vocab), repeat=gamma):
        q_block = math.prod(float(draft[block[:i]][x]) for i, x in enumerate(block))
        if q_block == 0:
            continue
        draft_probs = torch.stack([draft[block[:i]] for i in range(gamma)])[None]  # [1, γ, V]
        target_probs = torch.stack([target[block[:i]] for i in range(gamma + 1)])[None]  # [1, γ + 1, V]
        passes, dists = block_judgement(torch.tensor([block]), draft_probs, target_probs)
        h = passes[0].tolist()
        for tau in range(gamma + 1):  # τ: the longest prefix whose coin passed
            p_tau = (h[tau - 1] if tau > 0 else 1.0) * math.prod(1.0 - h[j] for j in range(tau, gamma))
            expected_accepted += q_block * p_tau * tau
            for y in range(vocab):
                out = (*block[:tau], y)
                weight = q_block * p_tau * float(dists[0, tau, y])
                if weight > 0:
                    joint += weight * completed(target, out, gamma + 1, vocab)
    return joint, expected_accepted


def completed(
    target: dict[tuple[int, ...], torch.Tensor], prefix: tuple[int, ...], length: int, vocab: int
) -> torch.Tensor:
    """The law ``[V] * length`` of ``prefix`` followed by the target's own tokens up to ``length`` tokens."""
    law = torch.zeros([vocab] * length, dtype=torch.float64)
    for rest in itertools.product(range(vocab), repeat=length - len(prefix)):
        sequence = (*prefix, *rest)
        law[sequence] = math.prod(float(target[sequence[:i]][sequence[i]]) for i in range(len(prefix), length))
    return law


def token_wise_expected_accepted(target: dict, draft: dict, gamma: int, vocab: int) -> float:
    """E[accepted drafts] of Leviathan's token-by-token rule on the same blocks."""
    total = 0.0
    for block in itertools.product(range(vocab), repeat=gamma):
        q_block = math.prod(float(draft[block[:i]][x]) for i, x in enumerate(block))
        if q_block == 0:
            continue
        draft_probs = torch.stack([draft[block[:i]] for i in range(gamma)])[None]
        target_probs = torch.stack([target[block[:i]] for i in range(gamma + 1)])[None]
        accept = acceptance_probs(torch.tensor([block]), draft_probs, target_probs)[0]
        total += q_block * float(accept.cumprod(0).sum())
    return total


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_block_verification_reproduces_the_targets_joint_law_and_accepts_no_fewer(gamma: int, seed: int) -> None:
    """Exact enumeration, V = 3, context-dependent p and q with zeros: a step's tokens completed by the target
    have the target's joint law, and block verification accepts at least as many drafts in expectation as
    token-by-token rejection (its Theorem 2; equal at γ = 1)."""
    vocab = 3
    target = prefix_tables(vocab, gamma, 2 * seed)
    draft = prefix_tables(vocab, gamma - 1, 2 * seed + 1, one_hot=seed % 4 == 3)
    joint, block_accepted = block_step_law(target, draft, gamma, vocab)
    assert torch.allclose(joint, completed(target, (), gamma + 1, vocab), atol=1e-9)
    token_accepted = token_wise_expected_accepted(target, draft, gamma, vocab)
    assert block_accepted >= token_accepted - 1e-9
    if gamma == 1:
        assert block_accepted == pytest.approx(token_accepted, abs=1e-12)


STOPPING_RULES = {  # a policy that reads the drafts ends a block early: the block's length is a stopping time
    "the draft's confidence falls": lambda block, draft: float(draft[block].max()) < 0.6,
    "a draft of token 0": lambda block, draft: block[-1] == 0,
}


@pytest.mark.parametrize("rule", STOPPING_RULES)
@pytest.mark.parametrize("seed", range(6))
def test_block_verification_keeps_the_law_when_the_drafts_decide_the_blocks_length(rule: str, seed: int) -> None:
    """Exact enumeration, V = 3, γ at most 3: a step's tokens completed by the target have the target's joint law
    when the block ends where the drafts say (confidence, a copy's end, suffix decoding's length)."""
    vocab, gamma, stop = 3, 3, STOPPING_RULES[rule]
    target, draft = prefix_tables(vocab, gamma, 2 * seed), prefix_tables(vocab, gamma - 1, 2 * seed + 1)
    joint = torch.zeros([vocab] * (gamma + 1), dtype=torch.float64)

    def blocks(block: tuple[int, ...], q_block: float) -> Iterator[tuple[tuple[int, ...], float]]:
        if block and (len(block) == gamma or stop(block, draft)):
            yield block, q_block
            return
        for x in (x for x in range(vocab) if draft[block][x] > 0):
            yield from blocks((*block, x), q_block * float(draft[block][x]))

    for block, q_block in blocks((), 1.0):
        drafted = len(block)
        draft_probs = torch.stack([draft[block[:i]] for i in range(drafted)])[None]  # [1, γ', V]
        target_probs = torch.stack([target[block[:i]] for i in range(drafted + 1)])[None]  # [1, γ' + 1, V]
        passes, dists = block_judgement(torch.tensor([block]), draft_probs, target_probs)
        h = passes[0].tolist()
        for tau in range(drafted + 1):
            p_tau = (h[tau - 1] if tau > 0 else 1.0) * math.prod(1.0 - h[j] for j in range(tau, drafted))
            for y in (y for y in range(vocab) if q_block * p_tau * float(dists[0, tau, y]) > 0):
                weight = q_block * p_tau * float(dists[0, tau, y])
                joint += weight * completed(target, (*block[:tau], y), gamma + 1, vocab)
    assert torch.allclose(joint, completed(target, (), gamma + 1, vocab), atol=1e-9)


def test_block_verification_negative_control_a_wrong_coin_breaks_the_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """The enumeration above would catch a plausible mistake: the last coin h_γ = 1 (accept a block whose every
    earlier coin failed)."""
    import quickdraft.lossless.verify as verify

    real = verify.block_judgement

    def last_coin_always(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        passes, dists = real(*args)
        return torch.cat([passes[:, :-1], torch.ones_like(passes[:, -1:])], dim=1), dists

    target, draft = prefix_tables(3, 2, 0), prefix_tables(3, 1, 1)
    monkeypatch.setattr(sys.modules[__name__], "block_judgement", last_coin_always)
    joint, _ = block_step_law(target, draft, 2, 3)
    assert not torch.allclose(joint, completed(target, (), 3, 3), atol=1e-3)


def test_block_verify_draws_the_law_it_enumerates() -> None:
    """The sampling around the coins, many rows at once (χ² on the first committed token, and the accepted count
    against its exact mean); no drafts samples the target."""
    vocab, gamma, rows = 3, 2, 60_000
    target, draft = prefix_tables(vocab, gamma, 4), prefix_tables(vocab, gamma - 1, 5)
    _, expected_accepted = block_step_law(target, draft, gamma, vocab)
    generator = torch.Generator().manual_seed(0)
    first = torch.multinomial(draft[()], rows, replacement=True, generator=generator)  # [B]
    second = torch.stack([torch.multinomial(draft[(int(x),)], 1, generator=generator)[0] for x in first])  # [B]
    blocks = torch.stack([first, second], dim=1)  # [B, 2]
    draft_probs = torch.stack([torch.stack([draft[()], draft[(int(x),)]]) for x in first])  # [B, 2, V]
    target_probs = torch.stack(
        [torch.stack([target[()], target[(int(x),)], target[(int(x), int(y))]]) for x, y in blocks.tolist()]
    )  # [B, 3, V]
    result = block_verify(blocks, draft_probs, target_probs, generator)
    committed_first = torch.where(result.num_accepted > 0, blocks[:, 0], result.next_token_ids)
    counts = torch.bincount(committed_first, minlength=vocab).double()
    keep = target[()] > 0
    assert chisquare(counts[keep], rows * target[()][keep]).pvalue > 1e-3
    assert float(result.num_accepted.double().mean()) == pytest.approx(expected_accepted, abs=0.02)
    plain = block_verify(torch.empty(1, 0, dtype=torch.long), None, torch.tensor([[[0.0, 0.0, 1.0]]]), None)
    assert plain.num_accepted.tolist() == [0] and plain.next_token_ids.tolist() == [2]


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_block_verify_draws_from_the_judgements_distribution(gamma: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path against the rule: the weights block_verify draws from, normalized, are block_judgement's
    distribution after the drafts it accepted, on every row (rows where q = 2p leave residuals of mass 0: p there)."""
    import quickdraft.lossless.verify as verify

    generator = torch.Generator().manual_seed(gamma)
    batch, vocab = 400, 6
    target_probs = torch.softmax(2 * torch.randn(batch, gamma + 1, vocab, generator=generator), -1)  # [B, γ + 1, V]
    target_probs[:, :, 0] *= torch.rand(batch, gamma + 1, generator=generator) < 0.7  # zeros in p
    target_probs /= target_probs.sum(-1, keepdim=True)
    draft_probs = torch.softmax(2 * torch.randn(batch, gamma, vocab, generator=generator), -1)  # [B, γ, V]
    draft_probs[::5] = target_probs[::5, :gamma]  # p = q: every coin passes
    draft_probs[1::5] = 2 * target_probs[1::5, :gamma]  # q = 2p (a q of mass 2 is fine here): r = 0, τ < γ
    draft_token_ids = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).reshape(batch, gamma)
    drawn_from = []
    monkeypatch.setattr(verify, "sample", lambda weights, _: drawn_from.append(weights) or weights.argmax(-1))
    result = block_verify(draft_token_ids, draft_probs, target_probs, generator)
    _, dists = block_judgement(draft_token_ids, draft_probs, target_probs)  # [B, γ + 1, V]
    (weights,) = drawn_from
    expected = dists[torch.arange(batch), result.num_accepted]  # [B, V]
    torch.testing.assert_close(weights / weights.sum(-1, keepdim=True), expected, rtol=1e-5, atol=1e-7)
    assert set(result.num_accepted.tolist()) == set(range(gamma + 1))  # every τ occurred
    _, _, mass = block_coins(draft_token_ids, draft_probs, target_probs)  # [B, γ]
    stopped = torch.nonzero(result.num_accepted < gamma).squeeze(-1)  # rows drawn after a rejection
    assert gamma == 0 or (mass[stopped, result.num_accepted[stopped]] == 0).sum() > 20  # p drawn where r = 0


def tree_oracle_trial(rng: random.Random, rule: Callable = accept_tree) -> tuple[list[int], list[int], bool]:
    """A random target (a fixed choice for each prefix, as argmax or Gumbel-max under position noise is) over 3
    tokens, a random chain that often agrees with it, and random leaves: (the tree's committed tokens, the target's
    own tokens from the same prefix, whether a leaf was accepted)."""
    salt = rng.random()

    def choice(prefix: tuple[int, ...]) -> int:
        return random.Random(hash((salt, prefix))).randrange(3)

    prompt = (rng.randrange(3),)
    chain: list[int] = []
    for _ in range(rng.randrange(0, 5)):
        chain.append(choice(prompt + tuple(chain)) if rng.random() < 0.6 else rng.randrange(3))
    depths = [rng.randrange(1, len(chain) + 2) for _ in range(rng.randrange(0, 4))]
    leaves = [rng.randrange(3) for _ in depths]
    targets = [choice(prompt + tuple(chain[:j])) for j in range(len(chain) + 1)]
    targets += [
        choice(prompt + tuple(chain[: depth - 1]) + (leaf,)) for depth, leaf in zip(depths, leaves, strict=True)
    ]
    result = rule(chain, depths, leaves, targets)
    if result.leaf is None:
        committed = [*chain[: result.num_accepted], result.next_token_id]
    else:
        committed = [*chain[: result.num_accepted - 1], leaves[result.leaf], result.next_token_id]
    plain: list[int] = []
    while len(plain) < len(committed):
        plain.append(choice(prompt + tuple(plain)))
    return committed, plain, result.leaf is not None


def test_a_tree_commits_the_targets_own_tokens() -> None:
    """Greedy and seeded trees keep the chain's promise: the tokens committed are the target's own from the same
    prefix, whatever the chain and leaves; and leaves do get accepted."""
    rng = random.Random(0)
    leaves_accepted = 0
    for _ in range(3000):
        committed, plain, leaf = tree_oracle_trial(rng)
        assert committed == plain
        leaves_accepted += leaf
    assert leaves_accepted > 100


def test_tree_negative_control_a_leaf_one_depth_off_breaks_the_text() -> None:
    """A rule that takes a leaf one depth too deep (as a sibling of the next chain token) must fail the oracle."""

    def off_by_one(chain: list[int], depths: list[int], leaves: list[int], targets: list[int]) -> TreeVerification:
        return accept_tree(chain, [depth - 1 for depth in depths], leaves, targets)

    rng = random.Random(1)
    assert any(committed != plain for committed, plain, _ in (tree_oracle_trial(rng, off_by_one) for _ in range(500)))


def test_accept_tree_refuses_mismatched_rows() -> None:
    with pytest.raises(ValueError):
        accept_tree([1, 2], [1], [3], [1, 2, 3])  # 2 drafts and 1 leaf need 4 target tokens
