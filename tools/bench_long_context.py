"""Speculation at long context: plain decoding against the default drafter from 1k to 32k prompt tokens.

    .venv/bin/python tools/bench_long_context.py [--lengths 1024,4096,8192,16384,32768] [--max-new-tokens 128]
        [--out results/long-context-xeon-amx/results.json]

Each prompt is real source code from this Python's standard library (whole modules, in a fixed order, cut at a
line to the length) and a question about its last function, in the chat template. For each length, one process:

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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from pathlib import Path

import torch

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.engine import Engine, Request
from quickdraft.engine.prefix_cache import PrefixCache

MODULES = ("typing.py", "argparse.py", "inspect.py", "pathlib.py", "dataclasses.py", "functools.py", "enum.py",
           "tarfile.py", "zipfile.py", "zipfile/__init__.py", "subprocess.py", "ast.py", "configparser.py",
           "textwrap.py", "difflib.py", "statistics.py", "fractions.py", "heapq.py", "bisect.py")  # fmt: skip
CHUNK = 2048  # prompt tokens per forward when timing the reading


def long_prompt(pipeline: Pipeline, tokens: int, answer_tokens: int) -> list[int]:
    """Standard-library source cut at a line so that, with the question, the chat prompt is about ``tokens``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for module in (name for name in MODULES if (root / name).is_file()):  # zipfile is a package from 3.12
        lines += [f"# ---- {module} ----\n", *(root / module).read_text(encoding="utf-8").splitlines(keepends=True)]
    budget = tokens - answer_tokens
    low, high = 1, len(lines)
    while low < high:  # the most lines whose prompt fits
        middle = (low + high + 1) // 2
        if len(chat(pipeline, lines[:middle])) <= budget:
            low = middle
        else:
            high = middle - 1
    return chat(pipeline, lines[:low])


def chat(pipeline: Pipeline, lines: list[str]) -> list[int]:
    functions = [line.split("def ", 1)[1].split("(")[0] for line in lines if line.lstrip().startswith("def ")]
    name = functions[-1] if functions else "the last function"
    question = f"Explain step by step what the function `{name}` defined above does, and name one edge case."
    return pipeline.encode_chat([{"role": "user", "content": "".join(lines) + "\n\n" + question}])


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
            results[drafter] = engine.generate(Request(tuple(prompt_ids), config, pipeline.drafter(drafter)))
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
        args.out.write_text(json.dumps({"baseline_t1_ms": baseline_t1, "rows": rows}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
