"""Speculation at long context: plain decoding against the default drafter from 1k to 32k prompt tokens.

    .venv/bin/python tools/bench_long_context.py [--lengths 1024,4096,8192,16384,32768] [--max-new-tokens 128]
        [--out results/long-context-xeon-amx/results.json]

Each prompt is ``quickdraft bench --context-lengths``'s question of that length (real source code from this Python's
standard library, cut at a line, and a question about its last function), in the chat template. The bench times
each method's whole answer; this tool adds the step costs and attention share at each length. For each length, in
one process:

1. the target reads the prompt once (timed: prompt tokens/s); each decoding run below starts from a copy of that
   cache through a prefix cache (bit for bit what reading it again gives), so its time is the answer's;
2. t(k): the target's forward over k = 1, 2, 4, 8, 16 new tokens at that context (median of 3, rolled back);
3. greedy decoding of the answer, plain and with the default drafter and goodput, taking turns: tokens/s of the
   answer, τ, γ, and whether the two are the same tokens. The draft model reads the prompt itself at its first
   draft: that is speculation's cost and is inside its time;
4. the attention share of a plain step, t(1) at this context against t(1) at 64 tokens; and the keys and values
   read per generated token (57 KB a position for the default target): a plain step reads the C cached
   positions once for its token; a verify step's rows (up to 16 of them) take turns on each tile of the cache,
   so it reads them about once for its τ tokens.

Next to ``--out``: ``speedup_vs_context.png``, the speedup and the attention share against the prompt's length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.bench.long_context import chat_token_counter, long_context_questions
from quickdraft.config import GenerationConfig
from quickdraft.engine import Engine, Request, generate
from quickdraft.engine.prefix_cache import PrefixCache

CHUNK = 2048  # prompt tokens per forward when timing the reading


def long_prompt(pipeline: Pipeline, tokens: int, answer_tokens: int) -> list[int]:
    """``bench --context-lengths``'s question of this length, through the chat template."""
    question = long_context_questions([tokens], answer_tokens, chat_token_counter(pipeline.tokenizer))[0]
    return pipeline.encode_chat([{"role": "user", "content": question.turns[0]}])


def read_prompt(pipeline: Pipeline, prompt_ids: list[int]) -> tuple[object, float]:
    cache = pipeline.target.new_cache(1)
    started = time.perf_counter()
    for first in range(0, len(prompt_ids), CHUNK):
        pipeline.target.forward(torch.tensor([prompt_ids[first : first + CHUNK]]), cache, last_only=True)
    return cache, time.perf_counter() - started


def step_times(pipeline: Pipeline, cache: object, context: int, ks: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict:
    """Median ms of the target's forward over k new tokens at ``context`` cached ones."""
    times = {}
    for k in ks:
        samples = []
        for _ in range(4):  # the first is a warm-up
            started = time.perf_counter()
            pipeline.target.forward(torch.arange(1, k + 1).unsqueeze(0), cache)  # type: ignore[arg-type]
            samples.append(1000 * (time.perf_counter() - started))
            cache.truncate(context)  # type: ignore[attr-defined]
        times[k] = statistics.median(samples[1:])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,4096,8192,16384,32768")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    pipeline = Pipeline.load()
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    pipeline.setup_policy("hybrid", config)
    kv = pipeline.target.kv_bytes_per_token
    short_cache, _ = read_prompt(pipeline, list(range(1, 65)))
    baseline_t1 = step_times(pipeline, short_cache, 64, (1,))[1]
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        prompt_ids = long_prompt(pipeline, length, args.max_new_tokens)
        cache, prefill_s = read_prompt(pipeline, prompt_ids)
        times = step_times(pipeline, cache, len(prompt_ids))
        results = {}
        for drafter in ("none", "hybrid") if len(rows) % 2 == 0 else ("hybrid", "none"):
            store = PrefixCache(2**40, kv, pipeline.target.copy_prefix, min_tokens=1)
            store.put([*prompt_ids, -1], cache)  # parts from the run's prompt at its end: the run gets a copy
            engine = Engine(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, prefix_cache=store)
            results[drafter] = generate(engine, Request(tuple(prompt_ids), config, pipeline.drafter(drafter)))
            del store, engine
        plain, spec = results["none"], results["hybrid"]
        steps = spec.stats.gamma_per_step
        tau = spec.stats.mean_accepted_tokens or 1.0
        rows.append({
            "prompt_tokens": len(prompt_ids), "prefill_s": prefill_s, "prefill_tok_s": len(prompt_ids) / prefill_s,
            "t_ms": times, "t16_over_t1": times[16] / times[1], "t8_over_t1": times[8] / times[1],
            "attention_share": 1 - baseline_t1 / times[1],
            "plain_tok_s": plain.stats.tokens_per_s, "spec_tok_s": spec.stats.tokens_per_s,
            "speedup": (spec.stats.tokens_per_s or 0) / (plain.stats.tokens_per_s or 1),
            "tau": tau, "alpha": spec.stats.acceptance_rate, "mean_gamma": statistics.mean(steps) if steps else 0.0,
            "plain_steps": len(plain.stats.step_sizes), "spec_steps": len(spec.stats.step_sizes),
            "kv_mb_per_token_plain": len(prompt_ids) * kv / 2**20,
            "kv_mb_per_token_spec": len(prompt_ids) * kv / tau / 2**20,
            "identical": plain.token_ids == spec.token_ids, "new_tokens": len(plain.token_ids),
        })  # fmt: skip
        row = rows[-1]
        print(f"{row['prompt_tokens']} tokens: read at {row['prefill_tok_s']:.0f} tok/s; t(1) {times[1]:.1f} ms, "
              f"t(8)/t(1) {row['t8_over_t1']:.2f}, attention {row['attention_share']:.0%}; plain "
              f"{row['plain_tok_s']:.1f} tok/s, default {row['spec_tok_s']:.1f} ({row['speedup']:.2f}×, τ {tau:.2f}), "
              f"identical {row['identical']}", flush=True)  # fmt: skip
        del cache
        args.out.parent.mkdir(parents=True, exist_ok=True)
        costs = pipeline.drafter("hybrid").records.cost_model  # what goodput planned with (context costs included)
        summary = {"baseline_t1_ms": baseline_t1, "cost_model": costs and costs.to_dict(), "rows": rows}
        args.out.write_text(json.dumps(summary, indent=1), encoding="utf-8")
        plot(rows, args.out.with_name("speedup_vs_context.png"))


def plot(rows: list[dict], path: Path) -> None:
    """Speedup over plain decoding and the attention share of a plain step, against the prompt's length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [row["prompt_tokens"] for row in rows]
    figure, speed = plt.subplots(figsize=(7, 4.5))
    speed.plot(lengths, [row["speedup"] for row in rows], marker="o", label="default ÷ plain (answer tokens/s)")
    speed.axhline(1.0, color="grey", linewidth=0.8)
    speed.set_xscale("log", base=2)
    speed.set_xlabel("prompt tokens (cached context)")
    speed.set_ylabel("speedup over plain decoding")
    share = speed.twinx()
    share.plot(lengths, [row["attention_share"] for row in rows], marker="s", color="tab:orange",
               label="attention share of a plain step")  # fmt: skip
    share.set_ylabel("attention share of t(1)")
    share.set_ylim(0, 1)
    handles = speed.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
    speed.legend(handles=handles, loc="upper center", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
