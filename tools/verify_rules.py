"""How many drafts unseeded sampling accepts under block verification and under Leviathan's token-by-token rule,
on real prompts with the default pair, through the engine.

    .venv/bin/python tools/verify_rules.py [QUESTIONS.jsonl] [--per-category N] [--tokens N] [--runs R]
        [--temperatures 0.7,1.0] [--methods draft-model:4,hybrid+goodput] [--out FILE.json]

For each sampled Spec-Bench question (first turn, the bench's seed-0 sample), temperature, method and run, the
request is decoded once with each rule (``rules.block_verify`` as the engine uses it, and ``rejection_sample``
put in its place), unseeded, so the two answers are different samples of the same law. Prints, per temperature
and method, the drafts accepted per drafting step and the tokens committed per target forward, pooled over
questions and runs, with the ratio block ÷ token. The numbers count drafts, not time.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

import quickdraft.lossless.rules as rules
from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.lossless.verify import block_verify, rejection_sample

RULES = {"block": block_verify, "token": rejection_sample}


def decode(pipeline: Pipeline, prompt: list[int], method: str, temperature: float, tokens: int) -> dict[str, int]:
    """One unseeded answer: drafts proposed and accepted, drafting steps, tokens and target forwards."""
    drafter, _, policy = method.partition("+")
    drafter, _, gamma = drafter.partition(":")
    config = GenerationConfig(
        max_new_tokens=tokens,
        sampling=SamplingParams(temperature=temperature),
        policy=policy or f"fixed:{gamma or 4}",
    )
    stats = pipeline.generate(prompt, config, drafter=drafter).stats
    return {
        "proposed": stats.draft_tokens_proposed,
        "accepted": stats.draft_tokens_accepted,
        "drafting_steps": sum(1 for proposed in stats.proposed_per_step if proposed > 0),
        "new_tokens": stats.new_tokens,
        "target_forwards": stats.target_forwards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=96, help="new tokens per answer (default 96)")
    parser.add_argument("--runs", type=int, default=3, help="answers per question, rule and temperature (default 3)")
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--methods", default="draft-model:4,hybrid+goodput")
    parser.add_argument("--out", type=Path, help="write the totals as JSON here")
    args = parser.parse_args()
    torch.manual_seed(0)
    pipeline = Pipeline.load()
    questions = sample_questions(load_questions(args.questions), args.per_category, 0)
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for temperature in map(float, args.temperatures.split(",")):
        for method in args.methods.split(","):
            for run in range(args.runs):
                for prompt in prompts:
                    for name, rule in RULES.items():  # alternated, so drift in the machine hits both alike
                        rules.block_verify = rule  # type: ignore[assignment]
                        counts = decode(pipeline, prompt, method, temperature, args.tokens)
                        for key, value in counts.items():
                            totals[f"T{temperature} {method} {name}"][key] += value
                print(f"# T {temperature} {method}: run {run + 1}/{args.runs} done", flush=True)
            block, token = (totals[f"T{temperature} {method} {name}"] for name in ("block", "token"))
            per_step = [t["accepted"] / max(1, t["drafting_steps"]) for t in (block, token)]
            per_forward = [t["new_tokens"] / max(1, t["target_forwards"]) for t in (block, token)]
            print(
                f"T {temperature} {method}: accepted per drafting step block {per_step[0]:.3f} token {per_step[1]:.3f} "
                f"({per_step[0] / per_step[1]:.3f}x); tokens per forward block {per_forward[0]:.3f} "
                f"token {per_forward[1]:.3f} ({per_forward[0] / per_forward[1]:.3f}x)",
                flush=True,
            )
    rules.block_verify = block_verify
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        arguments = {key: str(value) for key, value in vars(args).items()}
        args.out.write_text(json.dumps({"args": arguments, "totals": totals}))


if __name__ == "__main__":
    main()
