"""Calibration: measure what forwards cost on this machine and turn it into a :class:`CostModel`.

The goodput policy needs these costs at run time; ``quickdraft profile`` and the bench print and
record the same curves. A curve maps k new tokens to the milliseconds of one forward over them after
a fixed context: each k is timed several times after untimed warm-up runs, rolling the cache back to
the context in between, and the fastest run is kept (other work on the machine only adds time).
A measurement says whether the machine's load held steady while it was taken (:func:`steadiness_problem`):
:mod:`quickdraft.costs.store` saves only steady ones, since a saved calibration is used by every later
run, and one timed while other work came or went would mislead them all.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

import torch

from quickdraft.costs.model import BatchCostModel, CostModel
from quickdraft.drafters import Drafter
from quickdraft.errors import ConfigError
from quickdraft.progress import progress_bar
from quickdraft.runtime.base import BatchRow, Runtime

PREFILL_LENGTHS = (128, 512, 1024)  # prompt lengths at which a draft model's reading is timed
LONG_CONTEXT = 4096  # cached tokens at which what the context adds to a forward is timed (placeholders, not read)
# Blocks of k new tokens whose context cost is timed (and the longest, max + 1): the native runtime attends to the
# cache in runs of 16 rows, so a block of 17 costs a second reading, and a line from 1 to 17 would overprice the rest.
CONTEXT_KS = (1, 8)
COST_CONTEXT = 64  # cached tokens after which goodput's step costs are timed
STEADY_TOLERANCE = 0.3  # how far the target's 1-token forward timed again may differ from the curve's (a fraction)
Costs = TypeVar("Costs", CostModel, BatchCostModel)


class CurveRole(StrEnum):
    """What a measured cost curve times (its name in the bench's JSON results)."""

    TARGET = "target"  # the target's forward over k new tokens
    DRAFT = "draft"  # the draft model's forward over k new tokens
    DRAFT_PREFILL = "draft_prefill"  # the draft model reading n tokens into an empty cache
    TARGET_CONTEXT = "target_context"  # what one more cached token adds to the target's forward over k new tokens
    DRAFT_CONTEXT = "draft_context"  # the same for the draft model's


def prefill_lengths(runtime: Runtime, lengths: Iterable[int] = PREFILL_LENGTHS) -> list[int]:
    """``lengths`` capped at what the runtime's context holds."""
    return sorted({min(n, runtime.max_context) for n in lengths})


def measure_cost_curve(
    runtime: Runtime,
    ks: Iterable[int],
    context: int,
    repeats: int = 3,
    warmup: int = 1,
    progress: bool = False,
    placeholder: bool = False,
    label: str = "model",
) -> dict[int, float]:
    """Milliseconds of a forward over k new tokens with ``context`` tokens cached (fastest of ``repeats``; the
    context read from a random prompt, or ``placeholder`` positions: see :func:`measure_cost_curves`)."""
    return measure_cost_curves({label: runtime}, {label: ks}, context, repeats, warmup, progress, placeholder)[label]


def one_token_ms(target: Runtime, context: int) -> float:
    """The target's 1-token forward after ``context`` cached tokens (fastest of 3 after a warm-up): what
    :func:`steadiness_problem` and :func:`busier_problem` compare."""
    return measure_cost_curve(target, [1], context, repeats=3, warmup=1)[1]


def measure_cost_curves(
    runtimes: Mapping[str, Runtime],
    ks: Mapping[str, Iterable[int]],
    context: int,
    repeats: int = 3,
    warmup: int = 1,
    progress: bool = False,
    placeholder: bool = False,
) -> dict[str, dict[int, float]]:
    """Per runtime (e.g. target and draft), milliseconds of a forward over k new tokens after ``context``
    cached tokens: the fastest of ``repeats`` timed runs after ``warmup`` untimed ones. The context is a random
    prompt read, or with ``placeholder`` positions written directly (:meth:`Runtime.fill_placeholder`: as fast
    to attend to, and long contexts take no time to fill).

    The runtimes and k take turns within every repeat, and the fastest run is kept: on a shared machine
    other work only ever adds time, and a slow spell then slows one repeat of every curve instead of one
    whole curve. What policies trade on is the ratio between the curves (a draft token against a
    target step), which curves measured one after the other got wrong by a fifth (``docs/policies.md``).
    """
    wanted = {role: sorted(set(ks[role])) for role in runtimes}
    if context < 1 or any(not k or k[0] < 1 for k in wanted.values()) or repeats < 1 or warmup < 0:
        raise ConfigError("profile needs context >= 1, k >= 1, repeats >= 1 and warmup >= 0")
    for role, runtime in runtimes.items():
        if context + wanted[role][-1] > runtime.max_context:
            raise ConfigError(
                f"context {context} + {wanted[role][-1]} new tokens exceeds the model's {runtime.max_context} positions"
            )
    generator = torch.Generator().manual_seed(0)
    caches = {}
    for role, runtime in runtimes.items():
        caches[role] = runtime.new_cache(1)
        if placeholder:
            runtime.fill_placeholder(caches[role], context)
        else:
            prompt = torch.randint(0, runtime.vocab_size, (1, context), generator=generator)  # [1, context]
            runtime.forward(prompt, caches[role], last_only=True)
    token_ids = {  # [1, k] per role and k
        role: {k: torch.randint(0, runtimes[role].vocab_size, (1, k), generator=generator) for k in wanted[role]}
        for role in runtimes
    }
    times: dict[str, dict[int, list[float]]] = {role: {k: [] for k in wanted[role]} for role in runtimes}
    steps = [(role, k) for k in sorted(set().union(*wanted.values())) for role in runtimes if k in wanted[role]]
    label = "timing the " + " and ".join(runtimes)
    with progress_bar(total=(warmup + repeats) * len(steps), desc=label, disable=not progress) as bar:
        for repeat in range(warmup + repeats):
            for role, k in steps:
                runtimes[role].synchronize()  # a GPU's queued work is timed with the forward that queued it
                started = time.perf_counter()
                runtimes[role].forward(token_ids[role][k], caches[role])
                runtimes[role].synchronize()
                elapsed = time.perf_counter() - started
                caches[role].truncate(context)
                if repeat >= warmup:
                    times[role][k].append(elapsed)
                bar.update()
    return {role: {k: 1000 * min(samples) for k, samples in curve.items()} for role, curve in times.items()}


def context_lengths(runtime: Runtime, context: int, max_new_tokens: int) -> tuple[int, int] | None:
    """Two context lengths between which what a longer context costs is timed: ``context`` and up to
    ``LONG_CONTEXT`` (None when the model's context leaves too little room beyond ``context`` to tell)."""
    long_context = min(LONG_CONTEXT, runtime.max_context - max_new_tokens)
    return (context, long_context) if long_context >= 4 * context else None


def context_ks(longest: int) -> list[int]:
    """The blocks of k new tokens whose context cost is timed, up to the ``longest`` a step verifies."""
    return sorted({k for k in CONTEXT_KS if k < longest} | {longest})


def measure_context_costs(
    runtimes: Mapping[str, Runtime], ks: Mapping[str, Iterable[int]], contexts: tuple[int, int], repeats: int = 3
) -> dict[str, dict[int, float]]:
    """Per runtime (by :class:`CurveRole`: the target's and the draft model's), milliseconds that one more cached
    token adds to a forward over k new tokens: its forwards timed after the two ``contexts`` (placeholder
    positions), differenced. Attention reads every cached position for each new token, so within the model's
    context the cost grows about linearly with it (``docs/benchmarks.md``, long contexts)."""
    short, long = (measure_cost_curves(runtimes, ks, n, repeats, placeholder=True) for n in contexts)
    slope_role = {CurveRole.TARGET: CurveRole.TARGET_CONTEXT, CurveRole.DRAFT: CurveRole.DRAFT_CONTEXT}
    return {
        slope_role[CurveRole(role)]: {
            k: max(0.0, (long[role][k] - short[role][k]) / (contexts[1] - contexts[0])) for k in long[role]
        }
        for role in runtimes
    }


def context_costs(runtimes: Mapping[str, Runtime], context: int, longest: int) -> dict[str, dict[int, float]]:
    """:func:`measure_context_costs` of the target's blocks of :func:`context_ks` up to ``longest`` new tokens and
    the draft model's 1-token forward (``runtimes`` by :class:`CurveRole`), from ``context`` to the longest context
    every model has room for; none when one has too little."""
    wanted = {role: context_ks(longest) if role == CurveRole.TARGET else [1] for role in runtimes}
    contexts = [context_lengths(runtime, context, max(wanted[role])) for role, runtime in runtimes.items()]
    if any(lengths is None for lengths in contexts):
        return {}
    return measure_context_costs(runtimes, wanted, min(contexts))  # type: ignore[type-var]


def measure_prefill_curve(
    runtime: Runtime, lengths: Iterable[int], repeats: int = 1, warmup: int = 1
) -> dict[int, float]:
    """Milliseconds of reading n tokens into an empty cache (last position's logits only; fastest of
    ``repeats``): what a drafter pays to catch up on a prompt before its first draft."""
    lengths = sorted(set(lengths))
    if not lengths or lengths[0] < 1 or lengths[-1] > runtime.max_context or repeats < 1 or warmup < 0:
        raise ConfigError(f"a prefill curve needs 1 <= n <= {runtime.max_context}, repeats >= 1 and warmup >= 0")
    generator = torch.Generator().manual_seed(0)
    curve: dict[int, float] = {}
    for n in lengths:
        token_ids = torch.randint(0, runtime.vocab_size, (1, n), generator=generator)  # [1, n]
        times = []
        for _ in range(warmup + repeats):
            cache = runtime.new_cache(1)
            runtime.synchronize()
            started = time.perf_counter()
            runtime.forward(token_ids, cache, last_only=True)
            runtime.synchronize()
            times.append(time.perf_counter() - started)
        curve[n] = 1000 * min(times[warmup:])
    return curve


def curve_to_json(curve: dict[int, float]) -> dict[str, float]:
    return {str(k): round(ms, 3) for k, ms in sorted(curve.items())}


def curve_from_json(data: dict[str, float]) -> dict[int, float]:
    return {int(k): float(ms) for k, ms in data.items()}


def draft_token_ms(
    curves: Mapping[str, Mapping[int, float]], uses_draft_model: bool, target_cost_fraction: float | None
) -> float | None:
    """What one drafted token costs by the measured ``curves`` (by :class:`CurveRole`): a share of the target's
    1-token forward for self-speculation, the draft model's 1-token forward, or 0 for drafters without a
    model; None when the curve it needs was not measured."""
    if target_cost_fraction is not None:
        target_ms = curves.get(CurveRole.TARGET, {}).get(1)
        return None if target_ms is None else target_cost_fraction * target_ms
    if uses_draft_model:
        return curves.get(CurveRole.DRAFT, {}).get(1)
    return 0.0


def cost_model_from_curves(
    curves: Mapping[str, Mapping[int, float]], drafter_cls: type[Drafter], context: int = 0
) -> CostModel:
    """The cost model of ``drafter_cls``'s steps from curves (by :class:`CurveRole`) measured after ``context``
    cached tokens; what a longer context adds, if the context curves were measured."""
    draft_ms = draft_token_ms(curves, drafter_cls.needs_draft_model, drafter_cls.target_cost_fraction)
    if draft_ms is None or CurveRole.TARGET not in curves:
        raise ConfigError("the cost curves this drafter needs were not measured")
    prefill_ms = curves.get(CurveRole.DRAFT_PREFILL, {}) if drafter_cls.needs_draft_model else {}
    target_context = dict(curves.get(CurveRole.TARGET_CONTEXT, {}))
    context_curves = {CurveRole.TARGET: target_context, CurveRole.DRAFT: curves.get(CurveRole.DRAFT_CONTEXT, {})}
    draft_context = draft_token_ms(context_curves, drafter_cls.needs_draft_model, drafter_cls.target_cost_fraction)
    return CostModel(
        dict(curves[CurveRole.TARGET]), draft_ms, dict(prefill_ms), context, target_context, draft_context or 0.0
    )


@dataclass(frozen=True)
class Measurement(Generic[Costs]):
    """Measured costs, and why they are not to be saved (None: they may be)."""

    costs: Costs
    unsteady: str | None = None  # the machine's load changed while measuring (:func:`steadiness_problem`)


def most_measured_drafts(max_context: int, context: int = COST_CONTEXT) -> int:
    """The largest max_draft_tokens whose costs a target of ``max_context`` positions can be timed at (a step of
    max + 1 tokens after ``context`` cached ones)."""
    return max_context - context - 1


def measure_cost_model(
    target: Runtime,
    draft: Runtime | None,
    drafter_cls: type[Drafter],
    max_draft_tokens: int,
    context: int = COST_CONTEXT,
) -> Measurement[CostModel]:
    """Measure the step costs the goodput policy needs (a few forwards of each model).

    Target: one timed forward of k ∈ {1, 2, 4, 8, …, max + 1} new tokens after ``context`` cached tokens
    (the fastest of 3, after a warm-up); the draft model's 1-token forward and what reading 128 and 512
    tokens costs it if the drafter uses one; the drafter's share of a target step if the target drafts
    itself; else 0. What a longer context adds to the target's forward of 1, 8 and max + 1 tokens and to the
    draft model's of 1 (:func:`measure_context_costs`, up to ``LONG_CONTEXT``, with placeholder keys and
    values). Last, the target's 1-token forward is timed again, to tell whether the machine's load held steady
    throughout (:func:`steadiness_problem`).
    """
    ks = sorted({k for k in (1, 2, 4, 8, 16) if k <= max_draft_tokens} | {max_draft_tokens + 1})
    runtimes, wanted = {CurveRole.TARGET: target}, {CurveRole.TARGET: ks}
    if drafter_cls.needs_draft_model and draft is not None:
        runtimes[CurveRole.DRAFT], wanted[CurveRole.DRAFT] = draft, [1]
    for role, runtime in runtimes.items():
        if context + wanted[role][-1] > runtime.max_context:
            most = most_measured_drafts(runtime.max_context, context)
            too_many = role is CurveRole.TARGET and most >= 1  # fewer drafts would fit
            fix = f"lower max_draft_tokens to at most {most}, or " if too_many else ""
            raise ConfigError(
                f"goodput measures its costs after {context} cached tokens and {wanted[role][-1]} more, but the "
                f"{role.value} model holds {runtime.max_context} positions: {fix}give a fixed number of drafts "
                "(fixed:K)",
                "max_draft_tokens" if too_many else "policy",
            )
    curves: dict[str, dict[int, float]] = measure_cost_curves(runtimes, wanted, context, repeats=3, warmup=1)
    if draft is not None and CurveRole.DRAFT in curves:
        curves[CurveRole.DRAFT_PREFILL] = measure_prefill_curve(draft, prefill_lengths(draft, PREFILL_LENGTHS[:2]))
    curves |= context_costs(runtimes, context, ks[-1])
    again_ms = one_token_ms(target, context)
    unsteady = steadiness_problem(curves[CurveRole.TARGET][1], again_ms)
    return Measurement(cost_model_from_curves(curves, drafter_cls, context), unsteady)


def doublings(limit: int) -> list[int]:
    """1, 2, 4, … up to ``limit``, and ``limit`` itself."""
    return sorted({2**i for i in range(limit.bit_length()) if 2**i <= limit} | {limit})


def measure_batch_cost_model(
    target: Runtime,
    draft: Runtime | None,
    max_rows: int,
    max_tokens: int,
    context: int = 8,
    repeats: int = 3,
    warmup: int = 1,
) -> BatchCostModel:
    """Measure what a continuous-batching step costs (the fastest of ``repeats`` after ``warmup``, taking turns):
    the target's batched forward over n = 1, 2, 4, … ``max_tokens`` tokens in all, spread over up to ``max_rows``
    requests of ``context`` cached tokens each, and the draft model's over 1, 2, 4, … ``max_rows`` requests of
    one token each. What a forward costs depends on its tokens far more than on how they are split between
    requests (every GEMM has a row per token; attention over short contexts is a small part), so requests are
    given few cached tokens: filling 128 contexts of hundreds of tokens would take minutes."""
    if max_rows < 1 or max_tokens < 1 or context < 1 or repeats < 1 or warmup < 0:
        raise ConfigError("a batch calibration needs max_rows, max_tokens, context and repeats >= 1")
    generator = torch.Generator().manual_seed(0)
    runtimes = {CurveRole.TARGET: target} | ({} if draft is None else {CurveRole.DRAFT: draft})
    caches = {role: [runtime.new_cache(1) for _ in range(max_rows)] for role, runtime in runtimes.items()}
    for role, runtime in runtimes.items():
        prompt = torch.randint(0, runtime.vocab_size, (context,), generator=generator).tolist()
        runtime.forward_batch([BatchRow(cache, prompt, last_only=True) for cache in caches[role]])
    plans = {(CurveRole.TARGET, n): spread(n, max_rows) for n in doublings(max_tokens)}
    plans |= {(CurveRole.DRAFT, rows): [1] * rows for rows in doublings(max_rows) if draft is not None}
    times: dict[tuple[CurveRole, int], list[float]] = {key: [] for key in plans}
    for repeat in range(warmup + repeats):
        for (role, n), sizes in plans.items():
            rows = [
                BatchRow(cache, torch.randint(0, runtimes[role].vocab_size, (size,), generator=generator).tolist())
                for cache, size in zip(caches[role], sizes, strict=False)
            ]
            runtimes[role].synchronize()
            started = time.perf_counter()
            runtimes[role].forward_batch(rows)
            runtimes[role].synchronize()
            elapsed = time.perf_counter() - started
            for row in rows:
                row.cache.truncate(context)
            if repeat >= warmup:
                times[(role, n)].append(elapsed)
    curves: dict[CurveRole, dict[int, float]] = {CurveRole.TARGET: {}, CurveRole.DRAFT: {}}
    for (role, n), samples in times.items():
        curves[role][n] = 1000 * min(samples)
    return BatchCostModel(curves[CurveRole.TARGET], curves[CurveRole.DRAFT])


def spread(num_tokens: int, max_rows: int) -> list[int]:
    """``num_tokens`` new tokens over as many requests as there are (up to ``max_rows``), as evenly as can be."""
    rows = min(num_tokens, max_rows)
    return [num_tokens // rows + (1 if row < num_tokens % rows else 0) for row in range(rows)]


def steadiness_problem(first_ms: float, again_ms: float) -> str | None:
    """Why a calibration is not to be saved when the target's 1-token forward took ``first_ms`` in the curves
    and ``again_ms`` timed again after them (each the fastest of its repeats), or None if they agree within
    ``STEADY_TOLERANCE``. The fastest of several runs is what the machine gives when nothing else runs, so
    the two differ when other work came or went while measuring (another run calibrating or generating):
    both may be off, and a saved calibration misleads every later run."""
    if abs(again_ms - first_ms) <= STEADY_TOLERANCE * first_ms:
        return None
    return (
        f"the target's 1-token forward took {first_ms:.1f} ms, then {again_ms:.1f} ms: "
        "the machine's load changed while measuring"
    )


def busier_problem(saved_ms: float, now_ms: float) -> str | None:
    """Why a saved calibration is to be measured again when its target's 1-token forward took ``saved_ms`` and takes
    ``now_ms`` now (each the fastest of its repeats), or None. Fastest runs only slow down while other work runs,
    so a saved forward slower than now's by more than ``STEADY_TOLERANCE`` was timed on busier cores, and its
    costs would make every later run draft too little or too much. A forward slower now than saved is this run's
    load: the saved costs stand, and the engine's own step times correct them as it runs."""
    if saved_ms - now_ms <= STEADY_TOLERANCE * now_ms:
        return None
    return f"was timed on busier cores (the target's 1-token forward took {saved_ms:.1f} ms then, {now_ms:.1f} ms now)"
