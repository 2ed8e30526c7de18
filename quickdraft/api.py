"""The library entry point: load a target (and a draft) once, generate with any drafter through the one engine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from numbers import Integral
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quickdraft.config import GenerationConfig, require_bool
from quickdraft.costs import CostModel
from quickdraft.costs.store import Calibration, CalibrationStore
from quickdraft.draft_head.file import default_head_path as default_draft_head_path
from quickdraft.drafters import DEFAULT_DRAFTER, DRAFTERS, Drafter, DrafterOptions, DrafterRecords
from quickdraft.engine import Engine, GenerationResult, GenerationStream, Request, stream
from quickdraft.engine.request import token_ids
from quickdraft.errors import ConfigError, PromptError
from quickdraft.files import model_key
from quickdraft.lossless.sampling import is_int
from quickdraft.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    find_draft,
    load_tokenizer,
    resolve_model,
)
from quickdraft.models.loading import draft_tokenizer_for, eos_token_ids, load_hf_model
from quickdraft.models.pairing import AUTO as AUTO_DRAFT
from quickdraft.models.pairing import vocabulary_mismatch
from quickdraft.policies import Policy
from quickdraft.policies.acceptance_head import AcceptanceHead, default_head_path
from quickdraft.prompts import chat_prefix, encode, encode_chat, encode_infill, infill_of, use_chat_template
from quickdraft.runtime import AUTO, RUNTIMES, LoadOptions, Runtime, check_runtime, runtime_for
from quickdraft.runtime.device import AUTO_DEVICE, resolve_device
from quickdraft.runtime.options import draft_load_options
from quickdraft.vocabularies import VocabularyBridge

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class PolicySetup:
    """What :meth:`Pipeline.setup_policy` did for a drafter and a request's policy."""

    calibration: Calibration[CostModel] | None = None  # the cost model's source, if the policy plans with one
    learned_file: Path | None = None  # where what the policy learns is kept (None: not kept)
    earlier_answers: int = 0  # answers in the learned file when it was read


