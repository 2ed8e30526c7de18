"""A server made from its options: the models loaded, the engine over them with what every drafter's policies need
made ready first, and the app over its loop. ``quickdraft serve`` makes one; each Ray Serve replica makes its own."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.costs import BatchCostModel
from quickdraft.costs.calibration import COST_CONTEXT, most_measured_drafts
from quickdraft.costs.store import BATCH_CONTEXT, Calibration
from quickdraft.drafters import DRAFTERS
from quickdraft.engine import Engine, SchedulerSettings
from quickdraft.engine.prefix_cache import PrefixCache
from quickdraft.errors import ConfigError, QuickdraftError
from quickdraft.models.convert import gguf_source
from quickdraft.prompts import check_template_kwargs
from quickdraft.runtime.device import resolve_device
from quickdraft.server.access import MAX_BODY_MB, OPEN, REQUEST_TIMEOUT_S, Access
from quickdraft.server.loop import ServingLoop
from quickdraft.server.memory import position_budget
from quickdraft.server.protocol import ServerDefaults


@dataclass(frozen=True)
class ServerOptions:
    """What a server serves and how (``quickdraft serve``'s options, checked once at the edge)."""

    target: str
    draft: str | None  # None: the default draft model where the default drafter needs one
    runtime: str
    scheduler: SchedulerSettings
    drafter: str
    policy: str | None = None
    max_draft_tokens: int = 16
    prefix_cache_mb: int = 1024
    recalibrate: bool = False
    draft_weights: str | None = None
    draft_vocabulary: int | None = None
    draft_head: str | None = None
    served_model_name: str | None = None
    default_max_tokens: int = 256
    device: str = "auto"  # where the models run (runtime/device.py)
    access: Access = OPEN  # who may use the server, how much a request may ask (server/access.py)
    kv_cache_mb: int | None = None  # the running requests' caches (server/memory.py; None: a share of what is free)
    memory_share: float = 1.0  # this server's share of the machine's memory (a replica's: one of N)
    chat_template: str | None = None  # Jinja text in place of the target's chat template (--chat-template's)
    split_reasoning: bool = True  # a thinking model's reasoning to reasoning_content (--reasoning-format auto)
    chat_template_kwargs: dict[str, Any] | None = None  # every conversation's template variables (a request's win)
    kv_cache_dtype: str | None = None  # what the native KV caches hold (None: KV_CACHE_DEFAULT)
    max_context: int | None = None  # the most positions a request holds (None: the target's declared context)

    def __post_init__(self) -> None:
        GenerationConfig(policy=self.policy, max_draft_tokens=self.max_draft_tokens)  # a bad policy fails here
        if self.prefix_cache_mb < 0:
            raise ConfigError(f"--prefix-cache-mb must be >= 0, got {self.prefix_cache_mb}")
        if self.kv_cache_mb is not None and self.kv_cache_mb < 0:
            raise ConfigError(f"--kv-cache-mb must be >= 0 (0: no bound), got {self.kv_cache_mb}")
        if self.default_max_tokens < 1:
            raise ConfigError(f"--default-max-tokens must be >= 1, got {self.default_max_tokens}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ConfigError("--served-model-name must not be empty: clients send it as `model`")
        resolve_device(self.device)  # a GPU that is not there fails before any model is resolved
        DRAFTERS.get(self.drafter)  # an unknown name fails here
        loads_draft = self.draft is not None or DRAFTERS.get(self.drafter).needs_draft_model
        if not loads_draft and (self.draft_weights is not None or self.draft_vocabulary is not None):
            raise ConfigError(
                f"--draft-weights and --draft-vocabulary set how the draft model loads, and the {self.drafter} "
                "drafter loads none: drop them, or name one with --draft"
            )

    @classmethod
    def from_args(cls, args: Any) -> ServerOptions:
        settings = SchedulerSettings(args.max_running, args.max_waiting, args.prefill_tokens_per_step)
        return cls(
            args.target, args.draft, args.runtime, settings, args.drafter, args.policy, args.max_draft_tokens,
            args.prefix_cache_mb, args.recalibrate, args.draft_weights, args.draft_vocabulary, args.draft_head,
            getattr(args, "served_model_name", None), getattr(args, "default_max_tokens", 256), args.device,
            Access.from_args(
                getattr(args, "api_key", None), getattr(args, "metrics_public", False),
                getattr(args, "max_body_mb", MAX_BODY_MB), getattr(args, "request_timeout", REQUEST_TIMEOUT_S),
            ),
            getattr(args, "kv_cache_mb", None),
            split_reasoning=getattr(args, "reasoning_format", "auto") == "auto",
            chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
            kv_cache_dtype=getattr(args, "kv_cache_dtype", None), max_context=getattr(args, "max_context", None),
        )  # fmt: skip


@dataclass
class Server:
    app: Any  # the FastAPI app
    loop: ServingLoop
    model_names: tuple[str, ...]
    notes: list[str]  # what was done to get it ready, for a user


def build_server(options: ServerOptions, own_thread: bool) -> Server:
    """Load the models and make the engine, its loop (stepping in a thread of its own, or on the caller's thread
    through ``loop.run()``) and the app."""
    from quickdraft.models import DEFAULT_DRAFT
    from quickdraft.server.app import create_app

    draft = options.draft or (DEFAULT_DRAFT if DRAFTERS.get(options.drafter).needs_draft_model else None)
    pipeline = Pipeline.load(
        options.target, draft, options.runtime,
        draft_weights=options.draft_weights, draft_vocabulary=options.draft_vocabulary, device=options.device,
        chat_template=options.chat_template, kv_cache_dtype=options.kv_cache_dtype, max_context=options.max_context,
    )  # fmt: skip
    pipeline.draft_head = Path(options.draft_head) if options.draft_head else None
    pipeline.drafter(options.drafter)  # a default drafter these models cannot run fails here
    check_template_kwargs(pipeline.tokenizer, options.chat_template_kwargs)  # before any request meets them
    engine, notes = serving_engine(
        pipeline, options.scheduler, options.max_draft_tokens, options.recalibrate,
        prefix_cache_mb=options.prefix_cache_mb, kv_cache_mb=options.kv_cache_mb, memory_share=options.memory_share,
    )  # fmt: skip
    if pipeline.bridge is not None:
        notes = [pipeline.pairing(), *notes]
    names = model_names(pipeline, options.served_model_name)
    defaults = ServerDefaults(
        names, options.drafter, options.policy, options.default_max_tokens, max_draft_tokens=options.max_draft_tokens,
        split_reasoning=options.split_reasoning, template_kwargs=options.chat_template_kwargs,
    )  # fmt: skip
    loop = ServingLoop(engine, own_thread=own_thread)
    return Server(create_app(pipeline, loop, defaults, options.access), loop, names, notes)


def model_names(pipeline: Pipeline, served_name: str | None) -> tuple[str, ...]:
    """What ``model`` may say: the served name first, and the target's own: a packaged model's name, a GGUF file's
    name without ``.gguf`` (``hf:`` downloads included), else its directory's name."""
    path = pipeline.target_path
    if path is None:
        name = "target"
    elif path.parent.parent.name == "converted" and (source := gguf_source(path)) is not None:
        name = source.stem
    else:
        name = path.parent.name if path.name == "hf" else path.name
    return (served_name, name) if served_name else (name,)


def servable_drafters(pipeline: Pipeline) -> list[str]:
    """The drafters these models can run (a draft model's need one; early exit needs a runtime that exits early)."""
    names = []
    for name in DRAFTERS.names():
        with contextlib.suppress(QuickdraftError):
            pipeline.drafter(name)
            names.append(name)
    return names


def serving_engine(
    pipeline: Pipeline,
    settings: SchedulerSettings,
    max_draft_tokens: int = 16,
    recalibrate: bool = False,
    batch_costs: BatchCostModel | None = None,
    prefix_cache_mb: int = 0,
    kv_cache_mb: int | None = None,
    memory_share: float = 1.0,
) -> tuple[Engine, list[str]]:
    """An engine for the pipeline's models and what was done to get it ready (lines for a user).

    Any request may ask for goodput, so every servable drafter's costs are loaded or measured now (measuring
    while serving would stall every request and time a loaded machine), and a draft model's SpecDec++ head is
    loaded where one was trained. The batch cost curve goodput plans shared steps with is loaded or measured
    (unless ``batch_costs`` is given), up to ``max_running`` requests and as many tokens as a step of them with
    a prompt chunk holds. ``prefix_cache_mb`` > 0 keeps finished requests' caches for prompts that start alike
    (where the runtime's cached prefixes are exact). The running requests reserve their caches' positions within
    ``kv_cache_mb`` (:func:`position_budget`), unless ``settings`` bounds them already."""
    notes = []
    if max_draft_tokens > (most := most_measured_drafts(pipeline.target.max_context)):  # any request may ask goodput
        held = pipeline.target.max_context
        bound = f"max_draft_tokens is at most {most} for this target" if most >= 1 else "this target is too short"
        fix = "" if most >= 1 else f": a server needs {COST_CONTEXT + 2} at least, for max_draft_tokens 1"
        raise ConfigError(
            f"{bound}: goodput's costs are measured that far, a step of {max_draft_tokens + 1} tokens after "
            f"{COST_CONTEXT} cached ones, and it holds {held} positions{fix}",
            "max_draft_tokens" if most >= 1 else "max_context",
        )
    goodput = GenerationConfig(policy="goodput", max_draft_tokens=max_draft_tokens)
    for name in servable_drafters(pipeline):
        setup = pipeline.setup_policy(name, goodput, recalibrate=recalibrate)
        if setup.calibration is not None:
            notes.append(f"[{name}] {setup.calibration.describe()}")
        if DRAFTERS.get(name).needs_draft_model:
            with contextlib.suppress(QuickdraftError):  # none trained: specdec++ requests are refused, saying so
                pipeline.load_acceptance_head(name)
    if batch_costs is None:
        room = pipeline.target.max_context - BATCH_CONTEXT  # a request's tokens in a step: at most its context's
        max_tokens = min(settings.max_running + settings.prefill_tokens_per_step, settings.max_running * room)
        calibration = pipeline.calibrations.batch_cost_model(settings.max_running, max_tokens, not recalibrate)
        batch_costs = calibration.cost_model
        notes.append(f"batch costs {calibration.describe()}: {describe_curve(calibration)}")
    prefix_cache = None
    if prefix_cache_mb > 0 and pipeline.target.reusable_prefixes:
        target = pipeline.target
        prefix_cache = PrefixCache(prefix_cache_mb * 2**20, target.cache_bytes, target.copy_prefix)
        notes.append(
            f"prefix cache: {prefix_cache_mb} MB, up to {prefix_cache_mb * 2**20 // target.kv_bytes_per_token:,} tokens"
        )
    elif prefix_cache_mb > 0:
        notes.append(f"prefix cache off: the {pipeline.target.name} runtime's cached prefixes would not be exact")
    if settings.max_positions is None:  # measured now: the models are loaded and calibrated
        per_position = pipeline.target.kv_bytes_per_token + (pipeline.draft.kv_bytes_per_token if pipeline.draft else 0)
        on_host = pipeline.target.device.type == "cpu"
        positions, note = position_budget(kv_cache_mb, per_position, prefix_cache_mb, memory_share, on_host)
        settings = dataclasses.replace(settings, max_positions=positions)
        notes.append(note)
    engine = Engine(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, settings, batch_costs, prefix_cache)
    return engine, notes


def describe_curve(calibration: Calibration[BatchCostModel]) -> str:
    costs = calibration.cost_model
    largest = max(costs.target_ms)
    curve = f"target {costs.target(1):.0f} ms for 1 token, {costs.target(largest):.0f} ms for {largest}"
    if costs.draft_ms:
        rows = max(costs.draft_ms)
        curve += f"; a draft forward {costs.draft(1):.0f} ms for 1 request, {costs.draft(rows):.0f} ms for {rows}"
    return curve
