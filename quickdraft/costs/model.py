"""Measured costs of a step and what speculation is expected to gain from them.

A :class:`CostModel` holds what forwards take on this machine (the target over k new tokens, a
drafted token, a draft model's reading of n tokens); :func:`expected_tokens` is the expected number
of tokens a step commits for a given acceptance (Leviathan et al. 2023, with first and later drafts
apart). The goodput policy and the early-exit drafter plan with both; ``calibration`` measures them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from quickdraft.errors import ConfigError


def interpolate(curve: Mapping[int, float], num_tokens: int) -> float:
    """A measured cost at ``num_tokens``, else linear between the nearest measured points
    (the first segment's slope below them, the last one's past them; one point: proportional)."""
    if num_tokens in curve:
        return float(curve[num_tokens])
    ks = sorted(curve)
    if len(ks) == 1:
        return float(curve[ks[0]]) * num_tokens / ks[0]
    below = max((k for k in ks[:-1] if k < num_tokens), default=ks[0])
    above = ks[ks.index(below) + 1]
    slope = (curve[above] - curve[below]) / (above - below)
    return float(curve[below] + slope * (num_tokens - below))


def monotone_fit(curve: Mapping[int, float]) -> dict[int, float]:
    """The closest non-decreasing curve (least squares; pool-adjacent-violators): a forward over
    more tokens does the same work and more, so a measured dip (t(5) < t(4)) is noise, and a
    policy trading on it would favour the dip's γ for no reason. Runs that fall are replaced by
    their mean; every other point is kept as measured."""
    pools: list[tuple[float, int]] = []  # (mean, points pooled), in order of k
    for k in sorted(curve):
        mean, count = float(curve[k]), 1
        while pools and pools[-1][0] > mean:
            pooled_mean, pooled_count = pools.pop()
            mean, count = (pooled_mean * pooled_count + mean * count) / (pooled_count + count), pooled_count + count
        pools.append((mean, count))
    values = [mean for mean, count in pools for _ in range(count)]
    return dict(zip(sorted(curve), values, strict=True))


def fitted_value(fitted: Mapping[int, float], num_tokens: int) -> float:
    """A monotone-fitted curve at ``num_tokens``, interpolated between the measured points; past the last one
    it rises at the curve's mean slope (a pooled end is flat, and more tokens are not free)."""
    first, last = min(fitted), max(fitted)
    if num_tokens <= last or first == last:
        return interpolate(fitted, num_tokens)
    mean_slope = (fitted[last] - fitted[first]) / (last - first)
    return float(fitted[last] + mean_slope * (num_tokens - last))


