"""Benchmark records and their aggregation, computed as Spec-Bench does (pure functions).

Per question, tokens/s = new tokens of all its turns ÷ wall time of all its turns (prefill
included). A method's speedup over a group of questions = mean per-question tokens/s of the
method ÷ that of the baseline, per run on the questions both finished, then averaged over
runs. The same after the prompt (``decode_speedup``): each turn's tokens after its first ÷ the
time after it, where long prompts' reading would hide what decoding gained. τ (mean accepted
tokens) is the mean over every target step of the tokens it appended. The share of questions
(of every run) whose tokens equal the baseline's in the same run is the lossless fraction of our
methods and the agreement of peers (other implementations, whose arithmetic differs from ours).
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from quickdraft.costs.calibration import CurveRole, draft_token_ms

BOOTSTRAP_RESAMPLES = 2000
# Student's t at 0.975 for 1 .. 30 degrees of freedom (beyond: the normal's 1.96 plus its first correction)
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

METRIC_KEYS = (
    "speedup",
    "speedup_ci95",
    "speedup_per_run",
    "tokens_per_s",
    "mean_accepted_tokens",
    "acceptance_rate",
    "lossless_fraction",
    "agreement",
    "efficiency",
    "n_questions",
    "latency_p50_ms",
    "latency_p90_ms",
    "decode_speedup",
    "decode_tokens_per_s",
    "prefill_s",
)


@dataclass(frozen=True)
class Entry:
    """One method on one question (all its turns) in one run."""

    method: str
    question_id: str
    category: str
    run: int
    new_tokens: int
    wall_time_s: float
    token_ids: list[int]  # all turns' new tokens, concatenated
    step_sizes: list[int]  # tokens appended per target step, all turns
    token_latencies_s: list[float]  # per new token: its step's time since the previous step ÷ the step's tokens
    draft_tokens_proposed: int | None = None
    draft_tokens_accepted: int | None = None
    answers: list[str] = field(default_factory=list)  # decoded text per turn
    gammas: list[int] = field(default_factory=list)  # γ chosen per verify step (our speculative methods)
    revision: str | None = None  # the quickdraft commit that measured it (:func:`source_revision`); None: unknown
    prefill_s: float | None = None  # seconds to each turn's first token, summed (reading the prompts); None: not kept
    session: str | None = None  # the bench process that measured it (a resume is another); None: not recorded

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.method, self.question_id, self.run)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The answers' tokens after each turn's first ÷ the time after it: the speed with the prompts' reading
        apart (None: not recorded, or no such tokens)."""
        tokens, seconds = self.new_tokens - len(self.answers), self.wall_time_s - (self.prefill_s or 0.0)
        return tokens / seconds if self.prefill_s is not None and tokens > 0 and seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Entry:
        return cls(**row)


def mixed_sessions(entries: list[Entry], baselines: Mapping[str, str]) -> dict[str, list[int]]:
    """Per method, the runs whose entries and its baseline's (``baselines``: method -> its baseline) were measured
    in more than one bench session: a resume re-measured part of them, so their ratio compares sessions."""
    sessions: dict[tuple[str, int], set[str]] = {}
    for entry in entries:
        if entry.session is not None:
            sessions.setdefault((entry.method, entry.run), set()).add(entry.session)
    mixed: dict[str, list[int]] = {}
    for (method, run), own in sorted(sessions.items()):
        baseline = baselines.get(method)
        if baseline is not None and baseline != method and len(own | sessions.get((baseline, run), set())) > 1:
            mixed.setdefault(method, []).append(run)
    return mixed


def token_latencies(step_times_s: list[float], step_sizes: list[int]) -> list[float]:
    """Spread each step's time since the previous one (the first: since the call began) over its tokens."""
    latencies: list[float] = []
    previous = 0.0
    for seconds, count in zip(step_times_s, step_sizes, strict=True):
        if count:
            latencies += [(seconds - previous) / count] * count
        previous = seconds
    return latencies


def predicted_speedup(
    acceptance_rate: float, num_draft_tokens: int, draft_ms: float, target_ms: Mapping[int, float]
) -> float | None:
    """Leviathan et al.'s expected speedup with a measured cost curve.

    E[tokens/step] = (1 − α^(γ+1)) / (1 − α); time/step = γ·t_draft + t_target(γ+1);
    speedup = E[tokens/step] · t_target(1) / time/step. None if the curve lacks γ+1.
    """
    gamma = num_draft_tokens
    if 1 not in target_ms or gamma + 1 not in target_ms:
        return None
    alpha = acceptance_rate
    expected_tokens = gamma + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
    return expected_tokens * target_ms[1] / (gamma * draft_ms + target_ms[gamma + 1])


