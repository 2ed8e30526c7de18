"""Verification: decide which drafted tokens the target accepts. Pure functions.

The rules take ``draft_token_ids [B, γ]`` and the target's scores for the γ + 1 positions
that follow the last committed token (position i scores the token after draft i - 1, the
last one is the bonus position). Each returns how many drafts every row accepts and the
one token the target contributes after them, so every step commits ``num_accepted + 1``
tokens.

- ``greedy_verify``: greedy decoding.
- ``seeded_verify``: seeded sampling. The target's token at each position is its Gumbel-max
  sample under noise fixed by (seed, position); drafts drawn with the same noise are accepted
  while they equal it. Every committed token is the target's own sample, so the output is
  seeded plain decoding's, whatever γ. ``coupled_verify`` is the same rule over noise given as
  a tensor, kept as the reference ``seeded_verify`` is tested against.
- ``accept_tree``: greedy or seeded, a chain with leaves (the draft's other choices at its depths, verified in the
  same forward: ``Decoder.forward_tree``); every committed token is still the target's own choice.
- ``block_verify``: unseeded sampling (Sun et al. 2025): the drafts are judged as a block, which accepts at
  least as many in expectation as judging them token by token (``rejection_sample``, Leviathan et al. 2023,
  kept as the reference it is compared with; ``block_judgement``, its distributions normalized, is the
  reference for the row ``block_verify`` draws from). The output at a position depends on whether it was
  drafted, so both are exact in distribution only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.lossless.sampling import add_position_noise_, argmax, gumbel_argmax, sample


@dataclass(frozen=True)
class VerificationResult:
    num_accepted: torch.Tensor  # [B] int64: drafts accepted, 0..γ
    next_token_ids: torch.Tensor  # [B] int64: the target's token after them (correction or bonus)

    def committed_token_ids(self, draft_token_ids: torch.Tensor, row: int = 0) -> list[int]:
        """The tokens row ``row`` commits this step: accepted drafts, then the target's token."""
        num_accepted = int(self.num_accepted[row])
        return [*draft_token_ids[row, :num_accepted].tolist(), int(self.next_token_ids[row])]


def greedy_verify(draft_token_ids: torch.Tensor, target_logits: torch.Tensor) -> VerificationResult:
    """Accept the longest prefix of drafts equal to the target's argmax, then its next argmax.

    draft_token_ids: [B, γ]; target_logits: [B, γ + 1, V].
    """
    return accept_matching_prefix(draft_token_ids, argmax(target_logits))


def coupled_verify(
    draft_token_ids: torch.Tensor, target_scores: torch.Tensor, noise: torch.Tensor
) -> VerificationResult:
    """Accept the longest prefix of drafts equal to the target's Gumbel-max samples, then its next sample.

    draft_token_ids: [B, γ]; target_scores: [B, γ + 1, V], log-probabilities up to a constant per row
    (``sampling.logits_to_scores``); noise: [B, γ + 1, V], the Gumbel noise of the γ + 1 positions
    (``sampling.position_noise``), the same the drafter drew its tokens with. Lossless: the token committed
    at a position is argmax(log p + g), an exact sample from p.
    """
    return accept_matching_prefix(draft_token_ids, gumbel_argmax(target_scores, noise))


def seeded_verify(
    draft_token_ids: torch.Tensor, target_scores: torch.Tensor, seed: int, position: int
) -> VerificationResult:
    """:func:`coupled_verify` under the seeded noise of positions ``position`` .. ``position + γ``, added to
    ``target_scores`` in place: the same choices, without a copy of the noise. The caller gives up the scores.

    draft_token_ids: [1, γ]; target_scores: [1, γ + 1, V], a tensor of the caller's own (``logits_to_scores``
    makes one).
    """
    noisy_scores = add_position_noise_(target_scores[0], seed, position)  # [γ + 1, V]
    return accept_matching_prefix(draft_token_ids, argmax(noisy_scores)[None])


def accept_matching_prefix(draft_token_ids: torch.Tensor, target_token_ids: torch.Tensor) -> VerificationResult:
    """The drafts up to the first that differs from the target's choice, then the target's choice there.

    draft_token_ids: [B, γ]; target_token_ids: [B, γ + 1], the target's token at each position.
    """
    num_drafts = draft_token_ids.shape[1]
    if num_drafts == 0:  # a plain step (most steps of a busy batch): the target's token
        return VerificationResult(torch.zeros_like(target_token_ids[:, 0]), target_token_ids[:, 0])
    matches = draft_token_ids == target_token_ids[:, :num_drafts]  # [B, γ]
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)  # [B]
    next_token_ids = target_token_ids.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return VerificationResult(num_accepted=num_accepted, next_token_ids=next_token_ids)


