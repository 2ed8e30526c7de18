"""``quickdraft profile``: the forward time of k new tokens after a context, for k = 1..max-k.

This cost curve is what speculation trades on: γ drafts pay off only if t(γ+1) is not much
more than t(1). Each k is timed ``repeats`` times after ``warmup`` untimed runs, rolling the
cache back to the context in between, and the fastest run is reported in milliseconds (other
work on the machine only adds time).

With ``--prefill N`` it times reading an N-token prompt into an empty cache instead (prompt
tokens/s), and ``--against llama-cpp`` times llama.cpp reading the same tokens from the same GGUF
file in the same process, the two taking turns (llama-bench's ``pp N``; needs llama-cpp-python).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quickdraft.cli.common import (
    add_cache_arguments,
    add_draft_load_arguments,
    add_runtime_argument,
    check_output_file,
)
from quickdraft.errors import ConfigError

MAX_K, CONTEXT = 16, 512  # the curve's defaults: up to 16 new tokens after 512 cached
REGULAR_TOKENS = 150_000  # prompt ids are drawn below this: ordinary tokens of any Qwen2-sized vocabulary


def add_command(commands: Any, name: str, summary: str) -> None:
    profile = commands.add_parser(
        name,
        help=summary,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profile.add_argument(
        "--model",
        default="target",
        metavar="MODEL",
        help="target or draft (the default pair), a packaged name, a transformers directory or a .gguf file "
        "(default target)",
    )
    add_runtime_argument(profile)
    add_cache_arguments(profile)
    add_draft_load_arguments(profile, prefix="--")  # --weights, --vocabulary: as a draft model loads for "draft"
    profile.add_argument(
        "--max-k", type=int, default=MAX_K, metavar="K", help=f"largest number of new tokens (default {MAX_K})"
    )
    profile.add_argument(
        "--context", type=int, default=CONTEXT, metavar="N", help=f"cached tokens first (default {CONTEXT})"
    )
    profile.add_argument(
        "--placeholder-context",
        action="store_true",
        help="fill the context with placeholder keys and values instead of reading a random prompt: attention costs "
        "the same, and long contexts take no minutes to fill",
    )
    profile.add_argument(
        "--repeats", type=int, default=5, metavar="R", help="timed runs per k, the fastest kept (default 5)"
    )
    profile.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed runs per k first (default 1)")
    profile.add_argument(
        "--prefill", type=int, metavar="N", help="time reading an N-token prompt instead of the k-token curve"
    )
    profile.add_argument(
        "--against",
        choices=["llama-cpp"],
        help="with --prefill: also time llama.cpp reading the same prompt from the same GGUF file",
    )
    profile.add_argument("--out", metavar="FILE", help="also write the JSON to FILE (a saved profile for later use)")
    profile.add_argument("--json", action="store_true", help="print only the JSON object")
    profile.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    import torch

    from quickdraft.costs.calibration import curve_to_json, measure_cost_curve
    from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
    from quickdraft.runtime import check_runtime, runtime_for
    from quickdraft.runtime.device import resolve_device
    from quickdraft.runtime.options import draft_load_options

    if args.max_k < 1:
        raise ConfigError(f"--max-k must be >= 1, got {args.max_k}")
    if args.prefill is not None and args.prefill < 1:
        raise ConfigError(f"--prefill must be >= 1, got {args.prefill}")
    if args.against and args.prefill is None:
        raise ConfigError("--against compares prompt reading: give --prefill N too")
    if args.context < 1:
        raise ConfigError(f"--context must be >= 1, got {args.context}")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    if args.warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {args.warmup}")
    # notes once every setting is known to be valid: an error is then the one line printed
    curve_only = {"--max-k": args.max_k != MAX_K, "--context": args.context != CONTEXT,
                  "--placeholder-context": args.placeholder_context}  # fmt: skip
    unused = [flag for flag, given in curve_only.items() if given and args.prefill is not None]
    if unused:
        flags = ", ".join(unused)
        print(
            f"quickdraft: note: not used with --prefill (it times a prompt, not the k-token curve): {flags}",
            file=sys.stderr,
        )
    if args.out:
        check_output_file(Path(args.out))  # before measuring, so a measurement is never lost
    check_runtime(args.runtime)
    model = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}.get(args.model, args.model)
    path = resolve_model(model, progress=not args.json)
    device = resolve_device(args.device)
    runtime_cls = runtime_for(args.runtime, path, device)
    draft = args.model == "draft"  # loaded as the pipeline loads the default draft model
    weights, vocabulary = (args.weights, args.vocabulary) if draft else (args.weights or "auto", args.vocabulary or 0)
    options = draft_load_options(runtime_cls, load_tokenizer(path), weights, vocabulary, device, "")
    options = replace(options, kv_cache_dtype=args.kv_cache_dtype, max_context=args.max_context)
    reader = None
    if args.against:  # before loading ours: a missing or unusable binding is a clear error, at once
        from quickdraft.bench.llama_cpp import prompt_reader, verified_gguf

        reader = prompt_reader(verified_gguf(path), torch.get_num_threads(), args.prefill)
    runtime = runtime_cls.load(path, options)
    options.check_capped(runtime, "the model")
    runtime_name = runtime_cls.name
    report = {"model": str(model), "path": str(path), "runtime": runtime_name, "weights": options.weights}
    report |= {"kv_cache_dtype": runtime.kv_cache_dtype, "max_context": runtime.max_context}
    report |= {"vocabulary": len(options.vocabulary or ()) or None, "threads": torch.get_num_threads()}
    if args.prefill is not None:
        report |= measure_prefill(runtime, args.prefill, args.repeats, args.warmup, reader)
    else:
        ks = range(1, args.max_k + 1)
        curve = measure_cost_curve(runtime, ks, args.context, args.repeats, args.warmup, True, args.placeholder_context)
        report |= {"context": args.context, "placeholder_context": args.placeholder_context}
        report |= {"t_ms": curve_to_json(curve)}
    text = json.dumps(report, indent=None if args.json else 2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
        return
    if args.prefill is not None:
        print(f"{model} ({runtime_name}), a {args.prefill}-token prompt, fastest of {args.repeats}:")
        for name in ("quickdraft", "llama_cpp"):
            if name in report["prefill"]:
                ms = report["prefill"][name]["ms"]
                print(f"  {name:<10} {ms:9.1f} ms  {report['prefill'][name]['tokens_per_s']:8.1f} tokens/s")
        if "ratio" in report["prefill"]:
            print(f"  quickdraft reads prompts {report['prefill']['ratio']:.2f}x as fast as llama.cpp")
        return
    print(f"{model} ({runtime_name}), {args.context} tokens of context, fastest of {args.repeats}:")
    for k, ms in sorted(curve.items()):
        print(f"  k={k:>3}  {ms:9.1f} ms   t(k)/t(1) = {ms / curve[1]:.2f}")


def measure_prefill(runtime: Any, tokens: int, repeats: int, warmup: int, reader: Any) -> dict[str, Any]:
    """Milliseconds (fastest of ``repeats`` after ``warmup``) of reading ``tokens`` random prompt tokens into an
    empty cache, ours and, with ``reader`` (:func:`quickdraft.bench.llama_cpp.prompt_reader`), llama.cpp's on the
    same ids, taking turns."""
    import torch

    if tokens > runtime.max_context:
        raise ConfigError(f"--prefill {tokens} exceeds the model's {runtime.max_context} positions")
    generator = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, min(runtime.vocab_size, REGULAR_TOKENS), (1, tokens), generator=generator)
    times: dict[str, list[float]] = {"quickdraft": []} | ({"llama_cpp": []} if reader else {})
    for repeat in range(warmup + repeats):
        runtime.synchronize()
        started = time.perf_counter()
        runtime.forward(token_ids, runtime.new_cache(1), last_only=True)
        runtime.synchronize()
        ours = 1000 * (time.perf_counter() - started)
        theirs = reader(token_ids[0].tolist()) if reader else None
        if repeat >= warmup:
            times["quickdraft"].append(ours)
            if theirs is not None:
                times["llama_cpp"].append(theirs)
    result: dict[str, Any] = {
        name: {"ms": round(min(ms), 3), "tokens_per_s": round(tokens / min(ms) * 1000, 1)} for name, ms in times.items()
    }
    if reader:
        result["ratio"] = round(min(times["llama_cpp"]) / min(times["quickdraft"]), 3)
    return {"prefill": {"tokens": tokens, **result}}
