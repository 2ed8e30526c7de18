"""Where a step of the default goes: each engine step's plan, draft, target forward and accept times, by the number
drafted (0: a plain step) and where from (copies; the draft model caught up, or reading a backlog first), on some
bench questions, with the profile measured just before and what each kind of step took over a plain step, per
draft:

    .venv/bin/python results/xeon-167/collapse/step_parts.py QUESTION_IDS [TEMPERATURE]
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from typing import Any

import quickdraft.engine.engine as engine_module
from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions
from quickdraft.bench.run import encode_turn
from quickdraft.config import GenerationConfig, SamplingParams

parts: dict[str, Any] = {}
rows: list[dict[str, Any]] = []
PARTS = ("total", "plan", "draft", "forward", "accept")


def timed(name: str, function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tick = time.perf_counter()
        result = function(*args, **kwargs)
        parts[name] = parts.get(name, 0.0) + 1000 * (time.perf_counter() - tick)
        return result

    return wrapper


def main() -> None:
    Engine = engine_module.Engine
    Engine._plan = timed("plan", Engine._plan)
    draft = timed("draft", Engine._draft)

    def noting_draft(engine: Any, plan: Any) -> Any:
        for bid in plan.bids.values():
            offered = bid.offer is not None and bid.num_draft_tokens > 0
            parts["source"], parts["backlog"] = (bid.offer.source, bid.offer.backlog) if offered else ("plain", 0)
        return draft(engine, plan)

    Engine._draft = noting_draft
    Engine._accept = timed("accept", Engine._accept)
    engine_module.target_forward = timed("forward", engine_module.target_forward)
    step = Engine.step

    def recorded_step(engine: Any) -> Any:
        parts.clear()
        tick = time.perf_counter()
        report = step(engine)
        total = 1000 * (time.perf_counter() - tick)
        running = list(engine.scheduler.running) or last
        if report is not None and running:
            state = running[0]
            gamma = state.stats.proposed_per_step[-1] if state.stats.proposed_per_step else None
            rows.append({"total": total, "gamma": gamma, **parts})
        return report

    last: list[Any] = []
    finish = Engine._finish

    def remembering_finish(engine: Any, state: Any, *args: Any) -> Any:
        last[:] = [state]
        return finish(engine, state, *args)

    Engine._finish = remembering_finish
    Engine.step = recorded_step
    ids = set(sys.argv[1].split(","))
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.7
    sampling = SamplingParams(temperature=temperature, seed=1) if temperature > 0 else SamplingParams()
    pipeline = Pipeline.load()
    costs = pipeline.calibrate("hybrid-suffix", 8, use_saved=False).cost_model
    print(f"profile: target t(1) {costs.target(1):.1f} t(2) {costs.target(2):.1f} t(4) {costs.target(4):.1f} ms, "
          f"drafted token {costs.draft_ms:.1f} ms")  # fmt: skip
    questions = [q for q in load_questions(default_questions_path()) if str(q.question_id) in ids]
    config = GenerationConfig(max_new_tokens=128, sampling=sampling, policy="goodput")
    pipeline.generate("Write a haiku about the sea.", config, drafter="hybrid-suffix")  # warms up
    rows.clear()
    for question in questions:  # once each: the suffix drafter would copy a seeded answer it has seen
        pipeline.generate(encode_turn(pipeline, question, []), config, drafter="hybrid-suffix")
    by_gamma: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        if row["gamma"] is not None:
            caught_up = "" if row["source"] != "model" else " caught up" if row["backlog"] <= 2 else " reading"
            by_gamma[row["source"] + caught_up, row["gamma"]].append(row)
    plain_ms = statistics.median(row["total"] for row in by_gamma["plain", 0])
    for (source, gamma), group in sorted(by_gamma.items()):
        med = {key: statistics.median(row.get(key, 0.0) for row in group) for key in PARTS}
        times = " ".join(f"{key} {ms:.1f}" for key, ms in med.items())
        over = f", over a plain step per draft {(med['total'] - plain_ms) / gamma:.1f}" if gamma else ""
        print(f"{source} drafted {gamma}: {len(group)} steps, median ms {times}{over}")


if __name__ == "__main__":
    main()
