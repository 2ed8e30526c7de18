"""Whether drafting while the target verifies can pay on this machine (issue 45): the costs, and the ideal speedup of
the sequential and the overlapped schedules.

    .venv/bin/python tools/overlap_costs.py --out results/overlap-epyc/overlap.json

It times, as ``quickdraft profile`` does (fastest of R after a 512-token context), the target's k-token forward
(k = 1..γmax+1) and the draft model's 1-token forward:
- on both cores (2 threads), alone: the sequential schedule's costs;
- on one core (1 thread, pinned), alone;
- on one core while the other model loops on the other core: the overlapped schedule's costs (they share the
  memory bus and caches).

From them, per acceptance rate α (each draft accepted with probability α, independently), for the best γ of each:
- sequential: a round drafts γ tokens on both cores, then verifies γ + 1 on both cores;
  time = γ·d₂ + t₂(γ+1).
- overlapped (draft ahead, as in PEARL or AMUSD): the target verifies block n on one core while the draft drafts
  block n + 1 on the other, assuming block n is accepted whole and guessing the target's bonus token. That guess
  survives with probability α^(γ+1); when it does not, the next block is drafted first, on both cores:
  time = max(t₁ᶜ(γ+1), γ·d₁ᶜ) + (1 − α^(γ+1))·γ·d₂.
Both commit (1 − α^(γ+1)) / (1 − α) tokens a round; speedups are over plain decoding on both cores, t₂(1) a token.
This ideal leaves out every overhead (sampling, rollback, the threads' hand-offs), so it bounds what building the
overlap could give.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runnable from a checkout without installing

from quickdraft.machine import cpu_description

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
BUILD_THRESHOLD = 1.10  # issue 45: build the overlap only where its ideal beats sequential's by 10 %


SHAPES = {  # the default pair's shapes (Qwen2.5-1.5B and 0.5B), for --random-shapes
    "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
}


def load(model: str, shapes: str | None) -> Any:
    """The default pair's target or draft on the native runtime, loaded as the pipeline loads it; with ``shapes``
    (a folder), a random-weight model of its shape from there, the target's weights all in 4 bits (the file's are
    Q4_K but for its Q6_K tensors) and the draft's as the pipeline loads the draft."""
    from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
    from quickdraft.runtime import AUTO, runtime_for
    from quickdraft.runtime.base import LoadOptions
    from quickdraft.runtime.device import resolve_device
    from quickdraft.runtime.native import NativeRuntime
    from quickdraft.runtime.options import DRAFT_VOCABULARY, draft_load_options

    if shapes is not None:
        vocabulary = tuple(range(DRAFT_VOCABULARY)) if model == "draft" else None
        return NativeRuntime.load(Path(shapes) / model, LoadOptions("q4", vocabulary))
    path = resolve_model({"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}[model], progress=False)
    device = resolve_device("cpu")
    runtime_cls = runtime_for(AUTO, path, device)
    weights, vocabulary = (None, None) if model == "draft" else ("auto", 0)
    return runtime_cls.load(path, draft_load_options(runtime_cls, load_tokenizer(path), weights, vocabulary, device))


def make_shapes(folder: Path) -> None:
    """Random-weight transformers directories of the default pair's shapes in ``folder`` (once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    for model, fields in SHAPES.items():
        if (folder / model / "config.json").is_file():
            continue
        config = AutoConfig.for_model("qwen2", num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                                      max_position_embeddings=4096, **fields)  # fmt: skip
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder / model)


def pin(cpus: list[int], threads: int) -> None:
    import torch

    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)


def timed(model: str, ks: list[int], cpus: list[int], threads: int, context: int, repeats: int, shapes: str | None,
          queue: Any) -> None:  # fmt: skip
    """A process: the cost curve of ``model`` on ``cpus`` with ``threads`` threads, put on ``queue``."""
    from quickdraft.costs.calibration import measure_cost_curve

    pin(cpus, threads)
    runtime = load(model, shapes)
    queue.put(("ready", model))
    queue.put(("curve", measure_cost_curve(runtime, ks, context, repeats, warmup=2)))


def loop(model: str, k: int, cpus: list[int], context: int, shapes: str | None, stop: Any, queue: Any) -> None:
    """A process: forwards of k tokens of ``model`` on one core, one after another, until ``stop`` is set."""
    import torch

    pin(cpus, 1)
    runtime = load(model, shapes)
    cache = runtime.new_cache(1)
    runtime.forward(torch.randint(0, 1000, (1, context)), cache, last_only=True)
    tokens = torch.randint(0, 1000, (1, k))
    queue.put(("ready", model))
    while not stop.is_set():
        runtime.forward(tokens, cache)
        cache.truncate(context)


def measure(model: str, ks: list[int], cpus: list[int], threads: int, args: argparse.Namespace,
            partner: tuple[str, int, list[int]] | None = None) -> dict[int, float]:  # fmt: skip
    """The curve of ``model``, alone or while ``partner`` (model, k, cpus) loops beside it."""
    context = multiprocessing.get_context("spawn")
    queue, stop = context.Queue(), context.Event()
    helper = None
    if partner is not None:
        helper = context.Process(target=loop, args=(*partner, args.context, args.random_shapes, stop, queue))
        helper.start()
        assert queue.get()[0] == "ready"  # the partner loops before the timing starts
    worker_args = (model, ks, cpus, threads, args.context, args.repeats, args.random_shapes, queue)
    worker = context.Process(target=timed, args=worker_args)
    worker.start()
    while (message := queue.get())[0] != "curve":
        pass
    worker.join()
    stop.set()
    if helper is not None:
        helper.join()
    return {int(k): float(ms) for k, ms in message[1].items()}


def ideal(costs: dict[str, dict[int, float]], alpha: float, max_gamma: int) -> dict[str, Any]:
    """Best γ and speedup over plain decoding of each schedule at acceptance ``alpha``."""
    t2, d2 = costs["target_2"], costs["draft_2"][1]
    t1c, d1c = costs["target_1_beside"], costs["draft_1_beside"][1]
    best: dict[str, Any] = {}
    for gamma in range(1, max_gamma + 1):
        survive = alpha ** (gamma + 1)
        tokens = (1 - survive) / (1 - alpha)
        rounds = {
            "sequential": gamma * d2 + t2[gamma + 1],
            "overlapped": max(t1c[gamma + 1], gamma * d1c) + (1 - survive) * gamma * d2,
        }
        for schedule, round_ms in rounds.items():
            speedup = tokens * t2[1] / round_ms
            if speedup > best.get(schedule, {}).get("speedup", 0.0):
                best[schedule] = {"gamma": gamma, "speedup": round(speedup, 3)}
    best["overlapped_over_sequential"] = round(best["overlapped"]["speedup"] / best["sequential"]["speedup"], 3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON of costs and ideal speedups")
    parser.add_argument("--max-gamma", type=int, default=7, help="largest γ considered (default 7)")
    parser.add_argument("--context", type=int, default=512, help="cached tokens (default 512)")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per k, the fastest kept (default 9)")
    parser.add_argument("--alpha", type=float, action="append", help="acceptance rates (default 0.5 … 0.9)")
    parser.add_argument("--cpus", help="the two cores to use, e.g. 0,1 (default: the first two this process may use)")
    parser.add_argument(
        "--random-shapes",
        metavar="DIR",
        help="time random-weight models of the default pair's shapes, made in DIR once, instead of the default pair "
        "(a machine without the pair's files; timing needs no trained weights)",
    )
    args = parser.parse_args()
    if args.random_shapes:
        make_shapes(Path(args.random_shapes))
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores: one for each model")
    first, second = [int(cpu) for cpu in args.cpus.split(",")] if args.cpus else sorted(os.sched_getaffinity(0))[:2]
    ks = list(range(1, args.max_gamma + 2))
    plan = {  # name -> (model, ks, cpus, threads, partner looping beside it)
        "target_2": ("target", ks, [first, second], 2, None),
        "draft_2": ("draft", [1], [first, second], 2, None),
        "target_1": ("target", ks, [first], 1, None),
        "draft_1": ("draft", [1], [second], 1, None),
        "target_1_beside": ("target", ks, [first], 1, ("draft", 1, [second])),
        "draft_1_beside": ("draft", [1], [second], 1, ("target", 5, [first])),
    }
    costs = {}
    for name, (model, wanted, cpus, threads, partner) in plan.items():
        print(f"timing {name} ...", file=sys.stderr, flush=True)
        costs[name] = measure(model, wanted, cpus, threads, args, partner)
    alphas = args.alpha or list(ALPHAS)
    report = {
        "context": args.context,
        "repeats": args.repeats,
        "cpu": cpu_description(),
        "cpus": [first, second],
        "models": "random weights of the default pair's shapes" if args.random_shapes else "the default pair",
        "costs_ms": {name: {str(k): round(ms, 2) for k, ms in curve.items()} for name, curve in costs.items()},
        "ideal": {str(alpha): ideal(costs, alpha, args.max_gamma) for alpha in alphas},
    }
    best = max(entry["overlapped_over_sequential"] for entry in report["ideal"].values())
    report["verdict"] = "overlap pays" if best >= BUILD_THRESHOLD else "overlap does not pay (< 10 % over sequential)"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
