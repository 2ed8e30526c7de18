"""How much the prompt's reading caps a Spec-Bench speedup: from a bench run's entries, per category and overall, the
baseline's share of time spent reading prompts, the speedup if the method decoded for free (the prompt read as it
was), and the after-the-prompt speedup S that, applied to every question, gives the goal. Then, from the run's cost
curve, the per-token match a chain of model drafts needs for that S. A probe on recorded runs.

    python results/zen5-26/dilution.py RUN_DIR [RUN_DIR ...] [--method M] [--goal G] [--match A]

Speedup as the bench computes it: the mean over questions of tokens/s, over the baseline's. A question's time is its
prompt reading (``prefill_s``: every turn's time to its first token) plus its decoding; S replaces the method's
decoding by the baseline's divided by S. The chain's ideal after the prompt is docs/sampling.md's ("The ceiling, in
numbers"): max over γ of (1 − a^(γ+1)) / (1 − a) tokens per t(γ + 1) + γ·d against t(1) a token, with t the target's
cost curve and d a drafted token's cost (``cost_curves.json``: 512 cached tokens); ``--match`` gives the ideal at a
measured per-token match a.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def load(run: Path, method: str) -> list[tuple[str, float, float, float, float, float]]:
    """Per question and run (the runs pooled): (category, tokens, baseline wall, baseline prompt time, the method's
    prompt time, the method's tokens/s)."""
    entries: dict[tuple[str, int], dict[str, dict]] = defaultdict(dict)
    for line in (run / "entries.jsonl").read_text().splitlines():
        entry = json.loads(line)
        entries[entry["question_id"], entry["run"]][entry["method"]] = entry
    rows = []
    for by_method in entries.values():
        base, other = by_method["baseline"], by_method[method]
        rate = other["new_tokens"] / other["wall_time_s"]
        base_times = base["wall_time_s"], base["prefill_s"]
        rows.append((base["category"], base["new_tokens"], *base_times, other["prefill_s"], rate))
    return rows


def speedup(rows: list, method_rates: list[float]) -> float:
    base_rates = [tokens / wall for _, tokens, wall, *_ in rows]
    return sum(method_rates) / sum(base_rates)


def with_decoding_speedup(rows: list, factor: float) -> float:
    """The speedup if the method read each prompt as it did and decoded ``factor`` times as fast as the baseline."""
    rates = [tokens / (prompt + (wall - base_prompt) / factor) for _, tokens, wall, base_prompt, prompt, _ in rows]
    return speedup(rows, rates)


def needed(rows: list, goal: float) -> float | None:
    """The uniform after-the-prompt speedup giving ``goal`` overall; None if even free decoding falls short."""
    if with_decoding_speedup(rows, 1e9) < goal:
        return None
    low, high = 1.0, 1e9
    for _ in range(200):
        middle = (low * high) ** 0.5
        low, high = (middle, high) if with_decoding_speedup(rows, middle) < goal else (low, middle)
    return high


def chain_ideal(curve: dict, match: float) -> tuple[float, int]:
    """The best (speedup after the prompt, γ) of a chain of model drafts matching the target's token with ``match``."""
    target, draft = {int(k): v for k, v in curve["target"].items()}, curve["draft"]["1"]
    gammas = [gamma for gamma in range(1, 9) if gamma + 1 in target]
    return max(
        ((1 - match ** (gamma + 1)) / (1 - match) * target[1] / (target[gamma + 1] + gamma * draft), gamma)
        for gamma in gammas
    )


def match_needed(curve: dict, speedup_after_prompt: float) -> float:
    """The per-token match at which the chain's ideal reaches ``speedup_after_prompt``."""
    low, high = 0.0, 0.999
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if chain_ideal(curve, middle)[0] < speedup_after_prompt else (low, middle)
    return high


def report(run: Path, method: str, goal: float, match: float | None) -> None:
    rows = load(run, method)
    print(f"{run}  ({method}, goal {goal}x)")
    print(f"{'category':16} {'measured':>9} {'prompt share':>12} {'free decoding':>14} {f'S for {goal}x':>10}")
    categories = sorted({row[0] for row in rows})
    for name, subset in [*((c, [r for r in rows if r[0] == c]) for c in categories), ("overall", rows)]:
        share = sum(r[3] for r in subset) / sum(r[2] for r in subset)
        need = needed(subset, goal)
        need_text = "unreachable" if need is None else f"{need:.2f}x"
        measured = speedup(subset, [r[5] for r in subset])
        free = with_decoding_speedup(subset, 1e9)
        print(f"{name:16} {measured:8.2f}x {share:12.0%} {free:13.2f}x {need_text:>10}")
    curve = json.loads((run / "cost_curves.json").read_text())
    need = needed(rows, goal)
    if need is not None:
        print(f"a chain of drafts reaches S {need:.2f}x at a per-token match of {match_needed(curve, need):.3f}")
    if match is not None:
        ideal, gamma = chain_ideal(curve, match)
        print(f"the chain's ideal after the prompt at a match of {match}: {ideal:.2f}x (γ {gamma})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--method", default="hybrid-suffix+goodput")
    parser.add_argument("--goal", type=float, default=1.45)
    parser.add_argument("--match", type=float, help="a measured per-token match, for the chain's ideal at it")
    args = parser.parse_args()
    for run in args.runs:
        report(run, args.method, args.goal, args.match)
        print()


if __name__ == "__main__":
    main()
