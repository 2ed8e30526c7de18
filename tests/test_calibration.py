"""Calibration: measured cost models, saved and loaded per models and machine."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.costs import CostModel
from quickdraft.costs.calibration import (
    CurveRole,
    busier_problem,
    context_lengths,
    measure_context_costs,
    measure_cost_curve,
    measure_cost_curves,
    measure_prefill_curve,
    prefill_lengths,
)
from quickdraft.costs.store import Calibration, CalibrationSource
from quickdraft.drafters import DRAFTERS
from quickdraft.engine.request import Request
from quickdraft.engine.stream import stream
from quickdraft.errors import ConfigError


@pytest.mark.usefixtures("steady_timings")
def test_a_calibration_is_saved_and_loaded_for_the_same_models(
    pipeline: Pipeline, tmp_path: Path, calibrations_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_paths(target: str, draft: str) -> Pipeline:
        return Pipeline(
            pipeline.target,
            pipeline.tokenizer,
            pipeline.eos_token_ids,
            target_path=tmp_path / target,
            draft=pipeline.draft,
            draft_path=tmp_path / draft,
        )

    first = with_paths("target", "draft")
    calibration = first.calibrate("draft-model", max_draft_tokens=4)
    measured = calibration.cost_model
    saved = first.calibrations.cost_model_file(DRAFTERS.get("draft-model"), max_draft_tokens=4)
    assert saved is not None and saved.parent == calibrations_in_tmp and saved.exists()
    assert (calibration.source, calibration.path, calibration.saved) == (CalibrationSource.MEASURED, saved, True)
    assert first.calibrations.cost_model_file(DRAFTERS.get("prompt-lookup"), 4) != saved  # per drafter
    assert (
        with_paths("target", "other draft").calibrations.cost_model_file(DRAFTERS.get("draft-model"), 4) != saved
    )  # per models
    learned = first.calibrations.learned_file("draft-model")
    with monkeypatch.context() as patch:  # per build (e.g. a draft model in 4 bits): costs and acceptance change
        patch.setattr(first.draft, "build", "the same draft model in another weight format")
        assert first.calibrations.cost_model_file(DRAFTERS.get("draft-model"), 4) != saved
        assert first.calibrations.learned_file("draft-model") != learned
    for runtime in (first.target, first.draft):  # per positions held: a cap (max_context) leaves contexts untimed
        with monkeypatch.context() as patch:
            patch.setattr(runtime, "max_context", runtime.max_context // 2)
            assert first.calibrations.cost_model_file(DRAFTERS.get("draft-model"), 4) != saved
            assert first.calibrations.learned_file("draft-model") == learned  # what answers teach does not change
    files = set()
    for positions in (10_000, 32_768):  # past what is timed (LONG_CONTEXT and a block): one calibration serves both
        with monkeypatch.context() as patch:
            for runtime in (first.target, first.draft):
                patch.setattr(runtime, "max_context", positions)
            files.add(first.calibrations.cost_model_file(DRAFTERS.get("draft-model"), 4))
    assert len(files) == 1

    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured although a saved calibration exists")

    with monkeypatch.context() as patch:  # loading times one forward (busier_check), not the whole model
        patch.setattr("quickdraft.costs.store.measure_cost_model", no_measuring)
        loaded = with_paths("target", "draft").calibrate("draft-model", max_draft_tokens=4)
        assert (loaded.cost_model, loaded.source, loaded.describe()) == (
            measured,
            CalibrationSource.LOADED,
            f"loaded from {saved}",
        )
        with pytest.raises(AssertionError, match="measured although"):  # unless asked to measure again
            with_paths("target", "draft").calibrate("draft-model", max_draft_tokens=4, use_saved=False)
    saved.write_text("{not json")  # a damaged file is measured anew and replaced, and the user is told
    remeasured = with_paths("target", "draft").calibrate("draft-model", max_draft_tokens=4)
    assert remeasured.source is CalibrationSource.REMEASURED and remeasured.cost_model.draft_ms > 0
    assert "is not a usable calibration" in remeasured.describe() and "loaded" not in remeasured.describe()
    assert CostModel.from_dict(json.loads(saved.read_text())["cost_model"]).draft_ms > 0


def test_calibration_measures_a_cost_model(pipeline: Pipeline) -> None:
    fresh = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=pipeline.draft)
    model = fresh.calibrate("draft-model", max_draft_tokens=4).cost_model
    assert sorted(model.target_ms) == [1, 2, 4, 5] and model.draft_ms > 0
    # what a longer context adds, timed up to the tiny model's 512 positions less the longest block
    assert (model.context_tokens, sorted(model.target_context_ms)) == (64, [1, 5])
    assert model.at_context(500).target(5) >= model.target(5)
    assert fresh.calibrate("prompt-lookup", max_draft_tokens=4).cost_model.draft_ms == 0.0
    assert fresh.drafter("draft-model").records.cost_model is model
    for wrong in ({"context": 0}, {"max_draft_tokens": 0}, {"context": 2.5}):
        with pytest.raises(ConfigError, match=rf"{next(iter(wrong))} must be an integer >= 1"):
            fresh.calibrate("draft-model", **wrong)  # type: ignore[arg-type]


def test_a_request_that_may_verify_more_drafts_than_were_measured_measures_them(pipeline: Pipeline) -> None:
    """goodput's measured costs hold for the requests that follow whatever came first: a wider request measures
    them anew, through setup_policy or the engine; a narrower one uses them; a cost model a caller set is kept."""
    fresh = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=pipeline.draft)
    records = fresh.drafter("draft-model").records
    fresh.setup_policy("draft-model", GenerationConfig(max_draft_tokens=2))
    assert max(records.cost_model.target_ms) == 3  # type: ignore[union-attr]
    fresh.setup_policy("draft-model", GenerationConfig(max_draft_tokens=4))
    wider = records.cost_model
    assert max(wider.target_ms) == 5  # type: ignore[union-attr]
    fresh.setup_policy("draft-model", GenerationConfig(max_draft_tokens=3))
    assert records.cost_model is wider
    wide = GenerationConfig(max_new_tokens=4, max_draft_tokens=6)
    request = Request(tuple(fresh.encode("w1 w2")), wide, fresh.drafter("draft-model"))
    stream(fresh.engine, request).finish()  # the engine's own path, without setup_policy
    assert max(records.cost_model.target_ms) == 7  # type: ignore[union-attr]
    given = CostModel({1: 10.0, 2: 11.0}, draft_ms=1.0)
    records.cost_model = given
    fresh.setup_policy("draft-model", wide)
    fresh.generate("w1 w2", wide, drafter="draft-model")
    assert records.cost_model is given


def test_cost_curve_rolls_back_to_the_context(pipeline) -> None:
    curve = measure_cost_curve(pipeline.target, range(1, 4), context=10, repeats=2)
    assert sorted(curve) == [1, 2, 3] and all(ms > 0 for ms in curve.values())
    with pytest.raises(ConfigError, match="exceeds"):
        measure_cost_curve(pipeline.target, [8], context=pipeline.target.max_context)


def test_cost_curves_take_turns_and_keep_the_fastest_run(pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow spell must slow one repeat of every curve, not one whole curve (it skews their ratio)."""
    calls: list[tuple[str, int]] = []
    for role, runtime in (("target", pipeline.target), ("draft", pipeline.draft)):
        forward = runtime.forward

        def recorded(token_ids, cache, last_only=False, role=role, forward=forward):
            calls.append((role, int(token_ids.shape[1])))
            return forward(token_ids, cache, last_only)

        monkeypatch.setattr(runtime, "forward", recorded)
    runtimes = {"target": pipeline.target, "draft": pipeline.draft}
    curves = measure_cost_curves(runtimes, {"target": [1, 2], "draft": [1]}, context=10, repeats=2, warmup=1)
    assert sorted(curves["target"]) == [1, 2] and sorted(curves["draft"]) == [1]
    one_repeat = [("target", 1), ("draft", 1), ("target", 2)]
    assert calls == [("target", 10), ("draft", 10)] + one_repeat * 3  # the contexts, then warm-up and 2 repeats
    times = iter([5.0, 1.0, 5.0, 9.0, 2.0, 9.0, 3.0, 3.0, 3.0])  # seconds per timed call, in order
    clock = {"now": 0.0}

    def fake_clock() -> float:
        clock["now"] += next(times) if clock.setdefault("started", False) else 0.0
        clock["started"] = not clock["started"]
        return clock["now"]

    monkeypatch.setattr("quickdraft.costs.calibration.time.perf_counter", fake_clock)
    curves = measure_cost_curves(runtimes, {"target": [1, 2], "draft": [1]}, context=10, repeats=2, warmup=1)
    assert curves == {"target": {1: 3000.0, 2: 3000.0}, "draft": {1: 2000.0}}  # the warm-up's 5, 1, 5 s dropped


