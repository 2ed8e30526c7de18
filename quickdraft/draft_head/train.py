"""Training the draft head on collected data: match the target's next-token distribution at every drafting depth.

Loss at a position and unrolled step j: cross-entropy of the head's distribution against the target's top-k
(renormalized over the tokens in the head's vocabulary), weighted 0.8^j (EAGLE-3). Agreement: how often the
head's top token is the target's, on held-out shards, per step; on answer positions, what drafting sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from quickdraft.draft_head.data import Batch, FeatureData, StoredConversation, groups
from quickdraft.draft_head.model import DraftHead, HeadConfig
from quickdraft.draft_head.passes import check_positive, train_passes

STEP_WEIGHT = 0.8


@dataclass(frozen=True)
class TrainSettings:
    epochs: float = 2.5
    steps: int = 2  # drafting depths unrolled (training-time test)
    tokens_per_batch: int = 1024  # small batches, many steps: learned faster here (docs/draft-head.md)
    learning_rate: float = 1e-3  # 3e-4 learned slower, 3e-3 diverged
    warmup_batches: int = 20
    weight_decay: float = 0.0
    intermediate_size: int = 4096
    vocabulary_size: int = 32768
    held_out_shards: int = 1
    bf16: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(self, ("epochs", "learning_rate"), ("steps", "tokens_per_batch", "intermediate_size",
                                                           "vocabulary_size"))  # fmt: skip


@dataclass(frozen=True)
class Evaluation:
    tokens: int
    loss: float
    agreement: tuple[float, ...]  # per unrolled step: the head's top token is the target's, answer positions
    agreement_all: float  # step 0 over every position


def choose_vocabulary(
    data: FeatureData, shards: list[int], size: int, target_vocab_size: int
) -> tuple[torch.Tensor, float]:
    """The ``size`` tokens the training shards use most (ties by id), and the share of their tokens it covers."""
    counts = data.token_counts(shards)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = [token for token, _ in ranked[:size]]
    if len(chosen) < size:  # rarely seen tokens: fill with the lowest ids not yet chosen
        seen = set(chosen)
        chosen += [t for t in range(target_vocab_size) if t not in seen][: size - len(chosen)]
    total = sum(counts.values())
    coverage = sum(counts[t] for t in chosen) / total if total else 0.0
    return torch.tensor(sorted(chosen)), coverage


def step_loss(
    head: DraftHead, output: torch.Tensor, batch: Batch, step: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the outputs ``[B, T, H]`` of unrolled step ``step``: (summed loss, mask ``[B, T]`` of the positions
    trained at this step, whether the head's top token is the target's ``[M]`` at those positions). Logits are
    computed at those positions only: the LM head over 32k tokens is most of a step's work."""
    mask = batch.trained.clone()
    mask[:, :step] = False
    index = head.draft_index[batch.label_ids]  # [B, T, k] head index or -1
    logprobs = batch.label_logprobs.masked_fill(index < 0, -torch.inf)
    mask &= torch.isfinite(logprobs).any(-1)  # the target's top-k has a token the head can draft
    target = torch.softmax(logprobs[mask], dim=-1)  # [M, k]
    logits = head.logits(output[mask])  # [M, Vd]
    predicted = torch.log_softmax(logits.float(), dim=-1)
    picked = predicted.gather(-1, index[mask].clamp(min=0))  # [M, k]
    agrees = head.vocabulary[logits.argmax(-1)] == batch.label_ids[..., 0][mask]  # [M]
    return -(target * picked.masked_fill(target == 0, 0)).sum(), mask, agrees


def build_head(
    data: FeatureData,
    target_config: Any,
    lm_head_rows: Callable[[torch.Tensor], torch.Tensor],
    vocabulary: torch.Tensor,
    settings: TrainSettings,
) -> DraftHead:
    """A new head for the target (``target_config``: its DecoderConfig) reading ``data``'s features."""
    num_features = data.feature_size // target_config.hidden_size
    config = HeadConfig.for_target(target_config, settings.intermediate_size, num_features, len(vocabulary))
    torch.manual_seed(settings.seed)
    return DraftHead(config, vocabulary, lm_head_rows(vocabulary))


@torch.no_grad()
def evaluate(
    head: DraftHead,
    data: FeatureData,
    held_out: list[StoredConversation],
    embedding: torch.Tensor,
    settings: TrainSettings,
) -> Evaluation:
    head.eval()
    loss, tokens = 0.0, 0
    agreed, counted = [0] * settings.steps, [0] * settings.steps
    agreed_all = counted_all = 0
    for batch in map(data.batch, groups(held_out, settings.tokens_per_batch, None)):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            outputs = head.unroll(batch.features, embedding[batch.next_tokens], batch.valid, settings.steps)
            for step, output in enumerate(outputs):
                step_sum, mask, agrees = step_loss(head, output, batch, step)
                if step == 0:
                    loss, tokens = loss + float(step_sum), tokens + int(mask.sum())
                    agreed_all, counted_all = agreed_all + int(agrees.sum()), counted_all + len(agrees)
                answer = batch.answer[mask]  # [M]
                agreed[step] += int(agrees[answer].sum())
                counted[step] += int(answer.sum())
    head.train()
    return Evaluation(
        tokens,
        loss / max(tokens, 1),
        tuple(round(a / max(c, 1), 4) for a, c in zip(agreed, counted, strict=True)),
        round(agreed_all / max(counted_all, 1), 4),
    )


def train_head(
    head: DraftHead,
    data: FeatureData,
    train: list[StoredConversation],
    held_out: list[StoredConversation],
    embedding: torch.Tensor,
    settings: TrainSettings,
    checkpoint: Path | None = None,
    progress: bool = True,
    on_eval: Callable[[dict[str, Any]], None] = print,
) -> list[dict[str, Any]]:
    """Train ``head`` in place; evaluates after each epoch (and at the end). ``checkpoint``: saved after each
    epoch and resumed from when it exists with the same settings."""

    def step(group: list[StoredConversation]) -> tuple[torch.Tensor, int]:
        batch = data.batch(group)
        losses, count = [], 0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            outputs = head.unroll(batch.features, embedding[batch.next_tokens], batch.valid, settings.steps)
            for depth, output in enumerate(outputs):
                step_sum, mask, _ = step_loss(head, output, batch, depth)
                losses.append(STEP_WEIGHT**depth * step_sum)
                count = max(count, int(mask.sum()))
        return torch.stack(losses).sum() / max(count, 1), int(batch.trained.sum())

    return train_passes(
        [p for p in head.parameters() if p.requires_grad],
        settings,
        train,
        step,
        lambda: asdict(evaluate(head, data, held_out, embedding, settings)) if held_out else None,
        lambda: {"head": head.state_dict()},
        lambda saved: head.load_state_dict(saved["head"]),
        weight_decay=settings.weight_decay,
        checkpoint=checkpoint,
        progress=progress,
        on_eval=on_eval,
    )
