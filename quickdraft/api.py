"""The library entry point: load a target (and a draft) once, generate with any drafter."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quickdraft.acceptance_head import AcceptanceHead, default_head_path
from quickdraft.config import GenerationConfig
from quickdraft.drafters import DRAFTERS, Drafter, DrafterOptions
from quickdraft.drafters.draft_model import common_prefix_length
from quickdraft.engine import GenerationResult, GenerationStream, SpeculativeEngine
from quickdraft.errors import ConfigError, PromptError
from quickdraft.machine import cpu_description
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_same_tokenizer, load_tokenizer, resolve_model
from quickdraft.models.catalog import cache_root
from quickdraft.models.loading import load_hf_model
from quickdraft.policy import AcceptanceRecord, AnswerLength, AnswerLengthRecord, CostModel, StepTimeRecord
from quickdraft.runtime import AUTO, RUNTIMES, Runtime, runtime_for


@dataclass
class Pipeline:
    """Loaded models plus a tokenizer. ``generate``/``stream`` take the drafter by name."""

    target: Runtime
    tokenizer: Any
    eos_token_ids: frozenset[int]
    target_path: Path | None = None
    draft: Runtime | None = None
    draft_path: Path | None = None
    # what adaptive policies learn and measure, kept across requests: per drafter name
    acceptance_records: dict[str, AcceptanceRecord] = field(default_factory=dict)
    step_times: dict[str, StepTimeRecord] = field(default_factory=dict)  # what their steps took in the engine
    answer_lengths: dict[str, AnswerLengthRecord] = field(default_factory=dict)  # how long their answers ran
    cost_models: dict[str, CostModel] = field(default_factory=dict)
    acceptance_heads: dict[str, AcceptanceHead] = field(default_factory=dict)  # for specdec++
    _transformers_models: dict[str, Any] = field(default_factory=dict, repr=False)
    _drafters: dict[tuple[str, DrafterOptions], Drafter] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls,
        target: str | Path = DEFAULT_TARGET,
        draft: str | Path | None = DEFAULT_DRAFT,
        runtime: str = AUTO,
        progress: bool = True,
    ) -> Pipeline:
        """Resolve and load models: packaged names, transformers directories or GGUF files.

        ``runtime`` names one (``transformers``, ``native``) or is ``auto`` (the default): native for
        the model families it runs, transformers for the rest.

        ``draft=None`` loads no draft model (enough for prompt lookup and plain decoding).
        """
        if runtime != AUTO:
            RUNTIMES.get(runtime)  # an unknown name fails before any model work
        target_path = resolve_model(target, progress)
        tokenizer = load_tokenizer(target_path)
        draft_path = draft_runtime = None
        if draft is not None:
            draft_path = resolve_model(draft, progress)
            check_same_tokenizer(tokenizer, load_tokenizer(draft_path))
            draft_runtime = runtime_for(runtime, draft_path).load(draft_path)
        return cls(
            target=runtime_for(runtime, target_path).load(target_path),
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids(target_path, tokenizer),
            target_path=target_path,
            draft=draft_runtime,
            draft_path=draft_path,
        )

    def engine(self, drafter: str = "draft-model", options: DrafterOptions | None = None) -> SpeculativeEngine:
        """An engine with ``drafter``; drafters are kept per (name, options), so what one learns (e.g.
        early-exit's per-layer acceptance) and what a draft model has read (a chat's earlier turns)
        carry over to later requests. One request at a time."""
        drafter_cls = DRAFTERS.get(drafter)
        if drafter_cls.needs_draft_model and self.draft is None:
            raise ConfigError(f"the {drafter} drafter needs a draft model, and none is loaded")
        options = options or DrafterOptions()
        instance = self._drafters.get((drafter, options))
        if instance is None:
            instance = self._drafters[(drafter, options)] = drafter_cls.create(self.target, self.draft, options)
        return SpeculativeEngine(
            self.target,
            instance,
            self.tokenizer,
            self.eos_token_ids,
            cost_model=self.cost_models.get(drafter),
            acceptance=self.acceptance_records.setdefault(drafter, AcceptanceRecord()),
            acceptance_head=self.acceptance_heads.get(drafter),
            calibrate=lambda max_draft_tokens: self.calibrate(drafter, max_draft_tokens),
            step_times=self.step_times.setdefault(drafter, StepTimeRecord()),
            answer_lengths=self.answer_lengths.setdefault(drafter, AnswerLengthRecord()),
        )

    def forget_answers(self) -> None:
        """Drop what adaptive policies learned of earlier answers (acceptance rates, answer lengths);
        what steps cost on this machine stays measured."""
        self.acceptance_records.clear()
        self.answer_lengths.clear()

    def on_runtime(self, runtime: str) -> Pipeline:
        """The same models, tokenizer and end-of-sequence ids on another runtime (to compare runtimes).

        The transformers runtime wraps the fp32 models :meth:`transformers_model` keeps (the ones the
        benchmark's peers use), so it costs no second fp32 copy of the weights.
        """
        runtime_cls = RUNTIMES.get(runtime)
        if runtime_cls.name == self.target.name:
            raise ConfigError(f"the models already run on the {runtime} runtime")

        def load(role: str, path: Path | None) -> Runtime:
            if path is None:
                raise ConfigError(f"the {runtime} runtime needs the {role} model's directory")
            return runtime_cls.load_sharing(path, lambda: self.transformers_model(role))

        return Pipeline(
            target=load("target", self.target_path),
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            target_path=self.target_path,
            draft=load("draft", self.draft_path) if self.draft is not None else None,
            draft_path=self.draft_path,
            _transformers_models=self._transformers_models,
        )

    def load_acceptance_head(self, drafter: str, path: Path | None = None) -> AcceptanceHead:
        """The SpecDec++ head for ``drafter`` (from ``path``, else the draft model's default location)."""
        if self.draft_path is None and path is None:
            raise ConfigError("an acceptance head belongs to a draft model, and none is loaded")
        head = AcceptanceHead.load(path or default_head_path(self.draft_path))  # type: ignore[arg-type]
        self.acceptance_heads[drafter] = head
        return head

    def transformers_model(self, role: str) -> Any:
        """The transformers model of the target or draft (for peers and references): the runtime's own
        when it is the transformers runtime, else loaded once in fp32 from the model's directory."""
        runtime, path = (self.target, self.target_path) if role == "target" else (self.draft, self.draft_path)
        if runtime is None:
            raise ConfigError(f"a {role} model is needed, and none is loaded")
        model = getattr(runtime, "model", None)
        if model is not None:
            return model
        if path is None:
            raise ConfigError(f"the transformers copy of the {role} model needs its directory")
        if role not in self._transformers_models:
            self._transformers_models[role] = load_hf_model(path)
        return self._transformers_models[role]

    def calibrate(
        self, drafter: str, max_draft_tokens: int = 16, context: int = 64, use_saved: bool = True
    ) -> CostModel:
        """Measure the step costs the goodput policy needs (a few forwards) and keep them for ``drafter``.

        Target: one timed forward of k ∈ {1, 2, 4, 8, …, max + 1} new tokens after ``context`` cached
        tokens (after a warm-up); the draft model's 1-token forward and what reading 128 and 512 tokens
        costs it if the drafter uses one, the drafter's share of a target step if the target drafts
        itself, else 0.

        Models loaded from a path save the measurement in :meth:`calibration_file` and, with
        ``use_saved``, load it from there instead of measuring again (a file that does not parse is
        measured anew and replaced).
        """
        path = self.calibration_file(drafter, max_draft_tokens, context)
        if use_saved and path is not None and path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                self.cost_models[drafter] = CostModel.from_dict(saved["cost_model"])
                return self.cost_models[drafter]
            except (OSError, ValueError, KeyError, TypeError, ConfigError):
                pass  # measured anew below
        from quickdraft.bench.profile import (
            PREFILL_LENGTHS,
            measure_cost_curves,
            measure_prefill_curve,
            prefill_lengths,
        )

        ks = sorted({k for k in (1, 2, 4, 8, 16) if k <= max_draft_tokens} | {max_draft_tokens + 1})
        drafter_cls, draft_ms, prefill_ms = DRAFTERS.get(drafter), 0.0, {}
        runtimes, wanted = {"target": self.target}, {"target": ks}
        if drafter_cls.needs_draft_model and self.draft is not None:
            runtimes["draft"], wanted["draft"] = self.draft, [1]
        curves = measure_cost_curves(runtimes, wanted, context, repeats=3, warmup=1)  # target and draft in turn
        target_ms = curves["target"]
        if "draft" in curves:
            draft_ms = curves["draft"][1]
            prefill_ms = measure_prefill_curve(self.draft, prefill_lengths(self.draft, PREFILL_LENGTHS[:2]))
        elif drafter_cls.target_cost_fraction is not None:
            draft_ms = drafter_cls.target_cost_fraction * target_ms[1]
        self.cost_models[drafter] = CostModel(target_ms, draft_ms, prefill_ms)
        if path is not None:
            with contextlib.suppress(OSError):  # a cache that cannot be written only costs a later re-measure
                record = {
                    "key": self._calibration_key(drafter, max_draft_tokens, context),
                    "cost_model": self.cost_models[drafter].to_dict(),
                }
                write_atomically(path, json.dumps(record, indent=2))
        return self.cost_models[drafter]

    def calibration_file(self, drafter: str, max_draft_tokens: int = 16, context: int = 64) -> Path | None:
        """Where :meth:`calibrate` saves its measurement: one file per models, runtime, thread count,
        machine and drafter in :func:`calibrations_dir`; None for models without a path."""
        if self.target_path is None or (DRAFTERS.get(drafter).needs_draft_model and self.draft_path is None):
            return None
        key = json.dumps(self._calibration_key(drafter, max_draft_tokens, context), sort_keys=True)
        return calibrations_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"

    def _calibration_key(self, drafter: str, max_draft_tokens: int, context: int) -> dict[str, Any]:
        from quickdraft import __version__

        uses_draft = DRAFTERS.get(drafter).needs_draft_model
        return {
            "target": str(self.target_path),
            "draft": str(self.draft_path) if uses_draft else None,
            "runtime": self.target.name,
            "drafter": drafter,
            "max_draft_tokens": max_draft_tokens,
            "context": context,
            "threads": torch.get_num_threads(),
            "machine": cpu_description(),
            "quickdraft": __version__,
        }

    def learned_file(self, drafter: str, chat: bool = False) -> Path | None:
        """Where :meth:`save_learned` keeps what goodput learned of ``drafter``'s answers on these models
        and runtime, in :func:`calibrations_dir` (not per machine: acceptance and answer lengths do not
        depend on it), apart for chat turns and plain completions, whose answers run differently; None
        for models without a path."""
        uses_draft = DRAFTERS.get(drafter).needs_draft_model
        if self.target_path is None or (uses_draft and self.draft_path is None):
            return None
        key = {
            "target": str(self.target_path),
            "draft": str(self.draft_path) if uses_draft else None,
            "runtime": self.target.name,
            "drafter": drafter,
            "chat": chat,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return calibrations_dir() / f"{digest}.learned.json"

    def load_learned(self, drafter: str, chat: bool = False) -> int:
        """Start ``drafter``'s acceptance record and answer lengths from :meth:`learned_file`, so a process
        that serves one request (the CLI) begins where earlier ones left off; how many answers it held
        (0: none yet, or a file that does not parse, which the next save replaces)."""
        path = self.learned_file(drafter, chat)
        if path is None or not path.exists():
            return 0
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            acceptance = AcceptanceRecord.from_dict(saved["acceptance"])
            answers = [AnswerLength(int(num_tokens), cut) for num_tokens, cut in saved["answers"]]
        except (OSError, ValueError, OverflowError, KeyError, TypeError):
            return 0
        if not all(answer.num_tokens >= 0 and isinstance(answer.cut_by_budget, bool) for answer in answers):
            return 0
        self.acceptance_records[drafter] = acceptance
        self.answer_lengths[drafter] = AnswerLengthRecord(deque(answers))
        return len(self.answer_lengths[drafter].answers)

    def save_learned(self, drafter: str, chat: bool = False) -> None:
        """Write what goodput learned of ``drafter``'s answers to :meth:`learned_file` (a file that cannot
        be written only means the next process starts knowing less)."""
        path = self.learned_file(drafter, chat)
        if path is None:
            return
        acceptance = self.acceptance_records.get(drafter, AcceptanceRecord())
        answers = self.answer_lengths.get(drafter, AnswerLengthRecord()).answers
        data = {
            "acceptance": acceptance.to_dict(),
            "answers": [[answer.num_tokens, answer.cut_by_budget] for answer in answers],
        }
        with contextlib.suppress(OSError):
            write_atomically(path, json.dumps(data))

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Prompt text -> token ids; ``chat`` wraps it as a user turn of the chat template."""
        if not prompt.strip():
            raise PromptError("the prompt is empty: give some text to continue")
        if chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return list(self.tokenizer(prompt).input_ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """A conversation (``role``/``content`` dicts) through the chat template, ready for the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("this model has no chat template; run without --chat")
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def chat_prefix(self) -> list[int]:
        """The tokens every chat request starts with (the template's system prompt and the user turn's
        opening): what a serving draft model keeps cached from one conversation to the next."""
        if not getattr(self.tokenizer, "chat_template", None):
            return []
        first, second = (self.encode_chat([{"role": "user", "content": text}]) for text in ("0", "1"))
        return [] if first == second else first[: common_prefix_length(first, second)]

    def stream(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: str = "draft-model",
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationStream:
        return self.engine(drafter, options).stream(self.encode(prompt, chat), config or GenerationConfig())

    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: str = "draft-model",
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationResult:
        return self.stream(prompt, config, drafter, chat, options).finish()


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so a reader (or a process stopped
    mid-write) sees the old file or the new one, never a cut one; raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def calibrations_dir() -> Path:
    """Where measured cost models are saved: ``$QUICKDRAFT_CACHE/calibrations``."""
    return cache_root() / "calibrations"


def eos_token_ids(model_path: Path, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's end-of-sequence token and those of the model's generation config."""
    from transformers import GenerationConfig as HFGenerationConfig

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        configured = HFGenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        configured = None
    if configured is not None:
        ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(ids)
