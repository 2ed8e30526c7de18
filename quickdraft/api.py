"""The library entry point: load a target (and a draft) once, generate with any drafter."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quickdraft.acceptance_head import AcceptanceHead, default_head_path
from quickdraft.calibration import (
    Calibration,
    calibration_lock,
    load_calibration,
    measure_cost_model,
    save_calibration,
)
from quickdraft.config import GenerationConfig
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS, Drafter, DrafterOptions
from quickdraft.engine import GenerationResult, GenerationStream, SpeculativeEngine
from quickdraft.errors import ConfigError, PromptError
from quickdraft.machine import cpu_description
from quickdraft.memory import DrafterMemory, keyed_file
from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_same_tokenizer, load_tokenizer, resolve_model
from quickdraft.models.loading import load_hf_model
from quickdraft.policies import parse_policy
from quickdraft.runtime import AUTO, RUNTIMES, LoadOptions, Runtime, runtime_for
from quickdraft.tokens import common_prefix_length, frequent_tokens
from quickdraft.version import __version__


@dataclass(frozen=True)
class Preparation:
    """What :meth:`Pipeline.prepare` did for a drafter and a request's policy."""

    calibration: Calibration | None = None  # the cost model's source, if the policy plans with one
    learned_file: Path | None = None  # where what the policy learns is kept (None: not kept)
    earlier_answers: int = 0  # answers in the learned file when it was read


