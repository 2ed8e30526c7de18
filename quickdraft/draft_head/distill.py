"""Distilling the draft model on the target's own conversations (``train-draft --model draft``).

The data is what ``collect`` wrote for the draft head: conversations the target wrote itself and, at each position,
the target's top-k next tokens with their log-probabilities. The draft model (a transformers causal LM) learns to
match that distribution (cross-entropy against the top-k, renormalized) through low-rank adapters on every
attention and MLP projection (LoRA); the adapters are merged into the weights at the end, so the result is an
ordinary model directory any runtime loads (``--draft DIR``). Agreement: how often the draft's top token is the
target's, on the answers of held-out shards: what drafting sees.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quickdraft.draft_head.data import FeatureData, StoredConversation, TokenBatch, groups
from quickdraft.draft_head.passes import check_positive, train_passes
from quickdraft.errors import ConfigError
from quickdraft.models.catalog import file_sha256

ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class DistillSettings:
    epochs: float = 1.0
    rank: int = 16
    alpha: float = 32.0
    tokens_per_batch: int = 1024
    learning_rate: float = 2e-4
    warmup_batches: int = 10
    held_out_shards: int = 1
    bf16: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive(self, ("epochs", "learning_rate"), ("rank", "tokens_per_batch"))


@dataclass(frozen=True)
class DistillEvaluation:
    tokens: int
    loss: float  # cross-entropy against the target's top-k, answer positions
    agreement: float  # the draft's top token is the target's, answer positions


class LoraLinear(nn.Module):
    """``base(x) + (alpha / rank) · x Aᵀ Bᵀ`` with the base frozen; B starts at zero, so training starts from
    the model as it was."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base, self.scale = base.requires_grad_(False), alpha / rank
        self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))  # [r, K]
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))  # [N, r]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """The base layer with the adapter added to its weight ``[N, K]``."""
        self.base.weight += (self.lora_b @ self.lora_a) * self.scale
        return self.base


def add_adapters(model: nn.Module, rank: int, alpha: float) -> list[nn.Parameter]:
    """Freeze ``model`` and wrap its projections in :class:`LoraLinear`; returns the trainable parameters."""
    model.requires_grad_(False)
    wrapped = [(parent, name) for parent in model.modules() for name in ADAPTED if hasattr(parent, name)]
    if not wrapped:
        raise ConfigError(f"the draft model has none of the projections adapters are added to ({', '.join(ADAPTED)})")
    for parent, name in wrapped:
        setattr(parent, name, LoraLinear(getattr(parent, name), rank, alpha))
    return [p for m in model.modules() if isinstance(m, LoraLinear) for p in (m.lora_a, m.lora_b)]


def merge_adapters(model: nn.Module) -> None:
    """Fold every adapter into its base weight, in place: the model has its original structure again."""
    for parent in list(model.modules()):
        for name in ADAPTED:
            module = getattr(parent, name, None)
            if isinstance(module, LoraLinear):
                setattr(parent, name, module.merged())


def batch_loss(model: nn.Module, batch: TokenBatch, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy against the target's top-k at ``mask``'s positions, whether the draft's top token is
    the target's there ``[M]``). Logits only at those positions: the 152k-token LM head is much of the work."""
    decoder = model.get_decoder()  # type: ignore[operator]
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.valid.long()).last_hidden_state  # [B, T, H]
    logits = model.get_output_embeddings()(hidden[mask]).float()  # type: ignore[operator]  # [M, V]
    target = torch.softmax(batch.label_logprobs[mask], dim=-1)  # [M, k]
    picked = torch.log_softmax(logits, dim=-1).gather(-1, batch.label_ids[mask])  # [M, k]
    agrees = logits.argmax(-1) == batch.label_ids[..., 0][mask]
    return -(target * picked.masked_fill(target == 0, 0)).sum(), agrees


@torch.no_grad()
def evaluate_draft(
    model: nn.Module, data: FeatureData, held_out: list[StoredConversation], settings: DistillSettings
) -> DistillEvaluation:
    model.eval()
    loss, agreed, counted = 0.0, 0, 0
    for group in groups(held_out, settings.tokens_per_batch, None):
        batch = data.token_batch(group)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            summed, agrees = batch_loss(model, batch, batch.answer)
        loss, agreed, counted = loss + float(summed), agreed + int(agrees.sum()), counted + len(agrees)
    return DistillEvaluation(counted, round(loss / max(counted, 1), 4), round(agreed / max(counted, 1), 4))


def distill(
    model: nn.Module,
    data: FeatureData,
    train: list[StoredConversation],
    held_out: list[StoredConversation],
    settings: DistillSettings,
    checkpoint: Path | None = None,
    progress: bool = True,
    on_eval: Callable[[dict[str, Any]], None] = print,
) -> list[dict[str, Any]]:
    """Train adapters on ``model`` (added here) and merge them; evaluates before, after each epoch and at the end.
    ``checkpoint``: the adapters and optimizer after each epoch, resumed from with the same settings."""
    torch.manual_seed(settings.seed)
    parameters = add_adapters(model, settings.rank, settings.alpha)

    def step(group: list[StoredConversation]) -> tuple[torch.Tensor, int]:
        batch = data.token_batch(group)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
            summed, _ = batch_loss(model, batch, batch.trained)
        tokens = int(batch.trained.sum())
        return summed / max(tokens, 1), tokens

    def evaluated() -> dict[str, Any] | None:
        if not held_out:
            return None
        evaluation = asdict(evaluate_draft(model, data, held_out, settings))
        model.train()
        return evaluation

    def restore(saved: dict[str, Any]) -> None:
        with torch.no_grad():
            for parameter, value in zip(parameters, saved["adapters"], strict=True):
                parameter.copy_(value)

    model.train()
    history = train_passes(
        parameters,
        settings,
        train,
        step,
        evaluated,
        lambda: {"adapters": [p.detach().clone() for p in parameters]},
        restore,
        checkpoint=checkpoint,
        progress=progress,
        on_eval=on_eval,
        description="distill",
        evaluate_first=bool(held_out),
    )
    merge_adapters(model)
    model.eval()
    return history


def check_output(out: Path) -> None:
    """Refuse to replace anything but an earlier distilled model (a directory with ``distill.json``)."""
    if out.exists() and not (out.is_dir() and ((out / "distill.json").is_file() or not any(out.iterdir()))):
        raise ConfigError(f"{out} exists and is not a distilled draft model: choose another --out")


def save_distilled(model: Any, tokenizer: Any, out: Path, made: dict[str, Any]) -> str:
    """Write the merged model (bfloat16 safetensors), its tokenizer and ``distill.json`` (how it was made) to
    ``out``; returns the weights' sha256. Written beside ``out`` first, then moved into place. ``model`` is left
    in bfloat16."""
    check_output(out)
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    sha256 = "".join(file_sha256(path, progress=False) for path in sorted(staging.glob("*.safetensors")))
    if len(sha256) > 64:  # several weight files: one digest over theirs
        sha256 = hashlib.sha256(sha256.encode()).hexdigest()
    (staging / "distill.json").write_text(json.dumps({"weights_sha256": sha256, **made}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return sha256
