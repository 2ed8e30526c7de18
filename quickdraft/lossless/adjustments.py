"""What a request adds to the target's logits before a token is chosen: OpenAI's ``logit_bias``, ``presence_penalty``
and ``frequency_penalty``, and the ``repetition_penalty`` of vLLM and transformers.

The rule at a position, in this order:
1. ``logit_bias``: each listed token's logit plus its bias;
2. ``repetition_penalty`` r: a token already in the prompt or the answer has its logit divided by r if positive,
   multiplied by r otherwise;
3. ``frequency_penalty`` f and ``presence_penalty`` p: a token that the answer holds c times gets ``- f·c - p·[c > 0]``.

"The answer" at a position is every token before it: the committed ones, then, for a verified row, the drafts
before that row. So a verified row gets exactly the logits plain decoding would have at its position, and greedy,
seeded and sampled outputs keep their promises under speculation: the target's distribution is the adjusted one
at every position, plain and speculative alike. Drafters do not see the adjustments: they only change how often
drafts are accepted. :func:`mask_ends` is vLLM's ``min_tokens`` by the same rule: a position's mask depends on the
position alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from quickdraft.errors import ConfigError
from quickdraft.lossless.sampling import as_python, is_int, is_number

MAX_BIAS = 100.0  # OpenAI's range for a logit bias: [-100, 100]
MAX_PENALTY = 2.0  # OpenAI's range for the presence and frequency penalties: [-2, 2]
# repetition_penalty's range: far past any use, and a logit divided by the smallest stays finite in float32
REPETITION_PENALTY_RANGE = (0.01, 100.0)


@dataclass(frozen=True)
class LogitAdjustments:
    """A request's logit bias and penalties (the rule above); the defaults change nothing.

    ``logit_bias`` maps token ids to biases in [-100, 100] (a mapping is stored as sorted pairs);
    ``presence_penalty`` and ``frequency_penalty`` lie in [-2, 2]; ``repetition_penalty`` in [0.01, 100] (1: off).
    """

    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        bias = self.logit_bias
        pairs = list(bias.items()) if isinstance(bias, Mapping) else bias
        if not isinstance(pairs, tuple | list):
            raise ConfigError(f"logit_bias must map token ids to biases, got {bias!r}", "logit_bias")
        checked: dict[int, float] = {}
        for pair in pairs:
            token, value = pair if isinstance(pair, tuple | list) and len(pair) == 2 else (None, None)
            token, value = as_python(token), as_python(value)
            if not is_int(token) or token < 0:
                raise ConfigError(f"logit_bias's keys must be token ids (ints >= 0), got {token!r}", "logit_bias")
            if token in checked:
                raise ConfigError(f"logit_bias gives token {token} twice: give each token's bias once", "logit_bias")
            if not (is_number(value) and -MAX_BIAS <= value <= MAX_BIAS):
                message = f"logit_bias's values must be numbers in [-100, 100], got {value!r} for token {token}"
                raise ConfigError(message, "logit_bias")
            checked[int(token)] = float(value)
        object.__setattr__(self, "logit_bias", tuple(sorted(checked.items())))
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            object.__setattr__(self, name, as_python(getattr(self, name)))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
                raise ConfigError(f"{name} must be a number in [-2, 2], got {value!r}", name)
        penalty, (low, high) = self.repetition_penalty, REPETITION_PENALTY_RANGE
        if not (is_number(penalty) and low <= penalty <= high):
            message = f"repetition_penalty must be a number in [{low:g}, {high:g}] (1 = off), got {penalty!r}"
            raise ConfigError(message, "repetition_penalty")

    @property
    def changes_logits(self) -> bool:
        """False for the defaults: the logits are the model's own."""
        return bool(self.logit_bias) or self.penalizes

    @property
    def penalizes(self) -> bool:
        """A penalty reads the tokens before a position."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @functools.cached_property
    def bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``logit_bias`` as ``[N]`` token ids and ``[N]`` biases, made once (a map may hold the whole vocabulary)."""
        ids = torch.tensor([token for token, _ in self.logit_bias], dtype=torch.long)
        return ids, torch.tensor([bias for _, bias in self.logit_bias], dtype=torch.float32)

    @property
    def largest_token_id(self) -> int:
        """The largest id ``logit_bias`` names (-1: none), checked against the vocabulary by the engine."""
        return self.logit_bias[-1][0] if self.logit_bias else -1


