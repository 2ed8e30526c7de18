"""``quickdraft sweep``: speedup of each drafter over our plain decoding, per γ and prompt type.

Every method runs in the same process on the same prompts, greedy, after a warm-up:
``baseline`` (our plain decoding through the same loop), ``hf-generate`` (transformers
``generate(do_sample=False)`` on the same model object, a sanity check of the baseline)
and each drafter at each γ. Speedup is tokens/s over the baseline's on the same prompt;
``lossless`` says whether the token ids equal the baseline's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm

from quickdraft.bench.peers import hf_greedy_generate
from quickdraft.bench.prompts import PROMPTS
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.stats import GenerationStats


@dataclass(frozen=True)
class Measurement:
    prompt: str
    method: str  # baseline | hf-generate | <drafter>
    num_draft_tokens: int | None
    new_tokens: int
    tokens_per_s: float
    speedup: float | None  # over the baseline on the same prompt
    acceptance_rate: float | None
    mean_accepted_tokens: float | None
    lossless: bool


class Run(NamedTuple):
    token_ids: list[int]
    tokens_per_s: float
    stats: GenerationStats | None  # None for hf-generate


def add_sweep_command(commands: Any) -> None:
    from quickdraft.cli import add_model_arguments

    sweep = commands.add_parser(
        "sweep",
        help="measure speedup per drafter and γ on four prompt types",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(sweep)
    sweep.add_argument("--drafters", default="draft-model,prompt-lookup", help="comma-separated drafter names")
    sweep.add_argument("--gammas", default="1,2,3,4", help="comma-separated numbers of draft tokens (default 1,2,3,4)")
    sweep.add_argument("--prompts", default=",".join(PROMPTS), help=f"prompt types among {', '.join(PROMPTS)}")
    sweep.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per run (default 64)")
    sweep.add_argument("--repeats", type=int, default=1, metavar="R", help="runs per method; the median counts")
    sweep.add_argument("--no-hf", action="store_true", help="skip the transformers generate() reference")
    sweep.add_argument("--json", action="store_true", help="print the measurements as JSON instead of a table")
    sweep.set_defaults(handler=run_sweep)


def parse_list(text: str, kind: type = str) -> list[Any]:
    try:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError as error:
        raise ConfigError(f"cannot read the list {text!r}: {error}") from None


def run_sweep(args: argparse.Namespace) -> None:
    from quickdraft.api import Pipeline
    from quickdraft.cli import draft_for
    from quickdraft.drafters import DRAFTERS

    drafters, gammas, prompt_names = parse_list(args.drafters), parse_list(args.gammas, int), parse_list(args.prompts)
    for name in drafters:
        DRAFTERS.get(name)
    unknown = [name for name in prompt_names if name not in PROMPTS]
    if unknown:
        raise ConfigError(f"unknown prompt types {unknown}; choose among {', '.join(PROMPTS)}")
    if args.repeats < 1 or any(g < 1 for g in gammas):
        raise ConfigError("--repeats and every γ in --gammas must be >= 1")
    GenerationConfig(max_new_tokens=args.max_new_tokens)  # validates the budget before loading models
    pipeline = Pipeline.load(target=args.target, draft=draft_for(args, drafters), runtime=args.runtime)
    hf_model = None if args.no_hf else getattr(pipeline.target, "model", None)
    methods: list[tuple[str, int | None]] = [("baseline", None)]
    methods += [("hf-generate", None)] if hf_model is not None else []
    methods += [(name, gamma) for name in drafters for gamma in gammas]

    def timed_run(prompt_ids: list[int], method: str, gamma: int | None, max_new_tokens: int) -> Run:
        if method == "hf-generate":
            started = time.perf_counter()
            token_ids = hf_greedy_generate(
                hf_model, prompt_ids, max_new_tokens, pipeline.eos_token_ids, pipeline.tokenizer.pad_token_id
            )
            return Run(token_ids, len(token_ids) / (time.perf_counter() - started), None)
        drafter = "none" if method == "baseline" else method
        config = GenerationConfig(max_new_tokens=max_new_tokens, num_draft_tokens=gamma or 0)
        result = pipeline.engine(drafter).generate(prompt_ids, config)
        return Run(result.token_ids, result.stats.tokens_per_s or 0.0, result.stats)

    chat = bool(getattr(pipeline.tokenizer, "chat_template", None))
    encoded = {name: pipeline.encode(PROMPTS[name], chat=chat) for name in prompt_names}
    for method, gamma in tqdm(methods, desc="warm-up", file=sys.stderr):
        timed_run(encoded[prompt_names[0]], method, gamma, 4)

    measurements: list[Measurement] = []
    runs = [(p, m, g) for p in prompt_names for (m, g) in methods]
    baseline: dict[str, tuple[list[int], float]] = {}
    for prompt_name, method, gamma in tqdm(runs, desc="sweep", file=sys.stderr):
        repeats = [timed_run(encoded[prompt_name], method, gamma, args.max_new_tokens) for _ in range(args.repeats)]
        tokens_per_s = statistics.median(run.tokens_per_s for run in repeats)
        token_ids, stats = repeats[-1].token_ids, repeats[-1].stats
        if method == "baseline":
            baseline[prompt_name] = (token_ids, tokens_per_s)
        base_ids, base_speed = baseline[prompt_name]
        measurements.append(
            Measurement(
                prompt=prompt_name,
                method=method,
                num_draft_tokens=gamma,
                new_tokens=len(token_ids),
                tokens_per_s=tokens_per_s,
                speedup=None if method == "baseline" else tokens_per_s / base_speed,
                acceptance_rate=None if stats is None else stats.acceptance_rate,
                mean_accepted_tokens=None if stats is None else stats.mean_accepted_tokens,
                lossless=token_ids == base_ids,
            )
        )

    report = {
        "config": {
            "target": str(pipeline.target_path),
            "draft": str(pipeline.draft_path),
            "runtime": args.runtime,
            "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats,
            "greedy": True,
        },
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "measurements": [asdict(m) for m in measurements],
    }
    print(json.dumps(report, indent=2) if args.json else format_table(measurements))


def format_table(measurements: list[Measurement]) -> str:
    def number(value: float | None, digits: int = 2) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    lines = [
        "| prompt | method | γ | tokens/s | speedup | α | τ | lossless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in measurements:
        lines.append(
            f"| {m.prompt} | {m.method} | {m.num_draft_tokens or '–'} | {m.tokens_per_s:.2f} | "
            f"{number(m.speedup)}{'×' if m.speedup else ''} | {number(m.acceptance_rate)} | "
            f"{number(m.mean_accepted_tokens)} | {'yes' if m.lossless else 'NO'} |"
        )
    return "\n".join(lines)
