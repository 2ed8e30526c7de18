"""Verification rules: exact enumeration of the acceptance step, and direct checks."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2, chisquare

from quickdraft.lossless.sampling import gumbel_argmax, position_noise
from quickdraft.lossless.verify import acceptance_probs, coupled_verify, greedy_verify, rejection_sample, residual_probs


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
    full = coupled_verify(torch.tensor([[3, 1, 4]]), target_probs, noise)
    assert full.num_accepted.tolist() == [3] and full.next_token_ids.tolist() == [0]
    partial = coupled_verify(torch.tensor([[3, 2, 4]]), target_probs, noise)
    assert partial.num_accepted.tolist() == [1] and partial.next_token_ids.tolist() == [1]
    plain = coupled_verify(torch.empty(1, 0, dtype=torch.long), target_probs[:, :1], noise[:, :1])
    assert plain.num_accepted.tolist() == [0] and plain.next_token_ids.tolist() == [3]
    never = coupled_verify(torch.tensor([[3]]), torch.tensor([[[0.5, 0.5, 0, 0, 0]] * 2]), noise[:, :2])
    assert never.num_accepted.tolist() == [0] and never.next_token_ids.tolist() in ([0], [1])  # p = 0: never


VOCAB = 4
TABLES = torch.softmax(2.0 * torch.randn(2, 1 + VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)), dim=-1)
TARGET, DRAFT = TABLES.double()  # [1 + V, V] each: row 0 = the first position, row 1 + x1 = the second after x1
TARGET[0, 2] = 0.0  # a token the target never chooses first
TARGET[0] /= TARGET[0].sum()


def coupled_tokens(target: torch.Tensor, draft: torch.Tensor, noise: torch.Tensor) -> tuple[list[int], int]:
    """The first two tokens of γ = 2 speculation by the coupled rule, and the drafts accepted in its first step.

    noise: [3, V], positions 1, 2 and the bonus. A rejection at position 1 is followed by a plain step.
    """
    draft_1 = int(gumbel_argmax(draft[0], noise[0]))
    draft_2 = int(gumbel_argmax(draft[1 + draft_1], noise[1]))
    draft_token_ids = torch.tensor([[draft_1, draft_2]])  # [1, γ]
    target_probs = torch.stack([target[0], target[1 + draft_1], target[0]])[None]  # [1, γ + 1, V]; bonus unused
    result = coupled_verify(draft_token_ids, target_probs, noise[None])
    tokens = result.committed_token_ids(draft_token_ids)
    if len(tokens) == 1:
        tokens.append(int(gumbel_argmax(target[1 + tokens[0]], noise[1])))
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
