"""Where measured costs are kept between runs: one store for a single request's cost model and the batch curve.

A calibration is a JSON file in the calibrations directory named by the hash of everything it depends on (the
models and their builds, the runtime, the threads, the machine, quickdraft's version). Each is loaded when it
is there and usable, else measured and saved, under one lock for the directory: two measurements at once would
each time the other's load, and one that waited finds what the other saved. A file that cannot be used is
measured anew and replaced, and the calibration says why; so is one whose target forward was slower when saved
than it is now (it was timed on busier cores: :func:`busier_problem`, a few forwards to tell). A measurement during
which the machine's load changed is used, but not saved.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Generic

import torch

from quickdraft.costs.calibration import (
    CONTEXT_KS,
    LONG_CONTEXT,
    Costs,
    Measurement,
    busier_problem,
    measure_batch_cost_model,
    measure_cost_model,
    one_token_ms,
    steadiness_problem,
)
from quickdraft.costs.model import BatchCostModel, CostModel
from quickdraft.drafters import DRAFTERS, Drafter
from quickdraft.errors import ConfigError
from quickdraft.files import exclusive_lock, keyed_file, write_atomically
from quickdraft.machine import cpu_description
from quickdraft.runtime.base import Runtime
from quickdraft.version import __version__

CALIBRATION_LOCK = "calibrating.lock"  # in the calibrations directory: held while one calibration is made
BATCH_CONTEXT = 8  # tokens each request holds while a batch is timed (see measure_batch_cost_model)


class CalibrationSource(Enum):
    MEASURED = "measured"
    LOADED = "loaded"
    REMEASURED = "re-measured"  # the saved file could not be used


@dataclass(frozen=True)
class CostKind(Generic[Costs]):
    """A kind of calibration file: its suffix and the field that holds the costs."""

    suffix: str
    field: str
    parse: Callable[[Mapping[str, Any]], Costs]


SINGLE = CostKind(".json", "cost_model", CostModel.from_dict)
BATCH = CostKind(".batch.json", "batch_cost_model", BatchCostModel.from_dict)


@dataclass(frozen=True)
class Calibration(Generic[Costs]):
    """Costs and where they came from: ``MEASURED``, ``LOADED`` from ``path``, or ``REMEASURED`` because the file
    at ``path`` could not be used (``problem`` says why). A measurement is not saved when ``unsteady`` says why it
    is not to be, or when ``path`` cannot be written."""

    cost_model: Costs
    source: CalibrationSource
    path: Path | None = None  # the calibration file read or written; None: not saved
    seconds: float = 0.0  # spent measuring
    saved: bool = False  # the measurement was written to ``path``
    problem: str | None = None  # why a saved file was not used
    unsteady: str | None = None  # why the measurement was not saved (:func:`steadiness_problem`)

    def describe(self) -> str:
        """One line for a user: where the costs came from."""
        if self.source is CalibrationSource.LOADED:
            return f"loaded from {self.path}"
        text = f"calibrated in {self.seconds:.1f} s"
        if self.problem is not None:
            text = f"{self.path} {self.problem}, re-{text}"
        if self.saved:
            text += f", saved to {self.path}"
        elif self.path is not None:
            text += f", not saved ({self.unsteady or f'{self.path} cannot be written'})"
        return text


def load_calibration(path: Path, kind: CostKind[Costs] = SINGLE) -> Costs:  # type: ignore[assignment]
    """The costs saved at ``path``; a missing, unreadable or malformed file raises ``ConfigError``."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        return kind.parse(saved[kind.field])
    except FileNotFoundError:
        raise ConfigError(f"no calibration at {path}") from None
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as error:
        raise ConfigError(f"is not a usable calibration ({type(error).__name__})") from None


def save_calibration(path: Path, key: Mapping[str, Any], costs: CostModel | BatchCostModel, kind: CostKind) -> bool:
    """Write ``costs`` with their ``key`` to ``path``; False if it cannot be written (a cache that cannot be
    written only costs a later re-measure)."""
    try:
        write_atomically(path, json.dumps({"key": dict(key), kind.field: costs.to_dict()}, indent=2))
    except OSError:
        return False
    return True


def calibration_lock(path: Path | None) -> contextlib.AbstractContextManager[None]:
    """Held while a calibration to be saved at ``path`` is looked for, measured and saved (None: not saved,
    nothing to hold)."""
    return contextlib.nullcontext() if path is None else exclusive_lock(path.parent / CALIBRATION_LOCK)


def load_or_measure(
    path: Path | None,
    key: Mapping[str, Any],
    kind: CostKind[Costs],
    measure: Callable[[], Measurement[Costs]],
    use_saved: bool = True,
    check: Callable[[Costs], str | None] = lambda costs: None,
) -> Calibration[Costs]:
    """The costs saved at ``path`` if ``use_saved``, usable and passing ``check`` (what is wrong with them now, or
    None), else ``measure()`` saved there when steady."""
    with calibration_lock(path):
        problem = None
        if use_saved and path is not None and path.exists():
            try:
                saved = load_calibration(path, kind)
            except ConfigError as error:
                problem = str(error)
            else:
                problem = check(saved)
                if problem is None:
                    return Calibration(saved, CalibrationSource.LOADED, path)
        started = time.perf_counter()
        measured = measure()
        seconds = time.perf_counter() - started
        saved = path is not None and measured.unsteady is None and save_calibration(path, key, measured.costs, kind)
        source = CalibrationSource.MEASURED if problem is None else CalibrationSource.REMEASURED
        return Calibration(measured.costs, source, path, seconds, saved, problem, measured.unsteady)