def percentile(values: list[float], fraction: float) -> float | None:
    """Linear-interpolated percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(
    entries: list[Entry],
    baseline: list[Entry],
    reference_ids: Mapping[tuple[str, int], list[int]],
    num_draft_tokens: int | None = None,
    draft_ms: float | None = None,
    target_ms: Mapping[int, float] | None = None,
    peer: bool = False,
    comparable: bool = True,
) -> dict[str, Any]:
    """The metrics of ``entries`` (one method, one group of questions) against the baseline's; ``reference_ids``: the
    baseline's tokens by (question, run), which each entry's tokens must equal (a seeded run samples with its own
    seed). For a ``peer`` the share of questions with the baseline's tokens is its agreement, not a lossless fraction.
    ``comparable``: whether equal tokens are expected at all (not for unseeded sampling: both are None then)."""
    if not entries:
        return dict.fromkeys(METRIC_KEYS) | {"n_questions": 0}
    proposed = [e.draft_tokens_proposed for e in entries if e.draft_tokens_proposed is not None]
    accepted = [e.draft_tokens_accepted for e in entries if e.draft_tokens_accepted is not None]
    acceptance_rate = sum(accepted) / sum(proposed) if proposed and sum(proposed) else None
    steps = [size for e in entries for size in e.step_sizes]
    latencies = [latency for e in entries for latency in e.token_latencies_s]
    compared = [e for e in entries if (e.question_id, e.run) in reference_ids]
    speedup = _speedup_of(_paired_rates(entries, baseline), None)
    decode_rates = [rate for e in entries if (rate := e.decode_tokens_per_s) is not None]
    prefill_times = [e.prefill_s for e in entries if e.prefill_s is not None]
    efficiency = None
    if speedup is not None and acceptance_rate is not None and num_draft_tokens and target_ms:
        predicted = predicted_speedup(acceptance_rate, num_draft_tokens, draft_ms or 0.0, target_ms)
        efficiency = speedup / predicted if predicted else None
    p50, p90 = percentile(latencies, 0.5), percentile(latencies, 0.9)
    same_tokens = sum(e.token_ids == reference_ids[e.question_id, e.run] for e in compared)
    same = same_tokens / len(compared) if compared and comparable else None
    return {
        "speedup": speedup,
        "speedup_ci95": speedup_interval(entries, baseline) if speedup is not None else None,
        "speedup_per_run": _speedup_per_run(entries, baseline),
        "tokens_per_s": statistics.fmean(e.tokens_per_s for e in entries),
        "mean_accepted_tokens": sum(steps) / len(steps) if steps else None,
        "acceptance_rate": acceptance_rate,
        "lossless_fraction": None if peer else same,
        "agreement": same if peer else None,
        "efficiency": efficiency,
        "n_questions": len({e.question_id for e in entries}),
        "latency_p50_ms": None if p50 is None else 1000 * p50,
        "latency_p90_ms": None if p90 is None else 1000 * p90,
        "decode_speedup": _speedup_of(_paired_rates(entries, baseline, "decode_tokens_per_s"), None),
        "decode_tokens_per_s": statistics.fmean(decode_rates) if decode_rates else None,
        "prefill_s": statistics.fmean(prefill_times) if prefill_times else None,
    }


def _speedup_per_run(entries: list[Entry], baseline: list[Entry]) -> dict[str, float]:
    """The speedup of each run alone, by run (a string key, as in JSON)."""
    per_run = {run: _speedup_of({run: rates}, None) for run, rates in _paired_rates(entries, baseline).items()}
    return {str(run): speedup for run, speedup in per_run.items() if speedup is not None}


def _paired_rates(
    entries: list[Entry], baseline: list[Entry], rate: str = "tokens_per_s"
) -> dict[int, dict[str, tuple[float, float]]]:
    """Per run, per question both finished (and have a ``rate``, an :class:`Entry` property, for): (the method's
    tokens/s, the baseline's)."""
    paired: dict[int, dict[str, tuple[float, float]]] = {}
    for run in sorted({e.run for e in entries}):
        ours = {e.question_id: value for e in entries if e.run == run and (value := getattr(e, rate)) is not None}
        theirs = {e.question_id: value for e in baseline if e.run == run and (value := getattr(e, rate)) is not None}
        paired[run] = {q: (ours[q], theirs[q]) for q in sorted(ours.keys() & theirs.keys())}
    return paired


def _speedup_of(paired: dict[int, dict[str, tuple[float, float]]], question_ids: list[str] | None) -> float | None:
    """Mean over runs of (mean tokens/s of the method ÷ the baseline's) over ``question_ids`` that both finished
    (repeats count repeatedly; None: every paired question)."""
    ratios = []
    for rates in paired.values():
        chosen = [q for q in (question_ids if question_ids is not None else rates) if q in rates]
        base = statistics.fmean(rates[q][1] for q in chosen) if chosen else 0.0
        if base > 0:
            ratios.append(statistics.fmean(rates[q][0] for q in chosen) / base)
    return statistics.fmean(ratios) if ratios else None


def speedup_interval(entries: list[Entry], baseline: list[Entry]) -> tuple[float, float] | None:
    """A 95 % bootstrap interval of the speedup (:data:`BOOTSTRAP_RESAMPLES` draws, seeded): the questions are
    drawn again with replacement, each keeping all its runs (paired with the baseline's), so the interval covers
    both which questions were asked and the machine's noise from run to run. The percentiles are Hesterberg's
    expanded ones (:func:`expanded_tail`): plain 2.5 % and 97.5 % percentiles are too narrow with a category's few
    questions. None with fewer than 2 questions."""
    paired = _paired_rates(entries, baseline)
    questions = sorted({q for rates in paired.values() for q in rates})
    if len(questions) < 2:
        return None
    rng = random.Random(0)
    draws = sorted(
        value
        for _ in range(BOOTSTRAP_RESAMPLES)
        if (value := _speedup_of(paired, rng.choices(questions, k=len(questions)))) is not None
    )
    tail = expanded_tail(len(questions))
    low, high = percentile(draws, tail), percentile(draws, 1.0 - tail)
    return None if low is None or high is None else (low, high)


def expanded_tail(n: int) -> float:
    """The lower percentile a 95 % bootstrap interval of ``n`` questions takes: Φ(−√(n / (n − 1)) · t(0.975, n − 1))
    (Hesterberg's expanded percentile interval; it tends to 0.025 as n grows, and is 0.001 at n = 5), which
    widens the interval as a t interval's small-sample factor would."""
    df = n - 1
    t = T_975[df - 1] if df <= len(T_975) else 1.96 + 2.372 / df
    return statistics.NormalDist().cdf(-((n / df) ** 0.5) * t)


@dataclass(frozen=True)
class MethodInfo:
    num_draft_tokens: int | None = None
    uses_draft_model: bool = False
    target_cost_fraction: float | None = None  # self-speculation: a draft token's share of a target step
    baseline: str = "baseline"  # the method whose speed and tokens it is compared with
    peer: bool = False  # another implementation: its tokens' agreement with the baseline's, not a lossless check


def aggregate(
    entries: Iterable[Entry],
    methods: Mapping[str, MethodInfo],
    categories: list[str],
    cost_curves: Mapping[str, Mapping[int, float]] | None = None,
    comparable: bool = True,
) -> dict[str, Any]:
    """``{NAME: {"overall": {...}, "categories": {CATEGORY: {...}}, ...}}`` for every method in ``methods``,
    each compared with its ``MethodInfo.baseline`` (speedup, lossless fraction; ``comparable`` False: tokens
    were sampled without a seed, so no fraction).

    ``cost_curves`` maps :class:`CurveRole` to milliseconds per forward of k tokens.
    """
    entries = list(entries)
    curves = cost_curves or {}
    target_ms = curves.get(CurveRole.TARGET)
    results: dict[str, Any] = {}
    references: dict[str, dict[tuple[str, int], list[int]]] = {}  # baseline name -> (question, run) -> its tokens
    for name, info in methods.items():
        mine = [e for e in entries if e.method == name]
        baseline = [e for e in entries if e.method == info.baseline]
        if info.baseline not in references:
            references[info.baseline] = {(e.question_id, e.run): e.token_ids for e in baseline}
        reference_ids = references[info.baseline]
        draft_ms = draft_token_ms(curves, info.uses_draft_model, info.target_cost_fraction)
        checked = None if info.uses_draft_model and draft_ms is None else info.num_draft_tokens  # γ, for the theory
        settings = {"num_draft_tokens": checked, "draft_ms": draft_ms, "target_ms": target_ms, "peer": info.peer}
        settings["comparable"] = comparable
        results[name] = {
            "overall": summarize(mine, baseline, reference_ids, **settings),
            "categories": {
                c: summarize(in_category(mine, c), in_category(baseline, c), reference_ids, **settings)
                for c in categories
            },
            "num_draft_tokens": info.num_draft_tokens,
            "step_size_counts": dict(sorted(Counter(size for e in mine for size in e.step_sizes).items())),
            "gamma_counts": dict(sorted(Counter(gamma for e in mine for gamma in e.gammas).items())),
        }
    return results


def in_category(entries: list[Entry], category: str) -> list[Entry]:
    return [e for e in entries if e.category == category]


def category_group(result: Mapping[str, Any], category: str) -> Mapping[str, Any]:
    """One method's summary for ``category`` (``"overall"``: over every category)."""
    return result["overall"] if category == "overall" else result["categories"][category]


def fixed_gamma_methods(methods: Mapping[str, Any]) -> Iterator[tuple[str, str, int, Mapping[str, Any]]]:
    """(name, drafter, γ, result) of every fixed-γ method, named ``DRAFTER:γ``."""
    for name, result in methods.items():
        drafter, colon, gamma = name.partition(":")
        if colon and gamma.isdigit():
            yield name, drafter, int(gamma), result


def oracle(methods: Mapping[str, Any], categories: list[str]) -> dict[str, dict[str, Any]]:
    """Per drafter and category, the best fixed γ in hindsight: ``{drafter: {category: {method, gamma, speedup}}}``.

    Fixed-γ methods are named ``DRAFTER:γ``. γ = 0 is a fixed γ too: plain decoding, the baseline
    itself (1.00× by definition), so where every measured γ loses the oracle is not to draft. The
    oracle is what an adaptive policy, which may choose γ = 0, is measured against.
    """
    best: dict[str, dict[str, Any]] = {}
    for name, drafter, gamma, result in fixed_gamma_methods(methods):
        for category in [*categories, "overall"]:
            speedup = category_group(result, category)["speedup"]
            current = best.setdefault(drafter, {}).get(category)
            if speedup is not None and (current is None or speedup > current["speedup"]):
                best[drafter][category] = {"method": name, "gamma": gamma, "speedup": speedup}
    plain = {"method": "baseline", "gamma": 0, "speedup": 1.0}
    for by_category in best.values():
        for category, current in by_category.items():
            if current["speedup"] < plain["speedup"]:
                by_category[category] = dict(plain)
    return best


def held_out_oracle(methods: Mapping[str, Any], categories: list[str]) -> dict[str, dict[str, float]]:
    """Per drafter and category, the oracle without its selection bias: in each run, the speedup of the
    fixed γ (0, plain decoding, included) that was best on the other runs; the mean over runs.

    The oracle in hindsight (:func:`oracle`) is the largest of several noisy estimates, so it is biased
    upward: among fixed γ whose true speedups are equal it still beats each of them. Choosing γ on
    some runs and measuring it on another (cross-validation) removes that bias. A drafter and category
    with fewer than 2 runs of every fixed γ is left out.
    """
    by_drafter: dict[str, dict[int, Mapping[str, Any]]] = {}
    for _, drafter, gamma, result in fixed_gamma_methods(methods):
        by_drafter.setdefault(drafter, {})[gamma] = result
    held_out: dict[str, dict[str, float]] = {}
    for drafter, by_gamma in by_drafter.items():
        for category in [*categories, "overall"]:
            per_run = {
                gamma: category_group(result, category).get("speedup_per_run") or {}
                for gamma, result in by_gamma.items()
            }
            runs = sorted(set.intersection(*(set(speedups) for speedups in per_run.values())))
            if len(runs) < 2:
                continue
            per_run[0] = dict.fromkeys(runs, 1.0)  # γ = 0: the baseline itself
            measured = []
            for run in runs:
                others = [other for other in runs if other != run]
                chosen = max(per_run, key=lambda g: (statistics.fmean(per_run[g][r] for r in others), -g))
                measured.append(per_run[chosen][run])
            held_out.setdefault(drafter, {})[category] = statistics.fmean(measured)
    return held_out
