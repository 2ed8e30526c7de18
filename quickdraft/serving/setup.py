"""A batched engine over a loaded pipeline, with the measured costs goodput plans shared steps with."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from quickdraft.api import Pipeline
from quickdraft.calibration import (
    calibration_lock,
    measure_batch_cost_model,
    measure_cost_curve,
    steadiness_problem,
)
from quickdraft.config import GenerationConfig
from quickdraft.costs import BatchCostModel
from quickdraft.drafters.base import DrafterOptions
from quickdraft.errors import ConfigError
from quickdraft.memory import keyed_file, write_atomically
from quickdraft.serving.engine import BatchEngine
from quickdraft.serving.scheduler import SchedulerSettings

BATCH_CONTEXT = 8  # tokens each request holds while a batch is timed (see measure_batch_cost_model)


@dataclass(frozen=True)
class BatchCalibration:
    cost_model: BatchCostModel
    source: str  # "loaded" | "measured"
    path: Path | None
    seconds: float = 0.0
    unsteady: str | None = None  # why the measurement was not saved

    def describe(self) -> str:
        costs = self.cost_model
        largest = max(costs.target_ms)
        curve = f"target {costs.target(1):.0f} ms for 1 token, {costs.target(largest):.0f} ms for {largest}"
        if costs.draft_ms:
            rows = max(costs.draft_ms)
            curve += f"; a draft forward {costs.draft(1):.0f} ms for 1 request, {costs.draft(rows):.0f} ms for {rows}"
        if self.source == "loaded":
            return f"batch costs loaded from {self.path}: {curve}"
        saved = f"saved to {self.path}"
        if self.unsteady or self.path is None:
            saved = f"not saved ({self.unsteady or 'no models directory'})"
        return f"batch costs measured in {self.seconds:.1f} s, {saved}: {curve}"


def batch_calibration(
    pipeline: Pipeline, max_rows: int, max_tokens: int, recalibrate: bool = False
) -> BatchCalibration:
    """The batch cost curve of the pipeline's models on this machine: loaded from the calibrations directory, or
    measured (a few seconds to a minute on the default pair) and saved there when the load held steady."""
    drafter = "draft-model" if pipeline.draft is not None else "prompt-lookup"
    key = pipeline.calibration_key(drafter, 0, BATCH_CONTEXT) | {"batch": [max_rows, max_tokens]}
    path = keyed_file(key, ".batch.json") if pipeline.target_path is not None else None
    with calibration_lock(path):
        if path is not None and path.exists() and not recalibrate:
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                return BatchCalibration(BatchCostModel.from_dict(saved["batch_cost_model"]), "loaded", path)
            except (OSError, ValueError, KeyError, TypeError, ConfigError):
                pass  # measured anew and replaced below
        started = time.perf_counter()
        costs = measure_batch_cost_model(pipeline.target, pipeline.draft, max_rows, max_tokens, BATCH_CONTEXT)
        again_ms = measure_cost_curve(pipeline.target, [1], BATCH_CONTEXT)[1]
        unsteady = steadiness_problem(costs.target_ms[1], again_ms)
        if path is not None and unsteady is None:
            text = json.dumps({"key": key, "batch_cost_model": costs.to_dict()}, indent=2)
            try:
                write_atomically(path, text)
            except OSError:
                path = None
        return BatchCalibration(costs, "measured", path, time.perf_counter() - started, unsteady)


def serving_engine(
    pipeline: Pipeline,
    settings: SchedulerSettings,
    max_draft_tokens: int = 16,
    options: DrafterOptions | None = None,
    recalibrate: bool = False,
    batch_costs: BatchCostModel | None = None,
) -> tuple[BatchEngine, list[str]]:
    """A batched engine for the pipeline's models and what was done to prepare it (lines for a user).

    Every served drafter's memory is made ready for goodput, which any request may ask for (its single-request
    costs loaded or measured), and the batch cost curve is loaded or measured (unless ``batch_costs`` is given),
    up to ``max_running`` requests and as many tokens as a step of them with a prompt chunk holds."""
    notes = []
    drafters = ["prompt-lookup"] + (["hybrid", "draft-model"] if pipeline.draft is not None else [])
    goodput = GenerationConfig(policy="goodput", max_draft_tokens=max_draft_tokens)  # any request may ask for it
    for drafter in drafters:
        preparation = pipeline.prepare(drafter, goodput, recalibrate=recalibrate)
        if preparation.calibration is not None:
            notes.append(f"[{drafter}] {preparation.calibration.describe()}")
    if batch_costs is None:
        max_tokens = settings.max_running + settings.prefill_tokens_per_step
        calibration = batch_calibration(pipeline, settings.max_running, max_tokens, recalibrate)
        batch_costs = calibration.cost_model
        notes.append(calibration.describe())
    memories = {drafter: pipeline.memory(drafter) for drafter in [*drafters, "none"]}
    engine = BatchEngine(
        pipeline.target,
        pipeline.tokenizer,
        pipeline.eos_token_ids,
        draft=pipeline.draft,
        memories=memories,
        batch_costs=batch_costs,
        settings=settings,
        options=options,
    )
    return engine, notes
