"""Turn logits into the distribution a token is drawn from (temperature, top-k, top-p), and draw it.

The same function processes target and draft logits: lossless rejection sampling is
exact for whatever distribution the target would sample from, provided the draft's q
is the distribution the drafted token was actually drawn from.

A seeded request draws every token by the Gumbel-max trick, argmax(log p + g), with noise g
that is a function of (seed, position, purpose) only: never of how many numbers were drawn
before. Plain decoding, the drafter and the verifier see the same noise at a position, so the
output is the same whatever γ a policy chooses (see ``coupled_verify``).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from quickdraft.errors import ConfigError

MAX_SEED = 2**64 - 1
# Noise is asked for at a position by the drafter, then by the verifier, and again by the next step
# after a rejection: keep the last few positions (4 bytes a vocabulary entry: 24 MB for 152k entries).
NOISE_CACHE_POSITIONS = 40


def is_int(value: object) -> bool:
    """An integer, and not a bool (``True`` is an int to Python, never a count or a seed to a user)."""
    return isinstance(value, int) and not isinstance(value, bool)


def as_python(value: Any) -> Any:
    """A NumPy scalar (``np.int64(5)``, ``np.float32(0.5)``, ``np.True_``) as the Python value it holds; any other
    value as it is: settings hold Python numbers, whose arithmetic does not wrap (a seed plus a choice's index)."""
    return value.item() if isinstance(value, np.generic) else value


def is_number(value: object) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How a token is chosen from logits; applied identically to target and draft.

    ``temperature == 0`` means greedy decoding (argmax); ``top_k == 0``, ``top_p == 1`` and ``min_p == 0``
    switch those filters off (``min_p``: a token less likely than ``min_p`` times the likeliest is never drawn;
    ``top_p == 0`` keeps the likeliest token alone, as the smallest set of mass at least 0).
    ``seed`` (an integer in [0, 2**64 - 1]) makes a sampled run reproducible: the same tokens whatever γ the
    policy chooses.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_k", "top_p", "seed", "min_p"):
            object.__setattr__(self, name, as_python(getattr(self, name)))
        if not (is_number(self.temperature) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise ConfigError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}", "temperature"
            )
        if not is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", "top_k")
        if not (is_number(self.top_p) and 0 <= self.top_p <= 1):
            raise ConfigError(f"top_p must be in [0, 1] (0 = the likeliest token only), got {self.top_p!r}", "top_p")
        if not (is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise ConfigError(f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}", "min_p")
        if self.seed is not None and not (is_int(self.seed) and 0 <= self.seed <= MAX_SEED):
            raise ConfigError(f"seed must be an integer in [0, 2**64 - 1], got {self.seed!r}", "seed")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def is_seeded(self) -> bool:
        """Seeded sampling: every token is the Gumbel-max choice under the noise of its position."""
        return not self.is_greedy and self.seed is not None

    @property
    def is_unseeded(self) -> bool:
        """Unseeded sampling: tokens drawn with fresh randomness, drafts judged against the draft's probabilities."""
        return not self.is_greedy and self.seed is None


def logits_to_scores(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits -> ``[..., V]`` scores a token is chosen by: sampling, the log-probabilities after
    temperature, min-p, top-k and top-p up to a constant per row (−inf: never drawn); greedy, the logits themselves
    (their argmax is the token). A seeded token is argmax(score + noise): Gumbel-max needs no softmax."""
    logits = logits.float()
    if params.is_greedy:
        return logits
    # Divide the gaps to the row's best logit, not the logits: the best stays 0 at any temperature and a
    # tiny one sends the others to -inf (probability 0), never to inf - inf. Below float32's smallest
    # normal number a temperature would round to 0 in the division; it acts as that number, as good as 0.
    temperature = max(params.temperature, torch.finfo(logits.dtype).tiny)
    logits = logits.sub(logits.amax(dim=-1, keepdim=True)).div_(temperature)  # [..., V], <= 0, a new tensor
    if params.min_p > 0:  # a token's probability over the likeliest's is exp(its logit here)
        logits = logits.masked_fill(logits < math.log(params.min_p), float("-inf"))
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1:
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [..., V] mass of strictly better tokens
        drop_sorted = mass_before >= params.top_p  # keeps the smallest prefix reaching top_p
        drop_sorted[..., 0] = False  # and the top token, even where top_p rounds to 0 in float32
        drop = drop_sorted.scatter(-1, sorted_index, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[..., V]`` logits -> ``[..., V]`` probabilities after temperature, min-p, top-k and top-p: the softmax of
    :func:`logits_to_scores`. Greedy (temperature 0) gives the one-hot distribution of the argmax."""
    if params.is_greedy:
        return torch.nn.functional.one_hot(argmax(logits.float()), logits.shape[-1]).float()
    return logits_to_scores(logits, params).softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row: ``[B, V]`` non-negative weights (a row's sum > 0, not necessarily 1) -> ``[B]``
    token ids, by inverting the row's cumulative sum (in float64) at one uniform number from ``generator``.

    A token of weight 0 is never drawn: the first entry whose cumulative sum exceeds the draw has a positive
    weight, and a draw that rounds up to the row's total (past every entry) takes the first entry reaching the
    total, also positive.
    """
    cumulative = probs.double().cumsum(dim=-1)  # [B, V]
    total = cumulative[:, -1:].contiguous()  # [B, 1] (searchsorted copies, and warns about, a strided one)
    uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)  # [B, 1]
    token_ids = torch.searchsorted(cumulative, uniform * total, right=True)  # [B, 1], V where past every entry
    first_at_total = torch.searchsorted(cumulative, total)  # [B, 1]
    return torch.minimum(token_ids, first_at_total).squeeze(-1)


def choose_tokens(
    scores: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None, position: int
) -> torch.Tensor:
    """One token per row of ``[B, V]`` scores (:func:`logits_to_scores`) for sequence position ``position`` ->
    ``[B]``: :func:`draw`'s tokens."""
    return draw(scores, sampling, generator, position)[0]


def draw(
    scores: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None, position: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens ``[B]`` from ``[B, V]`` scores for sequence position ``position``, and for unseeded sampling the
    distribution ``[B, V]`` they were drawn from (the q block verification reads; None otherwise).

    Greedy: the argmax. Seeded: the Gumbel-max choice under the position's noise (the same noise
    for the target and the drafter). Unseeded: a draw from the softmax with ``generator``.
    """
    if sampling.is_greedy:
        return argmax(scores), None
    if sampling.is_seeded:
        return gumbel_argmax(scores, seeded_gumbel(sampling.seed, position, scores.shape[-1])), None
    probs = scores.softmax(dim=-1)
    return sample(probs, generator), probs


def gumbel_argmax(scores: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(s + g) over the last dimension: with Gumbel(0, 1) noise g and scores s = log p + c (any constant c
    per row), an exact sample from p.

    scores: [..., V]; noise: [..., V] (broadcast, on any device: it moves to the scores') -> [...]. Tokens with
    s = −inf are never chosen.
    """
    return argmax(scores + noise.to(scores.device))


def argmax(values: torch.Tensor) -> torch.Tensor:
    """The index of the largest value along the last dimension, ``[..., V]`` -> ``[...]`` (int64), the first on ties.

    NumPy's on the CPU (much faster over a vocabulary-wide row than ``torch.argmax``); both return the first of
    equal maxima (and of NaNs), so the choice is the same. Other devices and dtypes NumPy lacks stay with torch.
    """
    array = numpy_view(values)
    if array is None:
        return values.argmax(dim=-1)
    return torch.from_numpy(np.asarray(np.argmax(array, axis=-1), dtype=np.int64))


def numpy_view(values: torch.Tensor) -> np.ndarray | None:
    """``values`` as a NumPy array sharing their memory where NumPy's passes can read them (float32 or float64 on the
    CPU, outside autograd); None where they stay with torch."""
    if values.device.type != "cpu" or values.dtype not in (torch.float32, torch.float64) or values.requires_grad:
        return None
    return values.numpy()


# just above ln(2^-126) ≈ -87.34, below which exp of a gap is a subnormal float32 (or 0): a slow path on the CPU
EXP_FLOOR = -87.0


def top_probability(logits: torch.Tensor) -> torch.Tensor:
    """The largest probability of each row's softmax, ``[..., V]`` logits -> ``[...]``: 1 / Σ exp(logit − max), half
    the work of a softmax (no division over the vocabulary, one array fewer).

    Gaps to the best logit are floored at :data:`EXP_FLOOR`: each such token adds under 2e-38 to a sum of at least 1,
    below float32's resolution even summed over any vocabulary, and the pass avoids subnormal exponentials (``−inf``
    of a focused draft's vocabulary included)."""
    logits = logits.float()
    gaps = logits.sub(logits.amax(dim=-1, keepdim=True)).clamp_(min=EXP_FLOOR)  # [..., V], a new tensor
    return 1.0 / gaps.exp_().sum(dim=-1)


def any_finite(values: torch.Tensor) -> torch.Tensor:
    """Whether each row of ``[..., V]`` has a finite value -> ``[...]`` bool (NumPy's pass on the CPU: torch's
    ``isfinite`` is much slower over a vocabulary-wide row)."""
    array = numpy_view(values)
    if array is None:
        return torch.isfinite(values).any(dim=-1)
    return torch.from_numpy(np.asarray(np.isfinite(array).any(axis=-1)))


def position_noise(seed: int, positions: range, vocab_size: int) -> torch.Tensor:
    """The token noise of consecutive sequence positions: ``[len(positions), V]``."""
    return torch.stack([seeded_gumbel(seed, position, vocab_size) for position in positions])


def add_position_noise_(scores: torch.Tensor, seed: int, first_position: int) -> torch.Tensor:
    """``scores [K, V]`` of the K consecutive positions from ``first_position``, plus each position's token noise, in
    place: the bits of ``scores + position_noise(seed, positions, V)`` without stacking the noise. Returns
    ``scores``."""
    for offset, row in enumerate(scores):  # [V] each
        row.add_(seeded_gumbel(seed, first_position + offset, scores.shape[-1]).to(scores.device))
    return scores


@functools.lru_cache(maxsize=NOISE_CACHE_POSITIONS)
def seeded_gumbel(seed: int, position: int, vocab_size: int, purpose: str = "token") -> torch.Tensor:
    """Gumbel(0, 1) noise ``[V]`` that depends on (seed, position, purpose) only. Shared: do not modify it.

    ``position`` is the absolute position in the sequence (prompt + new tokens) of the token the
    noise chooses; ``purpose`` keeps the streams of different uses apart. The three are hashed into
    a 128-bit seed (torch's CPU generator would keep 32 bits of it). The uniforms have 53 random
    bits, so the noise is resolved far into its upper tail, where unlikely tokens win (float32
    uniforms would cap it at 16.6: a token 4e-9 as likely as the best could never win). Rounded to
    float32 and kept finite, the noise lies in [−2.81, 44.4]: its law is Gumbel's to about 1e-7
    (the lower cut has probability 6e-8), so a seeded token is an exact sample to that precision.
    """
    key = hashlib.blake2b(f"{purpose}:{seed}:{position}".encode(), digest_size=16).digest()
    uniform = np.random.default_rng(int.from_bytes(key, "little")).random(vocab_size)  # [V] float64 in [0, 1)
    noise = torch.from_numpy(uniform).float().clamp_(min=2.0**-64, max=1.0 - 2.0**-24)  # keeps the noise finite
    # −log(−log1p(−u)) [V], in place (the same operations, so the same bits, without a temporary of the
    # vocabulary's width): small uniforms, fine in float32, give the large noise
    return noise.neg_().log1p_().neg_().log_().neg_()


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