def prompt_tokens(prompt_ids: Sequence[int]) -> torch.Tensor:
    """The distinct tokens of a prompt ``[P']``, sorted: what :func:`adjust_logits` reads of it, made once."""
    return torch.unique(torch.tensor(prompt_ids, dtype=torch.long))


def adjust_logits(
    adjustments: LogitAdjustments,
    logits: torch.Tensor,
    prompt_ids: Sequence[int] | torch.Tensor,
    answer_ids: Sequence[int],
    draft_ids: Sequence[int] = (),
) -> torch.Tensor:
    """``logits [R, V]`` of R consecutive positions -> adjusted ``[R, V]`` float32, a new tensor: row r follows
    ``answer_ids`` and the first r of ``draft_ids`` (R - 1 of them at least). ``prompt_ids``: the prompt, or its
    :func:`prompt_tokens`. Unchanged without adjustments."""
    if not adjustments.changes_logits:
        return logits
    logits = logits.to(torch.float32, copy=True)  # [R, V]
    if adjustments.logit_bias:
        tokens, biases = (tensor.to(logits.device) for tensor in adjustments.bias_tensors)  # [N], [N]
        logits[:, tokens] += biases
    if not adjustments.penalizes:
        return logits
    num_rows = logits.shape[0]
    history = torch.tensor([*answer_ids, *draft_ids[: num_rows - 1]], dtype=torch.long)
    prompt = torch.as_tensor(prompt_ids if adjustments.repetition_penalty != 1 else (), dtype=torch.long)
    tokens, index = torch.unique(torch.cat([history, prompt]), return_inverse=True)  # [U], [H + P]
    if not len(tokens):  # no token before the first position that a penalty reads
        return logits
    num_answer = len(answer_ids)
    counts = torch.zeros(num_rows, len(tokens))  # [R, U]: row r counts the answer and r drafts
    counts += torch.bincount(index[:num_answer], minlength=len(tokens)).float()
    drafted = torch.nn.functional.one_hot(index[num_answer : len(history)], len(tokens)).float()  # [R - 1, U]
    counts[1:] += drafted.cumsum(dim=0)
    columns = logits[:, tokens.to(logits.device)]  # [R, U]
    counts = counts.to(logits.device)
    if adjustments.repetition_penalty != 1:
        in_prompt = torch.zeros(len(tokens), dtype=torch.bool)
        in_prompt[index[len(history) :]] = True
        seen = (counts > 0) | in_prompt.to(logits.device)  # [R, U]
        penalty = adjustments.repetition_penalty
        columns = torch.where(seen, torch.where(columns > 0, columns / penalty, columns * penalty), columns)
    columns = columns - adjustments.frequency_penalty * counts - adjustments.presence_penalty * (counts > 0).float()
    logits[:, tokens.to(logits.device)] = columns
    return logits


def mask_ends(logits: torch.Tensor, num_rows: int, end_token_ids: frozenset[int]) -> torch.Tensor:
    """``logits [R, V]`` with the end tokens masked (−inf) in the first ``num_rows`` rows, a new tensor: vLLM's
    ``min_tokens``, where the answer cannot end yet. A row left with no other token keeps its ends (a grammar that
    allows only the end there): the answer ends rather than drawing from nothing."""
    logits = logits.to(torch.float32, copy=True)  # [R, V]
    ends = torch.tensor(sorted(end_token_ids), dtype=torch.long, device=logits.device)  # [E]
    rows = logits[:num_rows]  # [r, V], a view
    masked = rows.index_fill(-1, ends, float("-inf"))
    logits[:num_rows] = torch.where(torch.isfinite(masked).any(dim=-1, keepdim=True), masked, rows)
    return logits
