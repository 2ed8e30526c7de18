"""``quickdraft profile``: the forward time of k new tokens after a context, for k = 1..max-k.

This cost curve is what speculation trades on: γ drafts pay off only if t(γ+1) is not much
more than t(1). Each k is timed ``repeats`` times after ``warmup`` untimed runs, rolling the
cache back to the context in between, and the fastest run is reported in milliseconds (other
work on the machine only adds time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tqdm.auto import tqdm

from quickdraft.errors import ConfigError
from quickdraft.runtime.base import Runtime

PREFILL_LENGTHS = (128, 512, 1024)  # prompt lengths at which a draft model's reading is timed
DRAFT_PREFILL = "draft_prefill"  # the bench's name for that curve (n tokens -> ms), beside "target" and "draft"


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
    label: str = "profile",
) -> dict[int, float]:
    """Milliseconds of a forward over k new tokens with ``context`` tokens cached (fastest of ``repeats``)."""
    return measure_cost_curves({label: runtime}, {label: ks}, context, repeats, warmup, progress)[label]


def measure_cost_curves(
    runtimes: Mapping[str, Runtime],
    ks: Mapping[str, Iterable[int]],
    context: int,
    repeats: int = 3,
    warmup: int = 1,
    progress: bool = False,
) -> dict[str, dict[int, float]]:
    """Per runtime (e.g. target and draft), milliseconds of a forward over k new tokens after ``context``
    cached tokens: the fastest of ``repeats`` timed runs after ``warmup`` untimed ones.

    The runtimes and k take turns within every repeat, and the fastest run is kept: on a shared machine
    other work only ever adds time, and a slow spell then slows one repeat of every curve instead of one
    whole curve. What policies trade on is the ratio between the curves (a draft token against a
    target step), and two curves measured one after the other measured that ratio at 0.40 in one bench
    and 0.51 in the next.
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
        prompt = torch.randint(0, runtime.vocab_size, (1, context), generator=generator)  # [1, context]
        runtime.forward(prompt, caches[role], last_only=True)
    token_ids = {  # [1, k] per role and k
        role: {k: torch.randint(0, runtimes[role].vocab_size, (1, k), generator=generator) for k in wanted[role]}
        for role in runtimes
    }
    times: dict[str, dict[int, list[float]]] = {role: {k: [] for k in wanted[role]} for role in runtimes}
    steps = [(role, k) for k in sorted(set().union(*wanted.values())) for role in runtimes if k in wanted[role]]
    label = "profile " + " and ".join(runtimes)
    with tqdm(total=(warmup + repeats) * len(steps), desc=label, disable=not progress, file=sys.stderr) as bar:
        for repeat in range(warmup + repeats):
            for role, k in steps:
                started = time.perf_counter()
                runtimes[role].forward(token_ids[role][k], caches[role])
                elapsed = time.perf_counter() - started
                caches[role].truncate(context)
                if repeat >= warmup:
                    times[role][k].append(elapsed)
                bar.update()
    return {role: {k: 1000 * min(samples) for k, samples in curve.items()} for role, curve in times.items()}


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
            started = time.perf_counter()
            runtime.forward(token_ids, cache, last_only=True)
            times.append(time.perf_counter() - started)
        curve[n] = 1000 * min(times[warmup:])
    return curve


def curve_to_json(curve: dict[int, float]) -> dict[str, float]:
    return {str(k): round(ms, 3) for k, ms in sorted(curve.items())}


def curve_from_json(data: dict[str, float]) -> dict[int, float]:
    return {int(k): float(ms) for k, ms in data.items()}


def add_profile_command(commands: Any) -> None:
    from quickdraft.cli import add_runtime_argument

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
    profile.add_argument("--max-k", type=int, default=16, metavar="K", help="largest number of new tokens (default 16)")
    profile.add_argument("--context", type=int, default=512, metavar="N", help="cached tokens first (default 512)")
    profile.add_argument(
        "--repeats", type=int, default=5, metavar="R", help="timed runs per k, the fastest kept (default 5)"
    )
    profile.add_argument("--warmup", type=int, default=1, metavar="W", help="untimed runs per k first (default 1)")
    profile.add_argument("--out", metavar="FILE", help="also write the JSON to FILE (a saved profile for later use)")
    profile.add_argument("--json", action="store_true", help="print only the JSON object")
    profile.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> None:
    from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model
    from quickdraft.runtime import AUTO, RUNTIMES, runtime_for

    if args.max_k < 1:
        raise ConfigError(f"--max-k must be >= 1, got {args.max_k}")
    if args.runtime != AUTO:
        RUNTIMES.get(args.runtime)
    model = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT}.get(args.model, args.model)
    path = resolve_model(model, progress=not args.json)
    runtime_cls = runtime_for(args.runtime, path)
    runtime = runtime_cls.load(path)
    curve = measure_cost_curve(runtime, range(1, args.max_k + 1), args.context, args.repeats, args.warmup, True)
    runtime_name = runtime_cls.name
    report = {"model": str(model), "path": str(path), "runtime": runtime_name, "context": args.context}
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