@dataclass(frozen=True)
class TreeVerification:
    num_accepted: int  # drafts committed: the chain's accepted prefix, and the accepted leaf if there is one
    leaf: int | None  # which leaf was accepted (an index into the leaves), or None
    next_token_id: int  # the target's token after them (from the leaf's own row when a leaf was accepted)


def accept_tree(
    chain_token_ids: list[int], leaf_depths: list[int], leaf_token_ids: list[int], target_token_ids: list[int]
) -> TreeVerification:
    """The drafts of a chain with leaves that the target's choices accept: the chain's longest prefix equal to
    them; where the chain stops, at depth d, a leaf at depth d equal to the target's choice there, and then the
    target's choice after that leaf (its own row). Lossless wherever the chain rule is: every committed token is
    the target's choice at its position after the tokens before it (greedy: its argmax; seeded: its Gumbel-max
    sample under that position's noise, so the text is seeded plain decoding's).

    chain_token_ids: [γ], the drafts at depths 1..γ; leaf_depths, leaf_token_ids: [L], depths in 1..γ + 1;
    target_token_ids: [γ + 1 + L], the target's choice after each row of ``Decoder.forward_tree``'s tree: the
    chain's rows (the last committed token, then the drafts), then the leaves'.
    """
    num_drafts = len(chain_token_ids)
    if len(target_token_ids) != num_drafts + 1 + len(leaf_depths) or len(leaf_token_ids) != len(leaf_depths):
        raise ValueError("the target chooses a token after each row: the chain's γ + 1 rows, then each leaf's")
    num_accepted = 0
    while num_accepted < num_drafts and chain_token_ids[num_accepted] == target_token_ids[num_accepted]:
        num_accepted += 1
    wanted = target_token_ids[num_accepted]  # the target's token at depth num_accepted + 1
    for leaf, (depth, token) in enumerate(zip(leaf_depths, leaf_token_ids, strict=True)):
        if depth == num_accepted + 1 and token == wanted:
            return TreeVerification(num_accepted + 1, leaf, target_token_ids[num_drafts + 1 + leaf])
    return TreeVerification(num_accepted, None, wanted)


