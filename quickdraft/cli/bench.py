"""``quickdraft bench``: its arguments; the harness itself is :mod:`quickdraft.bench.run`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from quickdraft.bench.names import BENCH_DOC, DEFAULT_METHODS, WARMUP_TOKENS, method_names
from quickdraft.cli.common import add_model_arguments, add_sampling_arguments, check_output_dir
from quickdraft.errors import ConfigError


def add_command(commands: Any, name: str, summary: str) -> None:
    bench = commands.add_parser(
        name,
        help=summary,
        description=BENCH_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument(
        "--questions",
        metavar="PATH",
        help="question file: Spec-Bench/MT-Bench .jsonl (question_id, category, turns), HumanEval .jsonl.gz, "
        "GSM8K .jsonl (default ../shared/data/spec_bench/question.jsonl when it exists)",
    )
    bench.add_argument(
        "--context-lengths",
        metavar="N,N,…",
        help="instead of a question file: one long-context question per length in tokens (standard-library source and "
        "a question about it; e.g. 1024,4096,8192,16384,32768)",
    )
    bench.add_argument("--per-category", type=int, default=5, metavar="N", help="questions per category (default 5)")
    bench.add_argument("--all-questions", action="store_true", help="every question (ignores --per-category)")
    bench.add_argument(
        "--categories",
        metavar="A,B",
        help="run only these categories of the sample (e.g. rag,summarization): the same questions a run of every "
        "category draws there (default: all)",
    )
    bench.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="per turn (default 128)")
    bench.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        metavar="A,B,C",
        help=f"comma-separated NAME or NAME:γ among {', '.join(method_names())}, or DRAFTER+POLICY "
        f"(draft-model+goodput); drafters default to γ=4; our methods take @RUNTIME "
        f"to run on another runtime (draft-model:2@transformers, compared with baseline@RUNTIME); "
        f"baseline is always included (default {DEFAULT_METHODS})",
    )
    bench.add_argument("--runs", type=int, default=1, metavar="R", help="timed runs of every question (default 1)")
    bench.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="W",
        help=f"untimed {WARMUP_TOKENS}-token generations per method before timing (default 1)",
    )
    add_sampling_arguments(
        bench,
        "the per-category sample",
        "decode at this temperature (default 0: greedy); our methods and llama.cpp's plain decoding sample",
        "seed the sampling (with --temperature; run r of --runs uses S + r): our methods then give the same text "
        "as our plain decoding, which the report's lossless column checks",
    )
    bench.add_argument(
        "--profile-context",
        type=int,
        default=512,
        metavar="N",
        help="cached tokens when measuring the cost curves for the theory check (default 512)",
    )
    bench.add_argument("--out", default="bench-results", metavar="DIR", help="output directory (default bench-results)")
    add_model_arguments(bench)
    bench.add_argument(
        "--report-only",
        action="store_true",
        help="measure nothing: write the report from the entries already in --out (e.g. of a stopped run)",
    )
    bench.add_argument("--json", action="store_true", help="print results.json to stdout instead of a table")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    from quickdraft.bench.run import run_bench
    from quickdraft.bench.settings import BenchSettings

    defaults = {field.name: field.default for field in dataclasses.fields(BenchSettings)}
    sample_flags = {
        "--per-category": args.per_category != defaults["per_category"],
        "--all-questions": args.all_questions,
        "--question-seed": args.question_seed != defaults["seed"],
    }
    if args.context_lengths is not None and any(sample_flags.values()):
        named = [flag for flag, given in sample_flags.items() if given]
        raise ConfigError(f"{', '.join(named)} draw{'s' if len(named) == 1 else ''} a sample of a question file; "
                          "--context-lengths asks one question per length")  # fmt: skip
    unused = [flag for flag in ("--per-category", "--question-seed") if args.all_questions and sample_flags[flag]]
    if unused:  # nothing is drawn: every question runs
        verb = "is" if len(unused) == 1 else "are"
        print(f"quickdraft: note: {', '.join(unused)} {verb} not used with --all-questions", file=sys.stderr)
    settings = BenchSettings(
        out=Path(args.out),
        questions=Path(args.questions) if args.questions else None,
        context_lengths=parse_lengths(args.context_lengths),
        per_category=None if args.all_questions else args.per_category,
        categories=parse_categories(args.categories),
        max_new_tokens=args.max_new_tokens,
        methods=args.methods,
        runs=args.runs,
        warmup=args.warmup,
        seed=args.question_seed,
        temperature=args.temperature,
        sampling_seed=args.seed,
        profile_context=args.profile_context,
        target=args.target,
        draft=args.draft,
        draft_weights=args.draft_weights,
        draft_vocabulary=args.draft_vocabulary,
        draft_head=args.draft_head,
        kv_cache_dtype=args.kv_cache_dtype,
        max_context=args.max_context,
        runtime=args.runtime,
        device=args.device,
        report_only=args.report_only,
    )
    check_output_dir(settings.out)  # before anything is loaded or measured
    results, plotted = run_bench(settings)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print((settings.out / "report.md").read_text(encoding="utf-8").split("\n## Overall")[0])
    plots = ", speedup.png, accept_hist.png, cost_curve.png" if plotted else " (no plots: pip install matplotlib)"
    print(f"wrote {settings.out}/results.json, report.md{plots}", file=sys.stderr)


def parse_categories(text: str | None) -> tuple[str, ...]:
    """``--categories`` as names (None: every category)."""
    if text is None:
        return ()
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",")))
    if not all(names):
        raise ConfigError(f"--categories takes comma-separated category names, got {text!r}")
    return names


def parse_lengths(text: str | None) -> tuple[int, ...]:
    """``--context-lengths`` as token counts (None: none asked for)."""
    if text is None:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"--context-lengths takes comma-separated token counts, got {text!r}") from None
