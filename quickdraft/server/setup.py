"""The server's engine over a loaded pipeline, with what every drafter's policies need made ready first."""

from __future__ import annotations

import contextlib

from quickdraft.api import Pipeline
from quickdraft.calibration_store import Calibration
from quickdraft.config import GenerationConfig
from quickdraft.costs import BatchCostModel
from quickdraft.drafters import DRAFTERS
from quickdraft.engine import Engine, SchedulerSettings
from quickdraft.engine.prefix_cache import PrefixCache
from quickdraft.errors import QuickdraftError


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
) -> tuple[Engine, list[str]]:
    """An engine for the pipeline's models and what was done to get it ready (lines for a user).

    Any request may ask for goodput, so every servable drafter's costs are loaded or measured now (measuring
    while serving would stall every request and time a loaded machine), and a draft model's SpecDec++ head is
    loaded where one was trained. The batch cost curve goodput plans shared steps with is loaded or measured
    (unless ``batch_costs`` is given), up to ``max_running`` requests and as many tokens as a step of them with
    a prompt chunk holds. ``prefix_cache_mb`` > 0 keeps finished requests' caches for prompts that start alike
    (where the runtime's cached prefixes are exact)."""
    notes = []
    goodput = GenerationConfig(policy="goodput", max_draft_tokens=max_draft_tokens)
    for name in servable_drafters(pipeline):
        setup = pipeline.setup_policy(name, goodput, recalibrate=recalibrate)
        if setup.calibration is not None:
            notes.append(f"[{name}] {setup.calibration.describe()}")
        if DRAFTERS.get(name).needs_draft_model:
            with contextlib.suppress(QuickdraftError):  # none trained: specdec++ requests are refused, saying so
                pipeline.load_acceptance_head(name)
    if batch_costs is None:
        max_tokens = settings.max_running + settings.prefill_tokens_per_step
        calibration = pipeline.calibrations.batch_cost_model(settings.max_running, max_tokens, not recalibrate)
        batch_costs = calibration.cost_model
        notes.append(f"batch costs {calibration.describe()}: {describe_curve(calibration)}")
    prefix_cache = None
    if prefix_cache_mb > 0 and pipeline.target.reusable_prefixes:
        per_token = pipeline.target.kv_bytes_per_token
        prefix_cache = PrefixCache(prefix_cache_mb * 2**20, per_token)
        notes.append(f"prefix cache: {prefix_cache_mb} MB, {prefix_cache_mb * 2**20 // per_token} tokens")
    elif prefix_cache_mb > 0:
        notes.append(f"prefix cache off: the {pipeline.target.name} runtime's cached prefixes would not be exact")
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
