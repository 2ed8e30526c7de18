"""Training data for a draft head: conversations the target writes itself, with its features and its predictions.

Magpie-style self-synthesis: each conversation starts from the chat template's opening of a user turn (plus an
opener from :data:`OPENERS`, or none); the target writes the user's request, then its own answer. Many
conversations decode side by side in one batched forward (:meth:`Runtime.forward_batch_with_features`), so the
target writes at about its prompt-reading speed, and every forward also gives what the head learns from:

- ``features [N, C·H]``: the hidden states after the feature layers at every position (float16);
- ``label_ids``, ``label_logprobs [N, k]``: the target's top-k next tokens there and their log-probabilities.

Rules: position p's features and labels come from the forward that read token p, the same bits the target gives
when it verifies there (the native runtime's rows do not depend on the batch). The data is written in shards of
whole conversations, atomically; conversation n draws from a generator seeded by (seed, n), and a stopped
collection resumes with the missing shards and new conversations. No benchmark question is read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from quickdraft.draft_head.starters import OPENERS
from quickdraft.errors import ConfigError
from quickdraft.files import save_atomically, write_atomically
from quickdraft.lossless.sampling import SamplingParams, logits_to_probs, sample
from quickdraft.progress import progress_bar, redraw
from quickdraft.prompts import chat_closing, chat_prefix
from quickdraft.runtime.base import BatchRow, KVCache, Runtime

MANIFEST = "collection.json"
SAMPLED_FROM = 64  # tokens are drawn from the target's top 64 (then top-p): a sort of 152k logits is slow
DATA_VERSION = 1


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers: after layer 2, the middle one and the fourth from the top."""
    return tuple(sorted({min(2, num_layers), max(1, num_layers // 2), max(1, num_layers - 3)}))


@dataclass(frozen=True)
class CollectSettings:
    """How conversations are synthesized. Temperatures of 0 decode greedily (every conversation with the same
    opener would then be the same: keep the user's temperature above 0)."""

    sequences_per_shard: int = 128
    batch_size: int = 32  # conversations decoded side by side
    max_user_tokens: int = 256  # a longer user turn is cut there, and answered
    max_answer_tokens: int = 320
    user_temperature: float = 1.0
    answer_temperature: float = 0.7
    top_p: float = 0.95
    label_top_k: int = 8
    seed: int = 0
    feature_layers: tuple[int, ...] = ()  # empty: default_feature_layers

    def __post_init__(self) -> None:
        for name in ("sequences_per_shard", "batch_size", "max_user_tokens", "max_answer_tokens", "label_top_k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", name)
        if self.user_temperature <= 0:
            raise ConfigError("the user turn's temperature must be > 0, or every conversation is the same")
        SamplingParams(self.answer_temperature, top_p=self.top_p, seed=self.seed)  # validates, the seed's range too


class Phase(Enum):
    USER = "user"  # the target writes the user's request
    ANSWER = "answer"  # the target answers it


@dataclass(eq=False)
class Conversation:
    """One conversation being written in a cache of its own."""

    cache: KVCache
    pending: list[int]  # tokens to read at the next forward
    generator: torch.Generator  # its own draws: seeded by (seed, its number)
    phase: Phase = Phase.USER
    tokens: list[int] = field(default_factory=list)  # every token read so far
    features: list[torch.Tensor] = field(default_factory=list)  # [K, C·H] float16 per forward
    label_ids: list[torch.Tensor] = field(default_factory=list)  # [K, k] int32
    label_logprobs: list[torch.Tensor] = field(default_factory=list)  # [K, k] float16
    user_tokens: int = 0
    answer_start: int = 0  # where the answer's first token is read
    answer_tokens: int = 0


@dataclass(frozen=True)
class ShardReport:
    index: int
    sequences: int
    tokens: int
    answer_tokens: int
    seconds: float


def shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.pt"


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The collection's manifest (None: there is none yet); ``ConfigError`` for a damaged one, or for shards left
    without one."""
    path = directory / MANIFEST
    if not path.exists():
        if any(directory.glob("shard-*")):
            raise ConfigError(f"{directory} holds shards but no {MANIFEST}: delete it or give another --data")
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not (isinstance(manifest, dict) and isinstance(manifest["shards"], dict) and "key" in manifest):
            raise ValueError("not a collection manifest")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} is damaged ({error}): delete {directory} or give another --data") from None
    return manifest


class Collector:
    """Writes shards of self-synthesized conversations with the target's features and labels into a directory."""

    def __init__(
        self, target: Runtime, tokenizer: Any, eos_token_ids: Iterable[int], target_name: str, settings: CollectSettings
    ) -> None:
        if not target.provides_features:
            raise ConfigError(
                f"the {target.name} runtime does not expose its layers' hidden states: use the native runtime",
                "runtime",
            )
        self.target, self.tokenizer, self.settings = target, tokenizer, settings
        self.layers = settings.feature_layers or default_feature_layers(target.num_layers)
        self.opening = chat_prefix(tokenizer)  # the system prompt and the user turn's opening
        self.closing = chat_closing(tokenizer)  # the user turn's end and the assistant turn's opening
        if not self.opening or not self.closing:
            has_template = bool(getattr(tokenizer, "chat_template", None))
            raise ConfigError(
                "self-synthesis needs a chat template that marks where a user turn opens and closes; this model's "
                "template does not"
                if has_template
                else "self-synthesis needs a model with a chat template"
            )
        # A turn ends at the end-of-sequence token or the template's end-of-turn token (the closing's first); a
        # turn-opening token (the opening's last special token, e.g. <|im_start|>) ends one too.
        self.stop_ids = set(eos_token_ids) | {self.closing[0]}
        special = {token for token, added in getattr(tokenizer, "added_tokens_decoder", {}).items() if added.special}
        self.stop_ids |= {token for token in self.opening if token in special}
        self.openers = [list(tokenizer(text, add_special_tokens=False).input_ids) if text else [] for text in OPENERS]
        longest = len(self.opening) + max(map(len, self.openers)) + settings.max_user_tokens + len(self.closing)
        longest += settings.max_answer_tokens
        if longest > target.max_context:  # checked before any forward: a conversation never outgrows its cache
            raise ConfigError(
                f"a conversation may run to {longest} positions (its template, {settings.max_user_tokens} user and "
                f"{settings.max_answer_tokens} answer tokens), and the target holds {target.max_context}: lower "
                "--max-answer-tokens or raise the context",
                "max_context",
            )
        self.key = {
            "version": DATA_VERSION,
            "target": target_name,
            "feature_layers": list(self.layers),
            "settings": {k: v for k, v in asdict(settings).items() if k not in ("feature_layers", "batch_size")},
        }

    def collect(
        self, directory: Path, num_shards: int, progress: bool = True, on_shard: Callable[[ShardReport], None] = print
    ) -> list[ShardReport]:
        """Make shards until ``directory`` holds ``num_shards`` (those already there are kept: resuming).

        Conversations run continuously, ``batch_size`` at a time: a shard takes the next ``sequences_per_shard``
        that finish, and those still running go on into the next shard. Conversation n draws from its own
        generator, seeded by (seed, n); the manifest keeps the next n, so a resumed run starts new ones."""
        directory.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(directory)
        if manifest is not None and manifest["key"] != self.key:
            raise ConfigError(
                f"{directory} holds data made with other settings or another target ({manifest['key']}); "
                "use another directory"
            )
        manifest = manifest or {"key": self.key, "shards": {}, "next_conversation": 0}
        manifest["target_build"] = self.target.build  # informational: the key names what the data depends on
        write_atomically(directory / MANIFEST, json.dumps(manifest, indent=1))
        todo = [index for index in range(num_shards) if not shard_path(directory, index).exists()]
        settings = self.settings
        expected = settings.sequences_per_shard * (settings.max_user_tokens + settings.max_answer_tokens) // 2
        reports: list[ShardReport] = []
        running: list[Conversation] = []
        finished: list[Conversation] = []
        started = time.perf_counter()
        with progress_bar(total=len(todo) * expected, desc="collect", unit="tok", disable=not progress) as bar:
            while todo:
                while len(running) < settings.batch_size:
                    running.append(self._start(manifest["next_conversation"]))
                    manifest["next_conversation"] += 1
                running, done = self._step(running, bar)
                finished += done
                if len(finished) >= settings.sequences_per_shard:
                    index = todo.pop(0)
                    shard, finished = finished[: settings.sequences_per_shard], finished[settings.sequences_per_shard :]
                    report = self._write(directory, index, shard, time.perf_counter() - started)
                    started = time.perf_counter()
                    manifest["shards"][str(index)] = asdict(report)
                    write_atomically(directory / MANIFEST, json.dumps(manifest, indent=1))
                    reports.append(report)
                    on_shard(report)
                    bar.total = bar.n + len(todo) * bar.n // len(reports)  # the shards' measured size, not the bound
                    redraw(bar)
        return reports

    def _start(self, number: int) -> Conversation:
        generator = torch.Generator().manual_seed((self.settings.seed * 1_000_003 + number) % 2**64)
        opener = self.openers[int(torch.randint(len(self.openers), (1,), generator=generator))]
        return Conversation(self.target.new_cache(1), [*self.opening, *opener], generator)

    def _write(self, directory: Path, index: int, conversations: list[Conversation], seconds: float) -> ShardReport:
        data = pack(conversations)
        save_atomically(shard_path(directory, index), lambda temporary: torch.save(data, temporary))
        answer_tokens = int((data["lengths"] - data["answer_start"]).sum())
        return ShardReport(index, len(conversations), int(data["tokens"].numel()), answer_tokens, round(seconds, 1))

    def _step(self, running: list[Conversation], bar: Any) -> tuple[list[Conversation], list[Conversation]]:
        """One batched forward: (still running, finished)."""
        rows = [BatchRow(conversation.cache, conversation.pending) for conversation in running]
        logits, features = self.target.forward_batch_with_features(rows, self.layers)  # [K, V], [K, C·H] per row
        bar.update(sum(len(conversation.pending) for conversation in running))
        finished = [c for c, *outputs in zip(running, logits, features, strict=True) if self._advance(c, *outputs)]
        return [c for c in running if c not in finished], finished

    def _advance(self, conversation: Conversation, logits: torch.Tensor, features: torch.Tensor) -> bool:
        """Record a forward's features and labels, choose the next token; True when the conversation ended."""
        settings = self.settings
        conversation.tokens += conversation.pending
        conversation.features.append(features.to(torch.float16))
        logits = logits.float()
        top = logits.topk(max(settings.label_top_k, SAMPLED_FROM), dim=-1)  # [K, k'] sorted
        log_total = torch.logsumexp(logits, dim=-1, keepdim=True)  # [K, 1]
        conversation.label_ids.append(top.indices[:, : settings.label_top_k].to(torch.int32))
        conversation.label_logprobs.append((top.values[:, : settings.label_top_k] - log_total).to(torch.float16))
        user = conversation.phase is Phase.USER
        temperature = settings.user_temperature if user else settings.answer_temperature
        params = SamplingParams(temperature, top_p=settings.top_p)
        probs = logits_to_probs(top.values[-1:, :SAMPLED_FROM], params)  # [1, k']: top-p within the top k'
        token = int(top.indices[-1, int(sample(probs, conversation.generator)[0]) if temperature > 0 else 0])
        conversation.pending = [token]
        if user:
            conversation.user_tokens += 1
            if token in self.stop_ids or conversation.user_tokens >= settings.max_user_tokens:
                # the turn ends here (a long one is cut: it is still a request the target answers)
                conversation.pending = list(self.closing)
                conversation.phase = Phase.ANSWER
                conversation.answer_start = len(conversation.tokens) + len(conversation.pending)
            return False
        conversation.answer_tokens += 1
        # at the end, the last token's own forward is not needed: its label is already recorded
        return token in self.stop_ids or conversation.answer_tokens >= settings.max_answer_tokens


def pack(conversations: Sequence[Conversation]) -> dict[str, torch.Tensor]:
    """A shard: the conversations' tokens ``[N]`` side by side, their ``lengths`` and ``answer_start`` ``[S]``,
    ``features [N, C·H]`` float16, ``label_ids [N, k]`` int32 and ``label_logprobs [N, k]`` float16."""
    return {
        "tokens": torch.tensor([t for c in conversations for t in c.tokens], dtype=torch.int32),
        "lengths": torch.tensor([len(c.tokens) for c in conversations], dtype=torch.int32),
        "answer_start": torch.tensor([c.answer_start for c in conversations], dtype=torch.int32),
        "features": torch.cat([f for c in conversations for f in c.features]),
        "label_ids": torch.cat([i for c in conversations for i in c.label_ids]),
        "label_logprobs": torch.cat([p for c in conversations for p in c.label_logprobs]),
    }
