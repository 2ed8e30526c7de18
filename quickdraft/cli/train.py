"""``quickdraft train-acceptance-head``: arguments and report (the training:
:mod:`quickdraft.policies.train_acceptance`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from quickdraft.cli.common import add_chat_template_argument, add_model_arguments, check_output_file, load_models
from quickdraft.errors import ConfigError

TRAIN_DOC = """``quickdraft train-acceptance-head``: fit SpecDec++'s acceptance head from target/draft rollouts.

Each question's first turn is decoded greedily with the draft model proposing ``--block`` tokens
per step. Every drafted token up to and including the first rejection of its block becomes an
example: the draft's hidden state and distribution summaries, labelled accepted or rejected
(tokens after a rejection are conditioned on a wrong prefix and are dropped). Questions are split
(seeded) into training and held-out sets; a logistic head is fitted on the first and its
calibration (Brier score, expected calibration error, reliability bins) reported on the second.
"""


def add_command(commands: Any, name: str, summary: str) -> None:
    train = commands.add_parser(
        name,
        help=summary,
        description=TRAIN_DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--questions", metavar="PATH", help="question file, as for bench (default: Spec-Bench)")
    train.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the head (default: $QUICKDRAFT_CACHE/acceptance-heads/<draft>.safetensors, "
        "where generate and bench look for it)",
    )
    train.add_argument("--per-category", type=int, default=4, metavar="N", help="questions per category (default 4)")
    train.add_argument("--max-new-tokens", type=int, default=96, metavar="N", help="tokens per rollout (default 96)")
    train.add_argument("--block", type=int, default=8, metavar="K", help="drafts per step in rollouts (default 8)")
    train.add_argument("--holdout", type=float, default=0.25, metavar="F", help="held-out share of questions (0.25)")
    train.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the sample and the split (default 0)")
    add_model_arguments(train)
    add_chat_template_argument(train)  # the rollouts answer the questions as chats
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    train.set_defaults(handler=run)


def run(args: argparse.Namespace) -> None:
    from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
    from quickdraft.models import DEFAULT_DRAFT
    from quickdraft.policies.acceptance_head import WEIGHT_DECAYS
    from quickdraft.policies.train_acceptance import check_training_settings, train_acceptance_head

    check_training_settings(args.block, args.holdout, args.max_new_tokens)  # before any model is loaded
    if args.draft_head is not None:
        print("quickdraft: note: --draft-head is not used: the rollouts draft with the draft model", file=sys.stderr)
    if args.out:
        check_output_file(Path(args.out))  # before the rollouts, so a trained head is never lost
    path = Path(args.questions) if args.questions else default_questions_path()
    if path is None:
        raise ConfigError("no question file: pass --questions PATH")
    questions = sample_questions(load_questions(path), args.per_category, args.seed)
    draft = args.draft or DEFAULT_DRAFT
    pipeline = load_models(args, draft)
    kwargs = args.chat_template_kwargs
    prompts = [pipeline.encode(question.turns[0], question.chat, kwargs) for question in questions]
    report = train_acceptance_head(
        pipeline,
        prompts,
        block=args.block,
        max_new_tokens=args.max_new_tokens,
        holdout=args.holdout,
        seed=args.seed,
        out=Path(args.out) if args.out else None,
    )
    report["questions"] = str(path)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for split in ("train", "holdout"):
        numbers = report[split]
        print(
            f"{split}: {numbers['n']} draft tokens, accepted {numbers['base_rate']:.2f}, "
            f"Brier {numbers['brier']:.3f}, ECE {numbers['ece']:.3f}, accuracy {numbers['accuracy']:.3f}"
        )
    tried = ", ".join(map(str, WEIGHT_DECAYS))
    print(f"L2 weight decay {report['weight_decay']:g} (the best of {tried} on held-back training tokens)")
    print("held-out reliability (predicted -> observed acceptance):")
    for row in report["holdout"]["reliability"]:
        low, high = row["bin"]
        print(f"  [{low:.1f}, {high:.1f}) n={row['n']:5d}  {row['predicted']:.2f} -> {row['observed']:.2f}")
    print(f"wrote {report['out']}")
