"""``quickdraft profile``: the forward time of k new tokens after a context, for k = 1..max-k.

This cost curve is what speculation trades on: γ drafts pay off only if t(γ+1) is not much
more than t(1). Each k is timed ``repeats`` times after ``warmup`` untimed runs, rolling the
cache back to the context in between, and the fastest run is reported in milliseconds (other
work on the machine only adds time).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from quickdraft.calibration import curve_to_json, measure_cost_curve
from quickdraft.cli.common import add_draft_load_arguments, add_runtime_argument, check_output_file
from quickdraft.errors import ConfigError


def add_command(commands: Any) -> None:
    profile = commands.add_parser(
        "profile",
        help="measure a model's forward time for k = 1..max-k new tokens",
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
    add_draft_load_arguments(
        profile, prefix="--"
    )  # --weights, --vocabulary: defaults as a draft model loads for "draft"
    profile.add_argument("--max-k", type=int, default=16, metavar="K", help="largest number of new tokens (default 16)")
    profile.add_argument("--context", type=int, default=512, metavar="N", help="cached tokens first (default 512)")
    profile.add_argument(
        "--repeats", type=int, default=5, metavar="R", help="timed runs per k, the fastest kept (default 5)"
    )
    profile.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed runs per k first (default 1)")
    profile.add_argument("--out", metavar="FILE", help="also write the JSON to FILE (a saved profile for later use)")
    profile.add_argument("--json", action="store_true", help="print only the JSON object")
    profile.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_tokenizer, resolve_model
    from quickdraft.runtime import AUTO, RUNTIMES, runtime_for
    from quickdraft.runtime.options import draft_load_options

    if args.max_k < 1:
        raise ConfigError(f"--max-k must be >= 1, got {args.max_k}")
    if args.out:
        check_output_file(Path(args.out))  # before measuring, so a measurement is never lost
    if args.runtime != AUTO:
        RUNTIMES.get(args.runtime)
    model = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}.get(args.model, args.model)
    path = resolve_model(model, progress=not args.json)
    runtime_cls = runtime_for(args.runtime, path)
    if args.model == "draft":  # as the pipeline loads the default draft model
        options = draft_load_options(runtime_cls, load_tokenizer(path), args.weights, args.vocabulary)
    else:
        options = draft_load_options(runtime_cls, load_tokenizer(path), args.weights or "auto", args.vocabulary or 0)
    runtime = runtime_cls.load(path, options)
    curve = measure_cost_curve(runtime, range(1, args.max_k + 1), args.context, args.repeats, args.warmup, True)
    runtime_name = runtime_cls.name
    report = {"model": str(model), "path": str(path), "runtime": runtime_name, "context": args.context}
    report |= {"weights": options.weights, "vocabulary": len(options.vocabulary or ()) or None}
    report |= {"threads": torch.get_num_threads(), "t_ms": curve_to_json(curve)}
    text = json.dumps(report, indent=None if args.json else 2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as file:
            file.write(text + "\n")
    if args.json:
        print(text)
        return
    print(f"{model} ({runtime_name}), {args.context} tokens of context, fastest of {args.repeats}:")
    for k, ms in sorted(curve.items()):
        print(f"  k={k:>3}  {ms:9.1f} ms   t(k)/t(1) = {ms / curve[1]:.2f}")