def acceptance_probs(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> torch.Tensor:
    """min(1, p(x) / q(x)) for each drafted token x (Leviathan et al. 2023, p = target, q = draft).

    draft_token_ids: [B, γ]; draft_probs: [B, γ, V]; target_probs: [B, γ(+1), V] -> [B, γ].
    """
    num_drafts = draft_token_ids.shape[1]
    index = draft_token_ids[..., None]  # [B, γ, 1]
    target_prob_of_draft = target_probs[:, :num_drafts].gather(-1, index).squeeze(-1)  # [B, γ]
    draft_prob_of_draft = draft_probs.gather(-1, index).squeeze(-1)  # [B, γ]
    ratio = target_prob_of_draft / draft_prob_of_draft.clamp(min=torch.finfo(draft_probs.dtype).tiny)
    return ratio.clamp(max=1.0)


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after a rejection. ``[B, γ, V]`` each.

    The residual mass is zero only when p == q, where a rejection cannot happen; p is
    returned there so the result is always a distribution.
    """
    residual = (target_probs - draft_probs).clamp(min=0)  # [B, γ, V]
    mass = residual.sum(dim=-1, keepdim=True)  # [B, γ, 1]
    return torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(residual.dtype).tiny), target_probs)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerificationResult:
    """Lossless speculative sampling: the committed tokens are distributed exactly as p.

    draft_token_ids: [B, γ]; draft_probs: [B, γ, V] (None for a drafter without
    probabilities: q is one-hot on the drafted token); target_probs: [B, γ + 1, V].
    Draft i is accepted with probability min(1, p(x)/q(x)); at the first rejection the
    target's token is sampled from norm(max(0, p - q)); if all γ pass, from p at the bonus
    position.
    """
    batch_size, num_drafts = draft_token_ids.shape
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_token_ids, target_probs.shape[-1]).to(target_probs.dtype)
    accept = acceptance_probs(draft_token_ids, draft_probs, target_probs)  # [B, γ]
    uniform = torch.rand(accept.shape, generator=generator, device=accept.device)  # [B, γ]
    num_accepted = (uniform < accept).long().cumprod(dim=1).sum(dim=1)  # [B]
    next_token_dists = torch.cat(
        [residual_probs(target_probs[:, :num_drafts], draft_probs), target_probs[:, num_drafts:]], dim=1
    )  # [B, γ + 1, V]: residual at a rejection, p at the bonus position
    rows = torch.arange(batch_size, device=num_accepted.device)
    next_token_ids = sample(next_token_dists[rows, num_accepted], generator)  # [B]
    return VerificationResult(num_accepted=num_accepted, next_token_ids=next_token_ids)


def block_verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> VerificationResult:
    """Lossless block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", 2025):
    the longest block prefix whose coin passes (:func:`block_judgement`) is accepted (none: 0 drafts), then the
    target's token is drawn from that prefix's distribution.

    draft_token_ids: [B, γ]; draft_probs: [B, γ, V] (None: one-hot on the drafted token); target_probs:
    [B, γ + 1, V].
    """
    batch_size, num_drafts = draft_token_ids.shape
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(draft_token_ids, target_probs.shape[-1]).to(target_probs.dtype)
    passes, residual, mass = block_coins(draft_token_ids, draft_probs, target_probs)  # [B, γ], [B, γ, V], [B, γ]
    uniform = torch.rand(passes.shape, generator=generator, device=passes.device)  # [B, γ]
    prefixes = torch.arange(1, num_drafts + 1, device=passes.device)  # [γ]
    passing = torch.where(uniform < passes, prefixes, 0)  # [B, γ]: the length of each passing prefix, else 0
    num_accepted = passing.max(dim=1).values if num_drafts > 0 else passing.new_zeros(batch_size)  # [B]
    rows = torch.arange(batch_size, device=num_accepted.device)
    next_weights = target_probs[rows, num_accepted]  # [B, V]: p after all γ, or where the residual is 0
    if num_drafts > 0:  # block_judgement's norm(r_τ), left to sample to normalize: only the drawn row is needed
        stop = num_accepted.clamp(max=num_drafts - 1)  # [B]
        from_residual = (num_accepted < num_drafts) & (mass[rows, stop] > 0)  # [B]
        next_weights = torch.where(from_residual[:, None], residual[rows, stop], next_weights)  # [B, V]
    next_token_ids = sample(next_weights, generator)  # [B]
    return VerificationResult(num_accepted=num_accepted, next_token_ids=next_token_ids)


def block_judgement(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's coins and distributions: (h [B, γ], next-token distributions [B, γ + 1, V]).

    draft_token_ids: [B, γ]; draft_probs: [B, γ, V]; target_probs: [B, γ + 1, V]. With w_0 = 1 and
    w_i = min(1, w_(i−1) · p_i(X_i) / q_i(X_i)) (positions from 1; p_(i+1), q_(i+1) are the distributions after
    the first i drafts), the residual after i drafts is r_i = max(0, w_i · p_(i+1) − q_(i+1)). The prefix of
    i < γ drafts passes with h_i = |r_i| / (|r_i| + 1 − w_i) (1 where both are 0), all γ with h_γ = w_γ. After
    τ < γ accepted drafts the target's token comes from norm(r_τ) (p where r_τ = 0, which happens only where
    p = q), after all γ from p_(γ+1). With γ = 1 this is Leviathan's rule.
    """
    num_drafts, tiny = draft_token_ids.shape[1], torch.finfo(target_probs.dtype).tiny
    passes, residual, mass = block_coins(draft_token_ids, draft_probs, target_probs)
    residual_dists = torch.where(mass[..., None] > 0, residual / mass[..., None].clamp(min=tiny), target_probs[:, :-1])
    return passes, torch.cat([residual_dists, target_probs[:, num_drafts:]], dim=1)


def block_coins(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`block_judgement`'s coins h ``[B, γ]``, its residuals r_0 .. r_(γ−1) unnormalized ``[B, γ, V]`` and
    their masses ``[B, γ]``."""
    batch_size, num_drafts = draft_token_ids.shape
    tiny = torch.finfo(target_probs.dtype).tiny
    index = draft_token_ids[..., None]  # [B, γ, 1]
    target_prob_of_draft = target_probs[:, :num_drafts].gather(-1, index).squeeze(-1)  # [B, γ]
    draft_prob_of_draft = draft_probs.gather(-1, index).squeeze(-1).clamp(min=tiny)  # [B, γ]
    weights = [torch.ones(batch_size, dtype=target_probs.dtype, device=target_probs.device)]  # w_0: [B]
    for i in range(num_drafts):
        weights.append((weights[-1] * target_prob_of_draft[:, i] / draft_prob_of_draft[:, i]).clamp(max=1.0))
    weight = torch.stack(weights, dim=1)  # [B, γ + 1]: w_0 .. w_γ
    residual = torch.mul(weight[:, :num_drafts, None], target_probs[:, :num_drafts]).sub_(draft_probs).clamp_(min=0)
    mass = residual.sum(dim=-1)  # [B, γ]: |r_0| .. |r_(γ−1)|
    denominator = mass[:, 1:] + 1.0 - weight[:, 1:num_drafts]  # [B, γ − 1]
    passes = torch.where(denominator > 0, mass[:, 1:] / denominator.clamp(min=tiny), 1.0)  # h_1 .. h_(γ−1)
    passes = torch.cat([passes, weight[:, num_drafts:]], dim=1)[:, :num_drafts]  # [B, γ]: h_1 .. h_γ
    return passes, residual, mass  # residual: [B, γ, V]
