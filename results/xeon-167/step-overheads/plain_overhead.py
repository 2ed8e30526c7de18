"""Per plain step, what the default does beyond plain decoding: both decode the same prompt (64 tokens at most,
seeded T 0.7) with every step plain (the default's goodput bid forced to 0 after it is made), twice each, taking
turns, under cProfile; the default's busiest functions by own time:

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/plain_overhead.py 0.7
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from dataclasses import replace
from typing import Any

import quickdraft.policies.goodput as goodput
from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig, SamplingParams

PROMPT = (
    "Translate the following text into German: The weather was fine, so we walked along the river to the old "
    "bridge and had lunch there."
)
bid = goodput.GoodputPolicy.bid


def plain_bid(policy: goodput.GoodputPolicy, state: Any = goodput.UNKNOWN_STATE) -> Any:
    return replace(bid(policy, state), num_draft_tokens=0, offer=None, reach=None)


def native_seconds(stats: pstats.Stats) -> float:
    """The target's native forward and LM head, from the profile."""
    return sum(
        row[3]
        for (_, _, name), row in stats.stats.items()  # type: ignore[attr-defined]
        if ("built-in" in name and "forward" in name) or "q6_matmul" in name
    )


def main() -> None:
    goodput.GoodputPolicy.bid = plain_bid  # type: ignore[method-assign]
    pipeline = Pipeline.load(progress=False)
    temperature = float(sys.argv[1])
    sampling = SamplingParams(temperature=temperature, seed=1) if temperature else SamplingParams()
    config = GenerationConfig(max_new_tokens=64, sampling=sampling)
    for drafter in ("none", "hybrid-suffix"):
        pipeline.generate(PROMPT, config, chat=True, drafter=drafter)
    for drafter in ("none", "hybrid-suffix", "none", "hybrid-suffix"):
        profile = cProfile.Profile()
        tick = time.perf_counter()
        profile.enable()
        result = pipeline.generate(PROMPT, config, chat=True, drafter=drafter)
        profile.disable()
        wall, tokens = time.perf_counter() - tick, len(result.token_ids)
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        print(f"{drafter} tokens {tokens} wall {wall:.3f} per step {1000 * wall / tokens:.2f} ms "
              f"native {1000 * native_seconds(stats) / tokens:.2f} ms")  # fmt: skip
        if drafter == "hybrid-suffix":
            stats.sort_stats("tottime").print_stats(12)
            print(text.getvalue()[-2500:])


if __name__ == "__main__":
    main()