@dataclass
class Pipeline:
    """Loaded models plus a tokenizer, and the engine that decodes with them. ``generate``/``stream`` take the
    drafter by name; drafters are made once per (name, options) and share their records per name."""

    target: Runtime
    tokenizer: Any
    eos_token_ids: frozenset[int]
    target_path: Path | None = None
    draft: Runtime | None = None
    draft_path: Path | None = None
    draft_head: Path | None = None  # the eagle drafters' head (None: the target's default, if it has a path)
    bridge: VocabularyBridge | None = None  # a draft model with another tokenizer (None: the same vocabulary)
    mismatch: str | None = None  # why the draft's vocabulary is not the target's, where it is not
    records: dict[str, DrafterRecords] = field(default_factory=dict)  # per drafter name, across requests
    engine: Engine = field(init=False, repr=False)  # the library's engine (a server makes its own)
    _learned_from: dict[str, Path] = field(default_factory=dict, repr=False)  # drafter -> learned file read
    _transformers_models: dict[str, Any] = field(default_factory=dict, repr=False)
    _drafters: dict[tuple[str, DrafterOptions], Drafter] = field(init=False, repr=False)  # made for these models

    def __post_init__(self) -> None:
        given = self.eos_token_ids  # any iterable of token ids
        ends = tuple(given) if isinstance(given, Iterable) and not isinstance(given, str | bytes) else (None,)
        if not all(isinstance(token, Integral) and not isinstance(token, bool) and token >= 0 for token in ends):
            raise ConfigError(f"eos_token_ids must be token ids (ints >= 0), got {given!r}", "eos_token_ids")
        self.eos_token_ids = frozenset(int(token) for token in ends)
        self.engine = Engine(self.target, self.tokenizer, self.eos_token_ids)
        self._drafters = {}

    @classmethod
    def load(
        cls,
        target: str | Path = DEFAULT_TARGET,
        draft: str | Path | None = DEFAULT_DRAFT,
        runtime: str = AUTO,
        progress: bool = True,
        draft_weights: str | None = None,
        draft_vocabulary: int | None = None,
        device: str = AUTO_DEVICE,
        chat_template: str | None = None,
        kv_cache_dtype: str | None = None,
        max_context: int | None = None,
    ) -> Pipeline:
        """Resolve and load models: packaged names, transformers directories or GGUF files.

        ``runtime`` names one (``transformers``, ``native``) or is ``auto`` (the default): native for
        the model families it runs, transformers for the rest. ``device`` (``auto``, ``cpu``, ``cuda``,
        ``cuda:N``) is where both models run: ``auto`` is the first CUDA GPU when torch sees one (the
        transformers runtime in bf16 there), else the CPU (:mod:`quickdraft.runtime.device`).

        ``draft=None`` loads no draft model (enough for prompt lookup and plain decoding); ``draft="auto"`` the
        largest model at hand that shares the target's vocabulary and is at most half its size
        (:func:`quickdraft.models.find_draft`). Any other draft model drafts too: one whose vocabulary is not the
        target's by llama.cpp's rule drafts across vocabularies (:mod:`quickdraft.vocabularies`; :meth:`pairing`
        says which). ``draft_weights`` (``auto``, ``q4``, ``int8``) and ``draft_vocabulary`` (the number of most
        frequent tokens its LM head computes; 0: all) trade the draft model's precision for speed on the native
        runtime; they change how often drafts are accepted, never the output. None takes the defaults,
        ``DRAFT_WEIGHTS`` and ``DRAFT_VOCABULARY`` of :mod:`quickdraft.runtime.options`. ``chat_template``: Jinja
        text used in place of the target's chat template (checked before any model loads). ``kv_cache_dtype``
        (``float16``, ``float32``; None: ``KV_CACHE_DEFAULT`` of :mod:`quickdraft.runtime.names`) is what both
        models' native KV caches hold. ``max_context`` caps the positions a request holds, prompt and answer, and
        the memory the models keep for them (None: the target's declared context; more than that is an error).
        """
        check_runtime(runtime)  # an unknown name fails before any model work
        require_bool(progress, "progress")
        if draft is None and (draft_weights is not None or draft_vocabulary is not None):
            raise ConfigError("draft_weights and draft_vocabulary set how the draft model loads; draft=None loads none")
        where = resolve_device(device)
        shared = {"progress": progress, "kv_cache_dtype": kv_cache_dtype, "max_context": max_context}  # both models'
        target_options = LoadOptions(device=where, **shared)  # a max_context of no positions fails here, at once
        target_path = resolve_model(target, progress)
        tokenizer = load_tokenizer(target_path)
        if chat_template is not None:
            use_chat_template(tokenizer, chat_template)
        draft_path = draft_runtime = bridge = mismatch = None
        if draft == AUTO_DRAFT:
            draft = find_draft(target_path, tokenizer, progress)
        if draft is not None:
            draft_path = resolve_model(draft, progress)
            draft_tokenizer = draft_tokenizer_for(target_path, tokenizer, draft_path)
            mismatch = vocabulary_mismatch(tokenizer, draft_tokenizer)
            draft_class = runtime_for(runtime, draft_path, where)
            options = draft_load_options(draft_class, draft_tokenizer, draft_weights, draft_vocabulary, where)
            draft_runtime = draft_class.load(draft_path, replace(options, **shared))
        target_runtime = runtime_for(runtime, target_path, where).load(target_path, target_options)
        target_options.check_capped(target_runtime, "the target")
        if mismatch is not None:
            turn_ends = eos_token_ids(draft_path, draft_tokenizer)
            bridge = VocabularyBridge(
                tokenizer, draft_tokenizer, target_runtime.vocab_size, draft_runtime.vocab_size, turn_ends
            )
        return cls(
            target=target_runtime,
            tokenizer=tokenizer,
            eos_token_ids=eos_token_ids(target_path, tokenizer),
            target_path=target_path,
            draft=draft_runtime,
            draft_path=draft_path,
            bridge=bridge,
            mismatch=mismatch,
        )

    def pairing(self) -> str:
        """How the draft model drafts for the target: in the target's vocabulary, or across vocabularies and why."""
        if self.draft is None:
            return "no draft model"
        if self.bridge is None:
            return "the draft model shares the target's vocabulary"
        return f"the draft model drafts {self.bridge.describe()} (by llama.cpp's rule {self.mismatch})"

    # -- drafters and generation -----------------------------------------------------------------------

    def drafter(self, name: str = DEFAULT_DRAFTER, options: DrafterOptions | None = None) -> Drafter:
        """The drafter called ``name`` for these models, made on first use and kept per (name, options): what it
        learns (e.g. early-exit's per-layer acceptance) and what its draft model has read (a chat's earlier
        turns) carry over to later requests. Its costs are ready when a policy first needs them: loaded from this
        machine's saved calibration or measured once (:meth:`calibrate`). An unknown name or one these models
        cannot run raises."""
        if options is not None and not isinstance(options, DrafterOptions):
            raise ConfigError(f"options must be a DrafterOptions, got {options!r}")
        options = options or DrafterOptions()
        drafter_cls = DRAFTERS.get(name)
        if drafter_cls.needs_draft_head and options.draft_head is None:
            head = self.draft_head
            if head is None and self.target_path is not None:
                head = default_draft_head_path(model_key(self.target_path))
            options = replace(options, draft_head=None if head is None else str(head))
        if drafter_cls.needs_draft_model and self.bridge is not None:
            options = replace(options, vocabulary_bridge=self.bridge)
        drafter = self._drafters.get((name, options))
        if drafter is None:
            if drafter_cls.needs_draft_model and self.draft is None:
                others = "pick drafter='suffix', 'prompt-lookup' or 'none'"
                raise ConfigError(f"the {name} drafter needs a draft model, and none is loaded: load one, or {others}")
            records = self.drafter_records(name)
            drafter = drafter_cls.create(self.target, self.draft, options, records)
            drafter.made_for = self.target
            if records.measure_costs is None:
                records.measure_costs = lambda max_draft_tokens: self.calibrate(name, max_draft_tokens).cost_model
            self._drafters[(name, options)] = drafter
        return drafter

    def drafter_records(self, name: str) -> DrafterRecords:
        """What the drafter called ``name`` has learned and measured on these models (created empty on first use)."""
        DRAFTERS.get(name)  # an unknown name fails here
        return self.records.setdefault(name, DrafterRecords())

    def stream(
        self,
        prompt: str | Sequence[int],
        config: GenerationConfig | None = None,
        drafter: str = DEFAULT_DRAFTER,
        chat: bool = False,
        options: DrafterOptions | None = None,
        policy: Policy | None = None,
        prediction: str | Sequence[int] | torch.Tensor | np.ndarray | None = None,
    ) -> GenerationStream:
        """Decode ``prompt`` (text, or token ids) through :attr:`engine`, yielding text deltas. The policy is
        ``config.policy``, made ready first (:meth:`setup_policy`: goodput loads or measures its drafter's costs on
        first use), or the ready ``policy`` given. ``prediction``: the answer expected (text or token ids; OpenAI's
        Predicted Outputs), copied as drafts where the answer follows it; a hybrid drafter's only."""
        config = GenerationConfig() if config is None else config
        if not isinstance(config, GenerationConfig):
            raise ConfigError(f"config must be a GenerationConfig, got {config!r}")
        require_bool(chat, "chat")
        if chat and not isinstance(prompt, str):
            raise PromptError("chat=True wraps prompt text in the chat template: give text, not token ids")
        prompt_ids = self.encode(prompt, chat) if isinstance(prompt, str) else token_ids(prompt, "the prompt")
        if isinstance(prediction, str):  # empty text predicts nothing, as the server's empty prediction
            prediction_ids = encode(self.tokenizer, prediction, what="the prediction") if prediction.strip() else ()
        else:  # token ids: a sequence, tensor or array, checked by the Request as the prompt's are
            prediction_ids = () if prediction is None else token_ids(prediction, "the prediction")
        drafter_object = self.drafter(drafter, options)
        request = Request(tuple(prompt_ids), config, drafter_object, policy=policy, prediction_ids=prediction_ids)
        if policy is None:  # its costs and head ready now (the engine would get costs ready at the first need)
            self.engine.check_request(request)  # before any measuring
            with self.engine.step_lock.between_steps():  # measuring runs forwards: not beside another thread's step
                self.setup_policy(drafter, config)
        return stream(self.engine, request)

    def generate(self, prompt: str | Sequence[int], *args: Any, **kwargs: Any) -> GenerationResult:
        """:meth:`stream`'s request decoded to its end."""
        return self.stream(prompt, *args, **kwargs).finish()

    # -- what policies need ----------------------------------------------------------------------------

    def setup_policy(
        self,
        drafter: str,
        config: GenerationConfig,
        *,
        recalibrate: bool = False,
        acceptance_head: str | Path | None = None,
        keep_learning: bool = False,
        chat: bool = False,
    ) -> PolicySetup:
        """Get ``drafter``'s records ready for ``config``'s policy now, as its registry entry asks, instead of at its
        first request: its costs (loaded or measured), an acceptance head. Cheap when they are ready already.

        ``recalibrate`` measures the costs again instead of using a saved calibration and starts learning
        afresh. ``keep_learning`` starts what the policy learns of answers from the learned file (for chat turns
        or completions, ``chat``) and lets :meth:`save_learned` write it back: a process that serves one request
        (the CLI) then begins where earlier ones left off.
        """
        if not isinstance(config, GenerationConfig):
            raise ConfigError(f"setup_policy takes a GenerationConfig, got {config!r}")
        for name, value in (("recalibrate", recalibrate), ("keep_learning", keep_learning), ("chat", chat)):
            require_bool(value, name)
        kind = config.policy_spec.kind
        records = self.drafter_records(drafter)
        drafter_cls = DRAFTERS.get(drafter)
        if not drafter_cls.proposes_drafts:
            return PolicySetup()
        calibration = None
        if kind.needs_cost_model and (records.costs_needed(config.max_draft_tokens) or recalibrate):
            calibration = self.calibrate(drafter, config.max_draft_tokens, use_saved=not recalibrate)
        if kind.needs_acceptance_head and (records.acceptance_head is None or acceptance_head is not None):
            self.load_acceptance_head(drafter, acceptance_head)
        learned_file, earlier_answers = None, 0
        if kind.learns_answers and keep_learning:
            learned_file = self.calibrations.learned_file(drafter, chat)
            if learned_file is not None and self._learned_from.get(drafter) != learned_file:
                records.forget_answers()
                if not recalibrate:
                    earlier_answers = records.load_learned(learned_file)
                self._learned_from[drafter] = learned_file
        return PolicySetup(calibration, learned_file, earlier_answers)

    @property
    def calibrations(self) -> CalibrationStore:
        """Where these models' measured costs and learned files are kept."""
        return CalibrationStore(self.target, self.draft, self.target_path, self.draft_path)

    def calibrate(
        self, drafter: str, max_draft_tokens: int = 16, context: int = 64, use_saved: bool = True
    ) -> Calibration[CostModel]:
        """The step costs goodput needs (measured once per machine and models), saved or loaded
        (:class:`CalibrationStore`), and kept in ``drafter``'s records."""
        for name, value, least in (("max_draft_tokens", max_draft_tokens, 1), ("context", context, 1)):
            if not is_int(value) or value < least:
                raise ConfigError(f"{name} must be an integer >= {least}, got {value!r}", name)
        require_bool(use_saved, "use_saved")
        calibration = self.calibrations.cost_model(DRAFTERS.get(drafter), max_draft_tokens, context, use_saved)
        self.drafter_records(drafter).use_measured_costs(calibration.cost_model)
        return calibration

    def load_acceptance_head(self, drafter: str, path: str | Path | None = None) -> AcceptanceHead:
        """The SpecDec++ head for ``drafter`` (from ``path``, else the draft model's default location); one
        trained for a draft model of another hidden size raises ``ModelFilesError``."""
        if self.draft_path is None and path is None:
            raise ConfigError("an acceptance head belongs to a draft model, and none is loaded")
        hidden_size = None if self.draft is None else self.draft.hidden_size
        head = AcceptanceHead.load(path or default_head_path(self.draft_path), hidden_size)  # type: ignore[arg-type]
        self.drafter_records(drafter).acceptance_head = head
        return head

    def save_learned(self, drafter: str, setup: PolicySetup) -> None:
        """Write what ``drafter``'s policy learned back to the learned file :meth:`setup_policy` read, if any."""
        if not isinstance(setup, PolicySetup):
            raise ConfigError(f"setup must be the PolicySetup setup_policy returned, got {setup!r}", "setup")
        if setup.learned_file is not None:
            self.drafter_records(drafter).save_learned(setup.learned_file)

    def forget_answers(self) -> None:
        """Drop what adaptive policies learned of earlier answers (acceptance rates, answer lengths);
        what steps cost on this machine stays measured."""
        for records in self.records.values():
            records.forget_answers()

    # -- other runtimes --------------------------------------------------------------------------------

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
            held = (self.target if role == "target" else self.draft).max_context  # a cap carries over
            options = LoadOptions(device=self.target.device, max_context=held)
            return runtime_cls.load_sharing(path, lambda: self.transformers_model(role), options)

        return Pipeline(
            target=load("target", self.target_path),
            tokenizer=self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            target_path=self.target_path,
            draft=load("draft", self.draft_path) if self.draft is not None else None,
            draft_path=self.draft_path,
            _transformers_models=self._transformers_models,
        )

    def transformers_model(self, role: str) -> Any:
        """The transformers model of the target or draft (for peers and references): the runtime's own
        when it is the transformers runtime, else loaded once in fp32 from the model's directory."""
        if role not in ("target", "draft"):
            raise ConfigError(f"role must be 'target' or 'draft', got {role!r}", "role")
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

    # -- prompts ---------------------------------------------------------------------------------------

    def encode(self, prompt: str, chat: bool = False, template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Prompt text -> token ids; ``chat`` wraps it as a user turn of the chat template (``template_kwargs``:
        more variables it reads, as :meth:`encode_chat` takes them)."""
        return encode(self.tokenizer, prompt, chat, template_kwargs)

    def encode_infill(self, prefix: str | list[int], suffix: str) -> list[int]:
        """The prompt asking a code model for the text between ``prefix`` (text or token ids) and ``suffix``, in its
        tokenizer's fill-in-the-middle format; the answer ends at :meth:`infill_end_ids` too."""
        return encode_infill(
            self.tokenizer, prefix if isinstance(prefix, str) else token_ids(prefix, "the prefix"), suffix
        )

    def infill_end_ids(self) -> frozenset[int]:
        """The tokens an infill ends at besides the model's end tokens."""
        found = infill_of(self.tokenizer)
        return found.ends if found is not None else frozenset()

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """A conversation (``role``/``content`` dicts) through the chat template, ready for the assistant's turn;
        ``tools``: OpenAI's function tools, which the template renders; ``template_kwargs``: more variables the
        template reads (``enable_thinking``)."""
        return encode_chat(self.tokenizer, messages, tools, template_kwargs)

    def chat_prefix(self) -> list[int]:
        """The tokens every chat request starts with: what a draft model keeps cached between conversations."""
        return chat_prefix(self.tokenizer)