@dataclass
class Pipeline:
    """Loaded models plus a tokenizer. ``generate``/``stream`` take the drafter by name."""

    target: Runtime
    tokenizer: Any
    eos_token_ids: frozenset[int]
    target_path: Path | None = None
    draft: Runtime | None = None
    draft_path: Path | None = None
    memories: dict[str, DrafterMemory] = field(default_factory=dict)  # per drafter name, across requests
    _learned_from: dict[str, Path] = field(default_factory=dict, repr=False)  # drafter -> learned file read
    _transformers_models: dict[str, Any] = field(default_factory=dict, repr=False)
    _drafters: dict[tuple[str, DrafterOptions], Drafter] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls,
        target: str | Path = DEFAULT_TARGET,
        draft: str | Path | None = DEFAULT_DRAFT,
        runtime: str = AUTO,
        progress: bool = True,
        draft_weights: str | None = None,
        draft_vocabulary: int | None = None,
    ) -> Pipeline:
        """Resolve and load models: packaged names, transformers directories or GGUF files.

        ``runtime`` names one (``transformers``, ``native``) or is ``auto`` (the default): native for
        the model families it runs, transformers for the rest.

        ``draft=None`` loads no draft model (enough for prompt lookup and plain decoding). ``draft_weights``
        (``auto``, ``q4``, ``int8``) and ``draft_vocabulary`` (the number of most frequent tokens its LM head
        computes; 0: all) trade the draft model's precision for speed on the native runtime; they change how
        often drafts are accepted, never the output. None takes the defaults, :data:`DRAFT_WEIGHTS` and
        :data:`DRAFT_VOCABULARY`.
        """
        if runtime != AUTO:
            RUNTIMES.get(runtime)  # an unknown name fails before any model work
        target_path = resolve_model(target, progress)
        tokenizer = load_tokenizer(target_path)
        draft_path = draft_runtime = None
        if draft is not None:
            draft_path = resolve_model(draft, progress)
            check_same_tokenizer(tokenizer, load_tokenizer(draft_path))
            draft_class = runtime_for(runtime, draft_path)
            options = draft_load_options(draft_class, tokenizer, draft_weights, draft_vocabulary)
            draft_runtime = draft_class.load(draft_path, options)
        return cls(
            target=runtime_for(runtime, target_path).load(target_path),
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids(target_path, tokenizer),
            target_path=target_path,
            draft=draft_runtime,
            draft_path=draft_path,
        )

    def engine(self, drafter: str = DEFAULT_DRAFTER, options: DrafterOptions | None = None) -> SpeculativeEngine:
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
            memory=self.memory(drafter),
            prepare=lambda config: self.prepare(drafter, config),
        )

    def memory(self, drafter: str) -> DrafterMemory:
        """What ``drafter`` has learned and measured on these models (created empty on first use)."""
        DRAFTERS.get(drafter)  # an unknown name fails here
        return self.memories.setdefault(drafter, DrafterMemory())

    def prepare(
        self,
        drafter: str,
        config: GenerationConfig,
        *,
        recalibrate: bool = False,
        acceptance_head: Path | None = None,
        keep_learning: bool = False,
        chat: bool = False,
    ) -> Preparation:
        """Get ``drafter``'s memory ready for ``config``'s policy, as its registry entry asks: measure (or load)
        a cost model, load an acceptance head. Cheap when it is ready already; every application calls it
        before generating, and the engine calls it for every request.

        ``recalibrate`` measures the costs again instead of using a saved calibration and starts learning
        afresh. ``keep_learning`` starts what the policy learns of answers from :meth:`learned_file` (for
        chat turns or completions, ``chat``) and lets :meth:`save_learned` write it back: a process that
        serves one request (the CLI) then begins where earlier ones left off.
        """
        kind = parse_policy(config.policy).kind
        memory = self.memory(drafter)
        if not DRAFTERS.get(drafter).proposes_drafts:
            return Preparation()
        calibration = None
        if kind.needs_cost_model and (memory.cost_model is None or recalibrate):
            calibration = self.calibrate(drafter, config.max_draft_tokens, use_saved=not recalibrate)
        if kind.needs_acceptance_head and (memory.acceptance_head is None or acceptance_head is not None):
            self.load_acceptance_head(drafter, acceptance_head)
        learned_file, earlier_answers = None, 0
        if kind.learns_answers and keep_learning:
            learned_file = self.learned_file(drafter, chat)
            if learned_file is not None and self._learned_from.get(drafter) != learned_file:
                memory.forget_answers()
                if not recalibrate:
                    earlier_answers = memory.load_learned(learned_file)
                self._learned_from[drafter] = learned_file
        return Preparation(calibration, learned_file, earlier_answers)

    def forget_answers(self) -> None:
        """Drop what adaptive policies learned of earlier answers (acceptance rates, answer lengths);
        what steps cost on this machine stays measured."""
        for memory in self.memories.values():
            memory.forget_answers()

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
        """The SpecDec++ head for ``drafter`` (from ``path``, else the draft model's default location); one
        trained for a draft model of another hidden size raises ``ModelFilesError``."""
        if self.draft_path is None and path is None:
            raise ConfigError("an acceptance head belongs to a draft model, and none is loaded")
        hidden_size = None if self.draft is None else self.draft.hidden_size
        head = AcceptanceHead.load(path or default_head_path(self.draft_path), hidden_size)  # type: ignore[arg-type]
        self.memory(drafter).acceptance_head = head
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
    ) -> Calibration:
        """Measure the step costs the goodput policy needs (:func:`measure_cost_model`, a few seconds) and
        keep them in ``drafter``'s memory.

        Models loaded from a path save the measurement in :meth:`calibration_file` and, with ``use_saved``,
        load it from there instead of measuring again (a file that cannot be used is measured anew and
        replaced, and the calibration says so). Calibrations are made one at a time (:func:`calibration_lock`),
        so a run that waited for another one's loads what it saved; a measurement during which the machine's
        load changed is used, but not saved.
        """
        path = self.calibration_file(drafter, max_draft_tokens, context)
        with calibration_lock(path):
            calibration = self._load_or_measure(drafter, max_draft_tokens, context, path, use_saved)
        self.memory(drafter).cost_model = calibration.cost_model
        return calibration

    def _load_or_measure(
        self, drafter: str, max_draft_tokens: int, context: int, path: Path | None, use_saved: bool
    ) -> Calibration:
        problem = None
        if use_saved and path is not None and path.exists():
            try:
                return Calibration(load_calibration(path), "loaded", path)
            except ConfigError as error:
                problem = str(error)
        started = time.perf_counter()
        measured = measure_cost_model(self.target, self.draft, DRAFTERS.get(drafter), max_draft_tokens, context)
        seconds = time.perf_counter() - started
        key = self.calibration_key(drafter, max_draft_tokens, context)
        saved = path is not None and measured.unsteady is None and save_calibration(path, key, measured.cost_model)
        source = "measured" if problem is None else "re-measured"
        return Calibration(measured.cost_model, source, path, seconds, saved, problem, measured.unsteady)

    def calibration_file(self, drafter: str, max_draft_tokens: int = 16, context: int = 64) -> Path | None:
        """Where :meth:`calibrate` saves its measurement: one file per models, runtime, thread count,
        machine and drafter; None for models without a path."""
        if self.target_path is None or (DRAFTERS.get(drafter).needs_draft_model and self.draft_path is None):
            return None
        return keyed_file(self.calibration_key(drafter, max_draft_tokens, context), ".json")

    def calibration_key(self, drafter: str, max_draft_tokens: int, context: int) -> dict[str, Any]:
        """What a drafter's measured costs depend on: drafters that cost alike (the hybrid drafts with the draft
        model) share one calibration."""
        drafter_cls = DRAFTERS.get(drafter)
        uses_draft = drafter_cls.needs_draft_model
        return {
            "target": str(self.target_path),
            "draft": str(self.draft_path) if uses_draft else None,
            "runtime": self.target.name,
            "builds": self._builds(uses_draft),
            "drafter_costs": [uses_draft, drafter_cls.target_cost_fraction],
            "max_draft_tokens": max_draft_tokens,
            "context": context,
            "threads": torch.get_num_threads(),
            "machine": cpu_description(),
            "quickdraft": __version__,
        }

    def _builds(self, uses_draft: bool) -> dict[str, str | None]:
        """What the models' costs and tokens depend on besides their files (e.g. a draft model in 4 bits)."""
        draft = self.draft.build if uses_draft and self.draft is not None else None
        return {"target": self.target.build, "draft": draft}

    def learned_file(self, drafter: str, chat: bool = False) -> Path | None:
        """Where what goodput learned of ``drafter``'s answers on these models and runtime is kept (not per
        machine: acceptance and answer lengths do not depend on it), apart for chat turns and plain
        completions, whose answers run differently; None for models without a path."""
        uses_draft = DRAFTERS.get(drafter).needs_draft_model
        if self.target_path is None or (uses_draft and self.draft_path is None):
            return None
        key = {
            "target": str(self.target_path),
            "draft": str(self.draft_path) if uses_draft else None,
            "runtime": self.target.name,
            "builds": self._builds(uses_draft),
            "drafter": drafter,
            "chat": chat,
        }
        return keyed_file(key, ".learned.json")

    def save_learned(self, drafter: str, preparation: Preparation) -> None:
        """Write what ``drafter``'s policy learned back to the learned file :meth:`prepare` read, if any."""
        if preparation.learned_file is not None:
            self.memory(drafter).save_learned(preparation.learned_file)

    def encode(self, prompt: str, chat: bool = False) -> list[int]:
        """Prompt text -> token ids; ``chat`` wraps it as a user turn of the chat template."""
        if not prompt.strip():
            raise PromptError("the prompt is empty: give some text to continue")
        require_utf8(prompt, "the prompt")
        if chat:
            return self.encode_chat([{"role": "user", "content": prompt}])
        return list(self.tokenizer(prompt).input_ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """A conversation (``role``/``content`` dicts) through the chat template, ready for the assistant's turn."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError("this model has no chat template; run without --chat")
        for message in messages:
            require_utf8(message["content"], f"the {message['role']} message")
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
        drafter: str = DEFAULT_DRAFTER,
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationStream:
        return self.engine(drafter, options).stream(self.encode(prompt, chat), config or GenerationConfig())

    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        drafter: str = DEFAULT_DRAFTER,
        chat: bool = False,
        options: DrafterOptions | None = None,
    ) -> GenerationResult:
        return self.stream(prompt, config, drafter, chat, options).finish()


# The draft model's defaults on runtimes that take load options (docs/design.md has the measurements).
DRAFT_WEIGHTS = "q4"
DRAFT_VOCABULARY = 49152  # the most frequent tokens, plus each request's prompt tokens (0: all tokens)


def draft_load_defaults(weights: str | None, vocabulary: int | None) -> tuple[str, int]:
    """The draft model's weight format and vocabulary size as asked for, else :data:`DRAFT_WEIGHTS` and
    :data:`DRAFT_VOCABULARY`."""
    return (DRAFT_WEIGHTS if weights is None else weights, DRAFT_VOCABULARY if vocabulary is None else vocabulary)


def draft_load_options(
    runtime_class: type[Runtime], tokenizer: Any, weights: str | None, vocabulary: int | None
) -> LoadOptions:
    """The draft model's load options: what was asked for, else :data:`DRAFT_WEIGHTS` and :data:`DRAFT_VOCABULARY`
    where the runtime takes load options (a runtime that does not refuses what was asked for explicitly)."""
    if not runtime_class.takes_load_options and weights is None and vocabulary is None:
        return LoadOptions()
    weights, vocabulary = draft_load_defaults(weights, vocabulary)
    if vocabulary < 0:
        raise ConfigError(f"the draft vocabulary is a number of tokens >= 0 (0: all), got {vocabulary}")
    return LoadOptions(weights, frequent_tokens(tokenizer, vocabulary) if vocabulary else None)


def require_utf8(text: str, what: str) -> None:
    """Text a tokenizer can take: undecodable bytes (which Python keeps in command-line arguments as lone
    surrogates) raise ``PromptError`` naming the first one."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(
            f"{what} is not UTF-8 text: character {error.start} is an undecodable byte "
            f"(0x{ord(text[error.start]) & 0xFF:02x}); convert it first (e.g. iconv -t UTF-8)"
        ) from None


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