def test_prefill_curve_reads_into_empty_caches(pipeline) -> None:
    draft = pipeline.draft
    curve = measure_prefill_curve(draft, prefill_lengths(draft, (16, 4, 10**6)), repeats=2)
    assert sorted(curve) == [4, 16, draft.max_context] and all(ms > 0 for ms in curve.values())
    with pytest.raises(ConfigError, match="prefill curve"):
        measure_prefill_curve(draft, [draft.max_context + 1])


@pytest.mark.usefixtures("steady_timings")
@pytest.mark.parametrize("bad_time", ["NaN", "Infinity"])
def test_a_calibration_file_with_times_that_are_not_finite_is_measured_anew(
    bad_time: str, pipeline: Pipeline, tmp_path: Path
) -> None:
    """JSON allows NaN and Infinity: such a file once loaded as a cost model that never drafts."""
    located = located_pipeline(pipeline, tmp_path)
    path = located.calibrations.cost_model_file(DRAFTERS.get("draft-model"), max_draft_tokens=4)
    assert path is not None
    path.parent.mkdir(parents=True)
    cost_model = f'{{"target_ms": {{"1": {bad_time}, "2": 60.0}}, "draft_ms": 5.0, "draft_prefill_ms": {{}}}}'
    path.write_text(f'{{"key": {{}}, "cost_model": {cost_model}}}')
    calibration = located.calibrate("draft-model", max_draft_tokens=4)
    assert (
        calibration.source is CalibrationSource.REMEASURED
        and f"{path} is not a usable calibration" in calibration.describe()
    )
    assert "loaded" not in calibration.describe()
    assert all(math.isfinite(ms) for ms in calibration.cost_model.target_ms.values())
    assert located.drafter_records("draft-model").cost_model is calibration.cost_model
    assert calibration.saved and CostModel.from_dict(json.loads(path.read_text())["cost_model"]).target_ms[1] > 0


