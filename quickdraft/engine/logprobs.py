"""The log-probabilities of a request's new tokens (OpenAI's ``logprobs``/``top_logprobs``).

A token's log-probability is read from the distribution the target gives its position, the one plain decoding
draws from: after temperature, top-k and top-p (tokens they exclude have -inf). Greedy decoding draws from no
distribution, so there it is the model's own (temperature 1, nothing excluded). On the native runtime a position's
logits have the same bits whatever the drafts beside it, so the log-probabilities do not depend on speculation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.config import SamplingParams
from quickdraft.lossless.sampling import logits_to_probs


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log-probability) of the likeliest tokens, likeliest first


def token_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], sampling: SamplingParams, top: int
) -> list[TokenLogprob]:
    """``logits [n, V]`` at the positions of ``token_ids [n]``: each token's log-probability and the ``top``
    likeliest tokens', fewer where the sampling (top-k, top-p, min-p) leaves fewer a probability above 0: an excluded
    token is no alternative."""
    if not token_ids:
        return []
    logits = logits[: len(token_ids)].float()  # [n, V]
    greedy = sampling.is_greedy
    logprobs = torch.log_softmax(logits, dim=-1) if greedy else logits_to_probs(logits, sampling).log()  # [n, V]
    chosen = logprobs[torch.arange(len(token_ids)), torch.tensor(list(token_ids))].tolist()  # [n]
    values, indices = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)  # [n, top]: a vocabulary may hold fewer
    return [
        TokenLogprob(
            token, value, tuple(pair for pair in zip(row_indices, row_values, strict=True) if pair[1] > -math.inf)
        )
        for token, value, row_indices, row_values in zip(
            token_ids, chosen, indices.tolist(), values.tolist(), strict=True
        )
    ]