@dataclass(frozen=True)
class CostModel:
    """Measured costs in milliseconds: a target forward over k new tokens, one drafted token, and
    the drafter reading n tokens before it can draft (a draft model's prefill; empty: free).

    The target curve is used through its :func:`monotone_fit`, so noise in the measurement cannot make
    a longer block look cheaper than a shorter one. A profile times bare forwards at one context
    length, and the machine's speed drifts; :meth:`with_measurements` corrects the model with what
    the engine's own steps took (:class:`StepTimeRecord`).

    The curves hold at ``context_tokens`` cached tokens. Attention reads every cached position for each new
    token's row, so a forward grows linearly with the context: ``target_context_ms`` is what one more cached
    token adds to a forward over k new tokens (measured at two context lengths; used through its monotone fit,
    linear between the measured k), ``draft_context_ms`` the same for a drafted token, and :meth:`at_context` is
    the model at another length. Without them (empty, 0) the costs are taken as the same at every length.
    """

    target_ms: Mapping[int, float]  # as measured, at ``context_tokens``
    draft_ms: float = 0.0
    draft_prefill_ms: Mapping[int, float] = field(default_factory=dict)  # n tokens read -> ms
    context_tokens: int = 0  # the cached tokens the curves were measured after
    target_context_ms: Mapping[int, float] = field(default_factory=dict)  # k -> ms per further cached token
    draft_context_ms: float = 0.0  # ms a drafted token takes per further cached token
    fitted_target_ms: Mapping[int, float] = field(init=False, repr=False, compare=False)
    fitted_context_ms: Mapping[int, float] = field(init=False, repr=False, compare=False)
    target_memo: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        times = [*self.target_ms.values(), self.draft_ms, *self.draft_prefill_ms.values()]
        if not all(math.isfinite(ms) for ms in times):  # NaN passes every comparison below
            raise ConfigError(f"a cost model needs finite times, got {self.to_dict()}")
        if 1 not in self.target_ms or any(k < 1 or ms <= 0 for k, ms in self.target_ms.items()):
            raise ConfigError("a cost model needs positive target times including k = 1")
        if self.draft_ms < 0:
            raise ConfigError(f"the draft cost must be >= 0 ms, got {self.draft_ms}")
        if any(n < 1 or ms < 0 for n, ms in self.draft_prefill_ms.items()):
            raise ConfigError("a draft prefill curve needs n >= 1 tokens and times >= 0 ms")
        slopes = [*self.target_context_ms.values(), self.draft_context_ms]
        if (
            self.context_tokens < 0
            or any(k < 1 for k in self.target_context_ms)
            or not all(math.isfinite(ms) and ms >= 0 for ms in slopes)
        ):
            raise ConfigError("context costs need a context >= 0, k >= 1 and finite times >= 0 ms per token")
        object.__setattr__(self, "fitted_target_ms", monotone_fit(self.target_ms))
        object.__setattr__(self, "fitted_context_ms", monotone_fit(self.target_context_ms))  # more rows cost more

    def to_dict(self) -> dict[str, Any]:
        """The measured costs as JSON-ready data (curve keys become strings)."""
        return {
            "target_ms": {str(k): ms for k, ms in sorted(self.target_ms.items())},
            "draft_ms": self.draft_ms,
            "draft_prefill_ms": {str(n): ms for n, ms in sorted(self.draft_prefill_ms.items())},
            "context_tokens": self.context_tokens,
            "target_context_ms": {str(k): ms for k, ms in sorted(self.target_context_ms.items())},
            "draft_context_ms": self.draft_context_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """The inverse of :meth:`to_dict` (data without context costs, as saved before them, has none); malformed
        data raises ``ConfigError``."""
        try:
            return cls(
                {int(k): float(ms) for k, ms in data["target_ms"].items()},
                float(data["draft_ms"]),
                {int(n): float(ms) for n, ms in data["draft_prefill_ms"].items()},
                int(data.get("context_tokens", 0)),
                {int(k): float(ms) for k, ms in data.get("target_context_ms", {}).items()},
                float(data.get("draft_context_ms", 0.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a saved cost model: {error!r}") from None

    def target(self, num_tokens: int) -> float:
        """t_target(k) on the fitted curve (:func:`fitted_value`), remembered: a policy asks for the same few k at
        every step of every request."""
        if (ms := self.target_memo.get(num_tokens)) is None:
            ms = self.target_memo[num_tokens] = fitted_value(self.fitted_target_ms, num_tokens)
        return ms

    def draft_read(self, num_tokens: int) -> float:
        """What reading ``num_tokens`` costs the drafter before it drafts (0 without a prefill curve)."""
        if num_tokens <= 0 or not self.draft_prefill_ms:
            return 0.0
        return interpolate({0: 0.0, **self.draft_prefill_ms}, num_tokens)

    def with_measurements(self, plain_step_ms: float | None, draft_token_ms: float | None) -> CostModel:
        """This model corrected by what real steps took (None: not measured yet).

        ``plain_step_ms`` shifts the whole target curve so that t(1) is a measured plain step: a step
        spends the same time beyond its forward (committing and detokenizing, verifying, attending to
        the request's own context) whatever its size, while the profile's curve keeps saying what each
        further token adds. ``draft_token_ms`` replaces the draft's per-token cost.
        """
        if plain_step_ms is None and draft_token_ms is None:
            return self
        shift = 0.0 if plain_step_ms is None else plain_step_ms - self.target(1)
        return replace(
            self,
            target_ms={k: ms + shift for k, ms in self.fitted_target_ms.items()},
            draft_ms=self.draft_ms if draft_token_ms is None else draft_token_ms,
        )

    def context_ms(self, num_tokens: int, context_tokens: int) -> float:
        """What ``context_tokens`` cached tokens add to a target forward over ``num_tokens`` new tokens beyond the
        measured context (0 at or below it, and without context costs)."""
        extra_tokens = context_tokens - self.context_tokens
        if extra_tokens <= 0 or not self.fitted_context_ms:
            return 0.0
        return extra_tokens * max(0.0, interpolate(self.fitted_context_ms, num_tokens))

    def draft_context_extra_ms(self, context_tokens: int) -> float:
        """What ``context_tokens`` cached tokens add to a drafted token beyond the measured context."""
        return max(0, context_tokens - self.context_tokens) * self.draft_context_ms

    def at_context(self, context_tokens: int) -> CostModel:
        """The costs after ``context_tokens`` cached tokens (this model where that is not past its own context)."""
        if context_tokens <= self.context_tokens or not (self.target_context_ms or self.draft_context_ms):
            return self
        return replace(
            self,
            target_ms={k: ms + self.context_ms(k, context_tokens) for k, ms in self.fitted_target_ms.items()},
            draft_ms=self.draft_ms + self.draft_context_extra_ms(context_tokens),
            context_tokens=context_tokens,
        )

    def draft(self, num_rows: int) -> float:
        """The drafting of ``num_rows`` tokens, one a row (a request alone drafts one row a position)."""
        return num_rows * self.draft_ms

    def step_ms(self, num_draft_tokens: int) -> float:
        """Time of one step: γ drafted tokens plus a target forward over γ + 1 tokens."""
        return num_draft_tokens * self.draft_ms + self.target(num_draft_tokens + 1)

    def goodput(self, acceptance_rate: float, num_draft_tokens: int, continuation_rate: float | None = None) -> float:
        """Expected committed tokens per millisecond (Leviathan et al. with this cost curve;
        ``continuation_rate``: see :func:`expected_tokens`)."""
        return expected_tokens(acceptance_rate, num_draft_tokens, continuation_rate) / self.step_ms(num_draft_tokens)

    def saving_ms(
        self, acceptance_rate: float, num_draft_tokens: int, num_tokens: float, continuation_rate: float | None = None
    ) -> float:
        """Expected time saved over ``num_tokens`` new tokens by drafting γ per step instead of plain steps."""
        tokens_per_step = expected_tokens(acceptance_rate, num_draft_tokens, continuation_rate)
        return num_tokens * (self.step_ms(0) - self.step_ms(num_draft_tokens) / tokens_per_step)


def expected_tokens(acceptance_rate: float, num_draft_tokens: int, continuation_rate: float | None = None) -> float:
    """E[tokens per step] when a block's first draft is accepted with probability α and each later draft,
    given that every draft before it was, with probability β (``continuation_rate``):
    1 + α · (1 − β^γ) / (1 − β). With β = α (None: Leviathan et al.'s independent drafts) this is
    (1 − α^(γ+1)) / (1 − α)."""
    alpha, beta, gamma = acceptance_rate, continuation_rate, num_draft_tokens
    if beta is None:
        beta = alpha
    later_drafts = float(gamma) if beta >= 1.0 else (1.0 - beta**gamma) / (1.0 - beta)
    return 1.0 if gamma == 0 else 1.0 + alpha * later_drafts


@dataclass(frozen=True)
class BatchCostModel:
    """Measured costs of one continuous-batching step, in milliseconds: the target's forward as a function of the
    tokens of every request in it together, and one draft-model forward as a function of its rows (requests, one
    token each; empty: no draft model). Used through their monotone fits, like :class:`CostModel`'s curve."""

    target_ms: Mapping[int, float]  # total new tokens in the step -> ms
    draft_ms: Mapping[int, float] = field(default_factory=dict)  # rows of one draft forward -> ms
    fitted_target_ms: Mapping[int, float] = field(init=False, repr=False, compare=False)
    fitted_draft_ms: Mapping[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        curves = {"target": self.target_ms, "draft": self.draft_ms}
        if not self.target_ms or any(
            n < 1 or not (math.isfinite(ms) and ms > 0) for curve in curves.values() for n, ms in curve.items()
        ):
            raise ConfigError(f"a batch cost model needs positive finite times at n >= 1, got {self.to_dict()}")
        object.__setattr__(self, "fitted_target_ms", monotone_fit(self.target_ms))
        object.__setattr__(self, "fitted_draft_ms", monotone_fit(self.draft_ms) if self.draft_ms else {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_ms": {str(n): ms for n, ms in sorted(self.target_ms.items())},
            "draft_ms": {str(n): ms for n, ms in sorted(self.draft_ms.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchCostModel:
        """The inverse of :meth:`to_dict`; malformed data raises ``ConfigError``."""
        try:
            return cls(
                {int(n): float(ms) for n, ms in data["target_ms"].items()},
                {int(n): float(ms) for n, ms in data["draft_ms"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a saved batch cost model: {error!r}") from None

    def target(self, num_tokens: int) -> float:
        """The target's forward over ``num_tokens`` new tokens of all the step's requests (0 tokens: 0 ms)."""
        return 0.0 if num_tokens <= 0 else fitted_value(self.fitted_target_ms, num_tokens)

    def draft(self, num_rows: int) -> float:
        """One draft-model forward over ``num_rows`` requests (0 rows, or no draft model: 0 ms)."""
        if num_rows <= 0 or not self.fitted_draft_ms:
            return 0.0
        return fitted_value(self.fitted_draft_ms, num_rows)