@dataclass(frozen=True)
class CalibrationStore:
    """The calibrations of one target (and draft model) as loaded: what their costs and what goodput learns of
    their answers depend on, and the files that keep them. Models without a path keep nothing."""

    target: Runtime
    draft: Runtime | None
    target_path: Path | None
    draft_path: Path | None

    def cost_model(
        self, drafter_cls: type[Drafter], max_draft_tokens: int = 16, context: int = 64, use_saved: bool = True
    ) -> Calibration[CostModel]:
        """The step costs goodput plans the requests of a ``drafter_cls`` drafter with (:func:`measure_cost_model`,
        measured once and saved)."""
        key = self.single_key(drafter_cls, max_draft_tokens, context)
        path = self.file(key, drafter_cls.needs_draft_model, SINGLE)

        def measure() -> Measurement[CostModel]:
            return measure_cost_model(self.target, self.draft, drafter_cls, max_draft_tokens, context)

        return load_or_measure(path, key, SINGLE, measure, use_saved, self.busier_check(context))

    def batch_cost_model(self, max_rows: int, max_tokens: int, use_saved: bool = True) -> Calibration[BatchCostModel]:
        """The cost of a continuous-batching step (:func:`measure_batch_cost_model`, measured once and saved), up to
        ``max_rows`` requests and ``max_tokens`` tokens in all; the draft model's batched forward too, if one is
        loaded."""
        draft = self.draft  # the draft model's batched forward is timed too, where there is one
        key = self.key(draft is not None, None, 0, BATCH_CONTEXT) | {"batch": [max_rows, max_tokens]}
        path = self.file(key, draft is not None, BATCH)

        def measure() -> Measurement[BatchCostModel]:
            costs = measure_batch_cost_model(self.target, draft, max_rows, max_tokens, BATCH_CONTEXT)
            again_ms = one_token_ms(self.target, BATCH_CONTEXT)
            return Measurement(costs, steadiness_problem(costs.target_ms[1], again_ms))

        return load_or_measure(path, key, BATCH, measure, use_saved, self.busier_check(BATCH_CONTEXT))

    def busier_check(self, context: int) -> Callable[[CostModel | BatchCostModel], str | None]:
        """A saved calibration's check: the target's 1-token forward after ``context`` cached tokens timed now
        (four forwards) against the saved one (:func:`busier_problem`)."""

        def check(costs: CostModel | BatchCostModel) -> str | None:
            now_ms = one_token_ms(self.target, context)
            return busier_problem(costs.target_ms[1], now_ms)

        return check

    def cost_model_file(self, drafter_cls: type[Drafter], max_draft_tokens: int = 16, context: int = 64) -> Path | None:
        """Where :meth:`cost_model` keeps a ``drafter_cls`` drafter's costs (None: not kept)."""
        key = self.single_key(drafter_cls, max_draft_tokens, context)
        return self.file(key, drafter_cls.needs_draft_model, SINGLE)

    def single_key(self, drafter_cls: type[Drafter], max_draft_tokens: int, context: int) -> dict[str, Any]:
        """:meth:`key` of a single request's cost model, which also says what a longer context adds (measured up
        to ``LONG_CONTEXT``: files saved before that was measured are measured again), and as far as the models
        hold positions (a cap, ``max_context``, may stop the timing short of it; past its reach, a cap changes
        nothing timed)."""
        costs = (drafter_cls.needs_draft_model, drafter_cls.target_cost_fraction)
        reach = LONG_CONTEXT + max_draft_tokens + 1
        draft = self.draft if drafter_cls.needs_draft_model else None
        positions = [None if model is None else min(model.max_context, reach) for model in (self.target, draft)]
        key = self.key(*costs, max_draft_tokens, context) | {"long_context": [LONG_CONTEXT, *CONTEXT_KS]}
        return key | {"positions": positions}

    def file(self, key: Mapping[str, Any], uses_draft: bool, kind: CostKind) -> Path | None:
        """The calibration file of ``key``; None for models without a path."""
        if self.target_path is None or (uses_draft and self.draft_path is None):
            return None
        return keyed_file(key, kind.suffix)

    def key(
        self, uses_draft: bool, target_cost_fraction: float | None, max_draft_tokens: int, context: int
    ) -> dict[str, Any]:
        """What measured costs depend on: the models, whether a draft model drafts and what fraction of a target
        step a drafted token costs when the target drafts itself, so drafters that cost alike (the hybrid drafts
        with the draft model) share one calibration."""
        return {
            "target": str(self.target_path),
            "draft": str(self.draft_path) if uses_draft else None,
            "runtime": self.target.name,
            "builds": self.builds(uses_draft),
            "drafter_costs": [uses_draft, target_cost_fraction],
            "max_draft_tokens": max_draft_tokens,
            "context": context,
            "threads": torch.get_num_threads(),
            "machine": cpu_description(),
            "quickdraft": __version__,
        }

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
            "builds": self.builds(uses_draft),
            "drafter": drafter,
            "chat": chat,
        }
        return keyed_file(key, ".learned.json")

    def builds(self, uses_draft: bool) -> dict[str, str | None]:
        """What the models' costs and tokens depend on besides their files (e.g. a draft model in 4 bits)."""
        draft = self.draft.build if uses_draft and self.draft is not None else None
        return {"target": self.target.build, "draft": draft}