@pytest.mark.parametrize("saved_ms, source", [(1e5, CalibrationSource.REMEASURED), (1e-6, CalibrationSource.LOADED)])
def test_a_calibration_saved_on_busier_cores_is_measured_again(
    saved_ms: float, source: CalibrationSource, pipeline: Pipeline, tmp_path: Path
) -> None:
    """A saved 1-token forward far slower than now's was timed while other work ran; one faster than now's is this
    run's load, and stands."""
    located = located_pipeline(pipeline, tmp_path)
    path = located.calibrations.cost_model_file(DRAFTERS.get("draft-model"), max_draft_tokens=4)
    assert path is not None
    path.parent.mkdir(parents=True)
    target_ms = {"1": saved_ms, "2": saved_ms * 1.1, "4": saved_ms * 1.2, "5": saved_ms * 1.3}
    cost_model = {"target_ms": target_ms, "draft_ms": saved_ms / 4, "draft_prefill_ms": {}}
    path.write_text(json.dumps({"key": {}, "cost_model": cost_model}))
    calibration = located.calibrate("draft-model", max_draft_tokens=4)
    assert calibration.source is source
    if source is CalibrationSource.REMEASURED:
        assert f"{path} was timed on busier cores" in calibration.describe()
        assert calibration.cost_model.target_ms[1] < saved_ms
    else:
        assert calibration.cost_model.target_ms[1] == saved_ms


def test_busier_problem_only_for_a_saved_forward_slower_than_now() -> None:
    assert busier_problem(saved_ms=20.0, now_ms=20.0) is None
    assert busier_problem(saved_ms=25.0, now_ms=20.0) is None  # within STEADY_TOLERANCE
    assert busier_problem(saved_ms=20.0, now_ms=40.0) is None  # busier now: the saved costs stand
    problem = busier_problem(saved_ms=40.0, now_ms=20.0)
    assert problem is not None and "40.0 ms then, 20.0 ms now" in problem


def located_pipeline(pipeline: Pipeline, tmp_path: Path) -> Pipeline:
    """The tiny models as if loaded from directories: their calibrations are saved."""
    return Pipeline(
        pipeline.target,
        pipeline.tokenizer,
        pipeline.eos_token_ids,
        target_path=tmp_path / "target",
        draft=pipeline.draft,
        draft_path=tmp_path / "draft",
    )


