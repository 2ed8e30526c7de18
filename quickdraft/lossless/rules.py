"""The rules of a step that every request follows, whatever else runs beside it: which prompts fit, how a
token is chosen without drafts, which drafts are accepted, and how a step's tokens are committed up to the end
of the answer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.errors import ConfigError, PromptError
from quickdraft.lossless.sampling import choose_tokens, logits_to_probs, logits_to_scores
from quickdraft.lossless.verify import VerificationResult, block_verify, greedy_verify, seeded_verify
from quickdraft.text import IncrementalDecoder


def check_prompt(prompt_ids: Sequence[int], config: GenerationConfig, max_context: int, vocab_size: int) -> None:
    """Raise ``PromptError`` for an empty prompt, one with ids outside the vocabulary, or one that leaves no room
    for ``max_new_tokens``; ``ConfigError`` for a logit bias or a stop token outside the vocabulary."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give some text to continue")
    check_token_ids(prompt_ids, vocab_size, "prompt")
    stop_ids, bias = config.stop_token_ids, config.adjustments
    named = {"logit_bias": bias.largest_token_id, "stop_token_ids": max(stop_ids, default=-1)}
    for setting, largest in named.items():
        if largest >= vocab_size:
            message = f"{setting}'s token ids must be below the vocabulary's size {vocab_size}, got {largest}"
            raise ConfigError(message, setting)
    needed = len(prompt_ids) + config.max_new_tokens
    if needed > max_context:
        raise PromptError(
            f"the prompt has {len(prompt_ids)} tokens and max_new_tokens is {config.max_new_tokens}: "
            f"{needed} positions, but the model's context holds {max_context}; "
            f"shorten the prompt or lower max_new_tokens",
            "max_new_tokens",
        )


def check_token_ids(token_ids: Sequence[int], vocab_size: int, what: str) -> None:
    """Raise ``PromptError`` for a token id at or past the vocabulary's end (ids are non-negative ints already)."""
    if token_ids and max(token_ids) >= vocab_size:
        raise PromptError(
            f"the {what}'s token ids must be below the vocabulary's size {vocab_size}, got {max(token_ids)}"
        )


def choose_token(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator, position: int
) -> torch.Tensor:
    """One token per row from ``[B, V]`` logits for sequence position ``position``, as plain decoding chooses it."""
    return choose_tokens(logits_to_scores(logits, sampling), sampling, generator, position)


def verify_drafts(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator,
    position: int,
) -> VerificationResult:
    """A request's acceptance rule; ``position``: the sequence position of the first draft.

    ``draft_token_ids [1, γ]``, ``draft_probs [1, γ, V]`` (None: one-hot; only unseeded sampling reads them),
    ``target_logits [1, γ + 1, V]``.
    Greedy: drafts equal to the target's argmax. Seeded sampling: drafts equal to the target's Gumbel-max
    samples under the positions' noise, so the output is seeded plain decoding's whatever γ. Unseeded
    sampling: block verification (exact in distribution, at least as many drafts accepted as Leviathan's
    token-by-token rule). The drafts may be on the host: they are judged where the target's logits are.
    """
    draft_token_ids = draft_token_ids.to(target_logits.device)
    if sampling.is_greedy:
        return greedy_verify(draft_token_ids, target_logits)
    if sampling.is_seeded:
        target_scores = logits_to_scores(target_logits, sampling)  # [1, γ + 1, V], a tensor of its own
        return seeded_verify(draft_token_ids, target_scores, sampling.seed, position)
    return block_verify(draft_token_ids, draft_probs, logits_to_probs(target_logits, sampling), generator)


def commit_tokens(
    step_tokens: list[int],
    committed: list[int],
    new_token_ids: list[int],
    decoder: IncrementalDecoder,
    eos_token_ids: frozenset[int],
    max_new_tokens: int,
) -> str | None:
    """Commit a step's tokens one by one (to ``committed``, ``new_token_ids`` and, but for an ending token of
    ``eos_token_ids``, ``decoder``) up to the end of the answer: the finish reason ("eos", "stop", "length") where it
    ends, None while it goes on."""
    for token in step_tokens:
        committed.append(token)
        new_token_ids.append(token)
        if token in eos_token_ids:  # an ending token is in the answer's ids, never in its text (vLLM's stop tokens)
            return "eos"
        decoder.add(token)
        if decoder.stopped:
            return "stop"
        if len(new_token_ids) == max_new_tokens:
            return "length"
    return None


def committed_drafts(num_proposed: int, num_accepted: int, num_committed: int) -> tuple[int, int]:
    """(judged, accepted) drafts of a step that committed only its first ``num_committed`` tokens.

    A step commits its accepted drafts, then the target's token. When the answer stops at an accepted
    draft (end of sequence, a stop string), the drafts after it never reach the answer: like drafts
    after a rejection, they count as neither judged nor accepted.
    """
    if num_committed > num_accepted:  # the target's token was committed: every verdict stands
        return num_proposed, num_accepted
    return num_committed, num_committed
