"""The training loop both trainers share: the draft head (``train``) and the draft model's adapters (``distill``).

AdamW over the trainable parameters, a linear warm-up then cosine decay over every batch of ``settings.epochs``
passes, conversations shuffled into batches by a generator seeded with ``settings.seed``, gradients clipped to
norm 1, an evaluation after each pass, and after it a checkpoint of everything needed to resume (written
atomically; resumed from only when it was made with the same settings).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quickdraft.draft_head.data import StoredConversation, groups
from quickdraft.errors import ConfigError
from quickdraft.files import save_atomically
from quickdraft.progress import progress_bar

History = list[dict[str, Any]]


def check_positive(settings: Any, numbers: tuple[str, ...], counts: tuple[str, ...]) -> None:
    """A trainer's settings: each of ``numbers`` a finite number > 0 and each of ``counts`` >= 1, else a
    ``ConfigError`` naming the one at fault."""
    for name in numbers:
        if not (math.isfinite(value := getattr(settings, name)) and value > 0):
            raise ConfigError(f"{name} must be a finite number > 0, got {value}", name)
    for name in counts:
        if (value := getattr(settings, name)) < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}", name)


def train_passes(
    parameters: list[nn.Parameter],
    settings: Any,  # a frozen dataclass with epochs, tokens_per_batch, learning_rate, warmup_batches and seed
    train: list[StoredConversation],
    step: Callable[[list[StoredConversation]], tuple[torch.Tensor, int]],
    evaluate: Callable[[], dict[str, Any] | None],
    model_state: Callable[[], dict[str, Any]],
    restore_model: Callable[[dict[str, Any]], None],
    weight_decay: float = 0.0,
    checkpoint: Path | None = None,
    progress: bool = True,
    on_eval: Callable[[dict[str, Any]], None] = print,
    description: str = "train",
    evaluate_first: bool = False,
) -> History:
    """Train for ``settings.epochs`` passes; returns the history of evaluations (``evaluate_first``: one before
    training too, unless a checkpoint is resumed). ``step(group)``: a batch's loss to minimize and its number of
    positions.
    ``evaluate()``: a pass's evaluation (None: none). ``model_state()``: the model's entries of a checkpoint;
    ``restore_model(saved)``: loads them back."""
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=weight_decay)
    batches_per_epoch = sum(1 for _ in groups(train, settings.tokens_per_batch, None))  # counted, not read
    total = max(1, math.ceil(settings.epochs * batches_per_epoch))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda i: min(1.0, (i + 1) / settings.warmup_batches) * 0.5 * (1 + math.cos(math.pi * min(i, total) / total)),
    )
    done, history = 0, []
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=False)
        if saved["settings"] == asdict(settings):
            restore_model(saved)
            optimizer.load_state_dict(saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            generator.set_state(saved["generator"])
            done, history = saved["done"], saved["history"]
    if evaluate_first and not history:
        history.append({"batches": 0, "seconds": 0.0, "eval": evaluate()})
        on_eval(history[-1])
    started = time.perf_counter()
    with progress_bar(total=total, initial=done, desc=description, unit="batch", disable=not progress) as bar:
        while done < total:
            tokens = 0
            for group in groups(train, settings.tokens_per_batch, generator):
                if done >= total:
                    break
                loss, num_tokens = step(group)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(parameters, 1.0)
                optimizer.step()
                schedule.step()
                done, tokens = done + 1, tokens + num_tokens
                bar.update(1)
                speed = tokens / (time.perf_counter() - started)
                bar.set_postfix(loss=f"{float(loss.detach()):.3f}", tok_s=f"{speed:.0f}", refresh=False)
            record = {"batches": done, "seconds": round(time.perf_counter() - started, 1), "eval": evaluate()}
            history.append(record)
            on_eval(record)
            if checkpoint is not None:  # atomically: a run stopped while saving resumes from the last one
                state = {
                    "settings": asdict(settings),
                    **model_state(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(),
                    "generator": generator.get_state(),
                    "done": done,
                    "history": history,
                }
                save_atomically(checkpoint, lambda temporary: torch.save(state, temporary))  # noqa: B023
            started = time.perf_counter()
    return history
