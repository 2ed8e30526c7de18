"""Fit SpecDec++'s acceptance head from target/draft rollouts (``quickdraft train-acceptance-head``).

The procedure is TRAIN_DOC's, what the command's ``--help`` shows (:mod:`quickdraft.cli.train`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError
from quickdraft.policies import UNKNOWN_STATE, DraftStep, Policy, StepOutcome, StepState
from quickdraft.policies.acceptance_head import calibration, default_head_path, fit_head, head_features
from quickdraft.progress import progress_bar


class RecordingPolicy(Policy):
    """Always drafts ``block`` tokens; keeps (features, label) of every draft token whose label is known."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.pending: list[torch.Tensor] = []  # features of this step's drafts
        self.features: list[torch.Tensor] = []
        self.labels: list[int] = []

    def choose(self, state: StepState = UNKNOWN_STATE) -> int:
        return self.block

    def keep_drafting(self, step: DraftStep) -> bool:
        if step.hidden is None:
            raise ConfigError("the draft runtime gives no hidden states; an acceptance head cannot be trained")
        if step.num_drafted == 1:  # a new block
            self.pending = []
        self.pending.append(head_features(step.hidden, step.logits)[0])
        return True

    def observe(self, outcome: StepOutcome) -> None:
        proposed, accepted = outcome.num_judged, outcome.num_accepted
        known = min(proposed, accepted + 1)  # the accepted ones and the first rejected one
        self.features += self.pending[:known]
        self.labels += [1] * accepted + [0] * (known - accepted)


def check_training_settings(block: int, holdout: float, max_new_tokens: int = 1) -> None:
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}", "max_new_tokens")
    if not 0 < holdout < 1:  # NaN too
        raise ConfigError(f"--holdout must be in (0, 1), got {holdout:g}")
    if block < 1:
        raise ConfigError(f"--block must be >= 1, got {block}")


def train_acceptance_head(
    pipeline: Any,
    prompts: list[list[int]],
    *,
    block: int,
    max_new_tokens: int,
    holdout: float,
    seed: int,
    out: Path | None = None,
) -> dict[str, Any]:
    """Roll out every prompt (token ids) with ``block`` drafts per step, fit a head on the training split and
    save it to ``out`` (default: where generate and bench look for it); the report of both splits."""
    check_training_settings(block, holdout)
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    shuffled = list(prompts)
    random.Random(seed).shuffle(shuffled)
    num_holdout = max(1, round(holdout * len(shuffled)))
    splits: dict[str, tuple[list[torch.Tensor], list[int]]] = {"train": ([], []), "holdout": ([], [])}
    for index, prompt_ids in enumerate(progress_bar(shuffled, desc="rollouts")):
        recorder = RecordingPolicy(block)
        pipeline.generate(prompt_ids, config, drafter="draft-model", policy=recorder)
        features, labels = splits["holdout" if index < num_holdout else "train"]
        features += recorder.features
        labels += recorder.labels
    tensors = {name: (torch.stack(f), torch.tensor(y)) for name, (f, y) in splits.items() if f}
    if set(tensors) != {"train", "holdout"}:
        raise ConfigError("too few draft tokens to train and evaluate a head; use more questions")
    head = fit_head(*tensors["train"])
    out = out or default_head_path(pipeline.draft_path)
    report = {
        "out": str(out),
        "draft": str(pipeline.draft_path),
        "target": str(pipeline.target_path),
        "n_questions": {"train": len(shuffled) - num_holdout, "holdout": num_holdout},
        "weight_decay": head.metadata["weight_decay"],
        "train": calibration(head, *tensors["train"]),
        "holdout": calibration(head, *tensors["holdout"]),
    }
    head.metadata = {key: report[key] for key in ("draft", "target", "n_questions", "weight_decay")}
    head.metadata["holdout"] = {k: v for k, v in report["holdout"].items() if k != "reliability"}
    head.save(out)
    return report