def on_a_fake_clock(pipeline: Pipeline, load: Callable[[float], float], monkeypatch: pytest.MonkeyPatch) -> None:
    """Forwards take 20 ms (target) or 5 ms (draft) plus 1 ms a token of fake time, ``load(now in ms)`` times
    as long while other work shares the machine."""
    clock = {"now": 0.0}
    monkeypatch.setattr("quickdraft.costs.calibration.time.perf_counter", lambda: clock["now"])
    for runtime, base_ms in ((pipeline.target, 20.0), (pipeline.draft, 5.0)):

        def timed(token_ids, cache, last_only=False, forward=runtime.forward, base_ms=base_ms):
            clock["now"] += (base_ms + token_ids.shape[1]) * load(1000 * clock["now"]) / 1000
            return forward(token_ids, cache, last_only)

        monkeypatch.setattr(runtime, "forward", timed)


def test_a_calibration_measured_on_a_steady_machine_is_saved(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_a_fake_clock(pipeline, lambda now_ms: 1.0, monkeypatch)
    located = located_pipeline(pipeline, tmp_path)
    calibration = located.calibrate("draft-model", max_draft_tokens=4)
    assert calibration.saved and calibration.describe().endswith(f"saved to {calibration.path}")
    assert calibration.cost_model.target_ms == pytest.approx({1: 21.0, 2: 22.0, 4: 24.0, 5: 25.0})


@pytest.mark.parametrize(
    "load",
    [lambda now_ms: 3.0 if now_ms >= 300 else 1.0, lambda now_ms: 3.0 if now_ms < 1500 else 1.0],
    ids=["work-that-starts", "work-that-ends"],
)
def test_a_calibration_measured_while_the_load_changed_is_used_but_not_saved(
    load: Callable[[float], float], pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs calibrating at once saved a target 45 times too slow, which then kept every later run from
    drafting: the target's 1-token forward is timed again at the end, and a calibration whose two timings
    disagree is used by this run but not saved."""
    on_a_fake_clock(pipeline, load, monkeypatch)
    located = located_pipeline(pipeline, tmp_path)
    calibration = located.calibrate("draft-model", max_draft_tokens=4)
    assert calibration.source is CalibrationSource.MEASURED and not calibration.saved
    assert calibration.path is not None and not calibration.path.exists()
    assert "not saved (" in calibration.describe() and "the machine's load changed" in calibration.describe()
    assert located.drafter_records("draft-model").cost_model is calibration.cost_model
    on_a_fake_clock(pipeline, lambda now_ms: 1.0, monkeypatch)
    again = located.calibrate("draft-model", max_draft_tokens=4)  # the next run measures, on a steady machine
    assert again.source is CalibrationSource.MEASURED and again.saved


@pytest.mark.usefixtures("steady_timings")
def test_runs_calibrating_at_once_take_turns_and_the_second_loads_the_first(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second run waits for the first one's calibration (a lock beside the calibrations) instead of
    measuring while it runs, and then loads what the first one saved."""
    results: dict[str, Calibration | BaseException] = {}

    def calibrate(name: str) -> None:
        try:
            results[name] = located_pipeline(pipeline, tmp_path).calibrate("draft-model", max_draft_tokens=4)
        except BaseException as error:
            results[name] = error

    second = threading.Thread(target=calibrate, args=("second",))
    forward = pipeline.target.forward

    def start_the_second_run_first(token_ids, cache, last_only=False):
        if not second.is_alive() and "second" not in results:  # in the first run's first forward
            second.start()
            second.join(timeout=1.0)  # it runs to its end unless it waits for the first
        return forward(token_ids, cache, last_only)

    monkeypatch.setattr(pipeline.target, "forward", start_the_second_run_first)
    calibrate("first")
    second.join(timeout=120)
    first, loaded = results["first"], results["second"]
    assert isinstance(first, Calibration) and first.source is CalibrationSource.MEASURED and first.saved
    assert isinstance(loaded, Calibration) and loaded.source is CalibrationSource.LOADED
    assert loaded.cost_model == first.cost_model


def test_context_costs_are_timed_where_the_model_has_room_for_them(pipeline) -> None:
    assert context_lengths(pipeline.target, 64, 5) == (64, 507)  # 512 positions, less a block of 5
    assert context_lengths(pipeline.target, 200, 5) is None  # too close to tell a longer context apart
    runtimes = {CurveRole.TARGET: pipeline.target, CurveRole.DRAFT: pipeline.draft}
    costs = measure_context_costs(runtimes, {CurveRole.TARGET: [1, 3], CurveRole.DRAFT: [1]}, (16, 400), repeats=1)
    assert set(costs) == {CurveRole.TARGET_CONTEXT, CurveRole.DRAFT_CONTEXT}
    assert sorted(costs[CurveRole.TARGET_CONTEXT]) == [1, 3] and all(
        ms >= 0 for ms in costs[CurveRole.DRAFT_CONTEXT].values()
    )
