"""``quickdraft train-acceptance-head``: fit SpecDec++'s acceptance head from target/draft rollouts.

Each question's first turn is decoded greedily with the draft model proposing ``--block`` tokens
per step. Every drafted token up to and including the first rejection of its block becomes an
example: the draft's hidden state and distribution summaries, labelled accepted or rejected
(tokens after a rejection are conditioned on a wrong prefix and are dropped). Questions are split
(seeded) into training and held-out sets; a logistic head is fitted on the first and its
calibration (Brier score, expected calibration error, reliability bins) reported on the second.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

import torch
from tqdm.auto import tqdm

from quickdraft.acceptance_head import WEIGHT_DECAYS, calibration, default_head_path, fit_head, head_features
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.policy import UNKNOWN_STATE, DraftStep, Policy, StepState


class RecordingPolicy(Policy):
    """Always drafts ``block`` tokens; keeps (features, label) of every draft token whose label is known."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.pending: list[torch.Tensor] = []  # features of this step's drafts
        self.features: list[torch.Tensor] = []
        self.labels: list[int] = []

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        self.pending = []
        return self.block

    def keep_drafting(self, step: DraftStep) -> bool:
        if step.hidden is None:
            raise ConfigError("the draft runtime gives no hidden states; an acceptance head cannot be trained")
        self.pending.append(head_features(step.hidden, step.logits)[0])
        return True

    def observe(self, proposed: int, accepted: int) -> None:
        known = min(proposed, accepted + 1)  # the accepted ones and the first rejected one
        self.features += self.pending[:known]
        self.labels += [1] * accepted + [0] * (known - accepted)


def add_train_command(commands: Any) -> None:
    from quickdraft.cli import add_model_arguments

    train = commands.add_parser(
        "train-acceptance-head",
        help="fit the SpecDec++ acceptance head (for --policy specdec++) from target/draft rollouts",
        description=__doc__,
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
    train.add_argument("--holdout", type=float, default=0.25, metavar="F", help="held-out share of questions")
    train.add_argument("--seed", type=int, default=0, help="seed of the sample and the split (default 0)")
    add_model_arguments(train)
    train.add_argument("--json", action="store_true", help="print the report as JSON")
    train.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> None:
    from pathlib import Path

    from quickdraft.api import Pipeline
    from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
    from quickdraft.models import DEFAULT_DRAFT

    if not 0 < args.holdout < 1 or args.block < 1:
        raise ConfigError("--holdout must be in (0, 1) and --block >= 1")
    path = Path(args.questions) if args.questions else default_questions_path()
    if path is None:
        raise ConfigError("no question file: pass --questions PATH")
    questions = sample_questions(load_questions(path), args.per_category, args.seed)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    pipeline = Pipeline.load(target=args.target, draft=args.draft or DEFAULT_DRAFT, runtime=args.runtime)
    engine = pipeline.engine("draft-model")
    shuffled = list(questions)
    random.Random(args.seed).shuffle(shuffled)
    num_holdout = max(1, round(args.holdout * len(shuffled)))
    splits: dict[str, tuple[list[torch.Tensor], list[int]]] = {"train": ([], []), "holdout": ([], [])}
    for index, question in enumerate(tqdm(shuffled, desc="rollouts", file=sys.stderr)):
        recorder = RecordingPolicy(args.block)
        prompt_ids = pipeline.encode(question.turns[0], chat=question.chat)
        engine.generate(prompt_ids, config, policy=recorder)
        features, labels = splits["holdout" if index < num_holdout else "train"]
        features += recorder.features
        labels += recorder.labels
    tensors = {name: (torch.stack(f), torch.tensor(y)) for name, (f, y) in splits.items() if f}
    if set(tensors) != {"train", "holdout"}:
        raise ConfigError("too few draft tokens to train and evaluate a head; use more questions")
    head = fit_head(*tensors["train"])
    out = Path(args.out) if args.out else default_head_path(pipeline.draft_path)
    report = {
        "out": str(out),
        "draft": str(pipeline.draft_path),
        "target": str(pipeline.target_path),
        "questions": str(path),
        "n_questions": {"train": len(shuffled) - num_holdout, "holdout": num_holdout},
        "weight_decay": head.metadata["weight_decay"],
        "train": calibration(head, *tensors["train"]),
        "holdout": calibration(head, *tensors["holdout"]),
    }
    head.metadata = {key: report[key] for key in ("draft", "target", "questions", "n_questions", "weight_decay")}
    head.metadata["holdout"] = {k: v for k, v in report["holdout"].items() if k != "reliability"}
    head.save(out)
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
    print(f"wrote {out}")
