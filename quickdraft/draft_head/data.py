"""Collected shards (``collect``) as training batches: for the draft head (features) and for distilling the draft
model (tokens and the target's labels only)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.draft_head.collect import read_manifest, shard_path
from quickdraft.errors import ConfigError


@dataclass(frozen=True)
class StoredConversation:
    """Where one collected conversation lies in its shard (the one being written is collect.Conversation)."""

    shard: int
    start: int  # offset in its shard's token rows
    length: int
    answer_start: int


@dataclass
class Batch:
    features: torch.Tensor  # [B, T, C·H] float32
    next_tokens: torch.Tensor  # [B, T] the token at p + 1 (0 past the end)
    label_ids: torch.Tensor  # [B, T, k] the target's top-k at p + 1, i.e. for the token at p + 2
    label_logprobs: torch.Tensor  # [B, T, k]
    valid: torch.Tensor  # [B, T] real positions
    trained: torch.Tensor  # [B, T] positions with a label (p + 1 < length)
    answer: torch.Tensor  # [B, T] positions whose predicted token (p + 2) is in the answer


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, T] the conversation (0 past the end)
    label_ids: torch.Tensor  # [B, T, k] the target's top-k after p, i.e. for the token at p + 1
    label_logprobs: torch.Tensor  # [B, T, k]
    valid: torch.Tensor  # [B, T] real positions
    trained: torch.Tensor  # [B, T] positions with a next token in the conversation (p + 1 < length)
    answer: torch.Tensor  # [B, T] positions whose next token is in the answer


class FeatureData:
    """The shards of a collection directory, opened memory-mapped."""

    def __init__(self, directory: Path) -> None:
        manifest = read_manifest(directory)
        if manifest is None:
            raise ConfigError(f"{directory} holds no collected data (no collection.json): run train-draft collect")
        self.directory, self.key = directory, manifest["key"]
        self.shards: dict[int, dict[str, torch.Tensor]] = {}
        for name in sorted(manifest["shards"], key=int):
            path = shard_path(directory, int(name))
            if path.exists():
                try:
                    self.shards[int(name)] = torch.load(path, mmap=True, weights_only=True)
                except (RuntimeError, OSError, EOFError) as error:  # a shard cut short, or not a shard
                    raise ConfigError(f"the shard {path} is damaged ({error}): delete it to collect it again") from None
        if not self.shards:
            raise ConfigError(f"{directory} holds no finished shard yet")
        self.conversations: list[StoredConversation] = []
        for index, shard in self.shards.items():
            start = 0
            for length, answer_start in zip(shard["lengths"].tolist(), shard["answer_start"].tolist(), strict=True):
                self.conversations.append(StoredConversation(index, start, length, answer_start))
                start += length

    @property
    def feature_size(self) -> int:
        return int(next(iter(self.shards.values()))["features"].shape[1])

    def token_counts(self, shards: Sequence[int]) -> Counter[int]:
        return Counter(token for index in shards for token in self.shards[index]["tokens"].tolist())

    def split(self, held_out_shards: int) -> tuple[list[StoredConversation], list[StoredConversation]]:
        """(training, held-out) conversations: the last ``held_out_shards`` shards are held out."""
        indices = sorted(self.shards)
        if held_out_shards >= len(indices):
            raise ConfigError(f"{len(indices)} shards collected; hold out fewer than that ({held_out_shards} asked)")
        held = set(indices[len(indices) - held_out_shards :]) if held_out_shards else set()
        train = [c for c in self.conversations if c.shard not in held]
        return train, [c for c in self.conversations if c.shard in held]

    def batch(self, group: Sequence[StoredConversation]) -> Batch:
        """``group`` (one of :func:`groups`) as the draft head reads it: padded to the longest conversation."""
        size, length = len(group), max(c.length for c in group)
        features = torch.zeros(size, length, self.feature_size)
        next_tokens = torch.zeros(size, length, dtype=torch.long)
        for row, c in enumerate(group):
            shard = self.shards[c.shard]
            features[row, : c.length] = shard["features"][c.start : c.start + c.length].float()
            next_tokens[row, : c.length - 1] = shard["tokens"][c.start + 1 : c.start + c.length].long()
        return Batch(features, next_tokens, *self._labels(group, shift=1))

    def token_batch(self, group: Sequence[StoredConversation]) -> TokenBatch:
        """``group`` as a language model reads it: its tokens and the target's top-k after each one."""
        input_ids = torch.zeros(len(group), max(c.length for c in group), dtype=torch.long)
        for row, c in enumerate(group):
            input_ids[row, : c.length] = self.shards[c.shard]["tokens"][c.start : c.start + c.length].long()
        return TokenBatch(input_ids, *self._labels(group, shift=0))

    def _labels(self, group: Sequence[StoredConversation], shift: int) -> tuple[torch.Tensor, ...]:
        """What both batches hold, padded to the longest conversation: ``label_ids`` and ``label_logprobs`` (the
        target's top-k at p + ``shift``), and the masks ``valid``, ``trained`` and ``answer``."""
        size, length = len(group), max(c.length for c in group)
        k = int(next(iter(self.shards.values()))["label_ids"].shape[1])
        label_ids = torch.zeros(size, length, k, dtype=torch.long)
        label_logprobs = torch.full((size, length, k), -torch.inf)
        valid = torch.zeros(size, length, dtype=torch.bool)
        trained, answer = torch.zeros_like(valid), torch.zeros_like(valid)
        for row, c in enumerate(group):
            shard, rows = self.shards[c.shard], slice(c.start + shift, c.start + c.length)
            label_ids[row, : c.length - shift] = shard["label_ids"][rows].long()
            label_logprobs[row, : c.length - shift] = shard["label_logprobs"][rows].float()
            valid[row, : c.length] = True
            trained[row, : c.length - 1] = True  # a next token in the conversation
            answer[row, max(0, c.answer_start - 1 - shift) : c.length - 1] = True
        return label_ids, label_logprobs, valid, trained, answer


def groups(
    conversations: Sequence[StoredConversation], tokens_per_batch: int, generator: torch.Generator | None
) -> Iterator[list[StoredConversation]]:
    """Batches of whole conversations, about ``tokens_per_batch`` positions each (padded to the longest), shuffled by
    ``generator`` (None: in order), without reading their data (:meth:`FeatureData.batch` reads them)."""
    order = torch.randperm(len(conversations), generator=generator).tolist() if generator else range(len(conversations))
    group: list[StoredConversation] = []
    for i in order:
        group.append(conversations[i])
        if max(c.length for c in group) * len(group) >= tokens_per_batch:
            yield group
            group = []
    if group:
        yield group
