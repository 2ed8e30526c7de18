"""`quickdraft bench` with every question's steps counted by source (the draft model's drafts, copies, plain steps),
printed to stderr after each answer of the default ("sources ..."), and what goodput had learned of the drafter's
step times before and after it ("costs ..."), to see how a collapsed math answer ran:

    .venv/bin/python results/xeon-167/collapse/bench_sources.py bench --per-category 5 ... 2> sources.txt
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import quickdraft.bench.run as bench_run
from quickdraft.cli import main
from quickdraft.policies.goodput import GoodputPolicy

sys.path.insert(0, str(Path(__file__).parents[1]))  # draft_sources.py, the probe beside, has the per-source hook
from draft_sources import counting_observe, tally

run_question = bench_run.run_question


def print_costs(pipeline: Any, method: Any, question: Any, when: str) -> None:
    records = pipeline.records.get("hybrid-suffix")
    if records is not None and method.name == "hybrid-suffix+goodput":
        times = records.step_times
        learned = f"drafted token {times.draft_token_ms} ms ({times.num_drafting_steps} steps timed)"
        plain = f"plain step {times.plain_step_ms} ms ({times.num_plain_steps})"
        print(f"\ncosts {when} {question.question_id}: {learned}, {plain}", file=sys.stderr, flush=True)


def counting_run_question(pipeline: Any, method: Any, question: Any, *args: Any, **kwargs: Any) -> Any:
    tally.clear()
    print_costs(pipeline, method, question, "before")
    entry = run_question(pipeline, method, question, *args, **kwargs)
    print_costs(pipeline, method, question, "after")
    if tally:
        counts = {source: [tally[source, key] for key in ("steps", "drafted", "accepted")] for source, _ in tally}
        line = f"sources {method.name} {question.question_id} {question.category} {counts}"
        print(f"\n{line}", file=sys.stderr, flush=True)
    return entry


if __name__ == "__main__":
    GoodputPolicy.observe = counting_observe  # type: ignore[method-assign]
    bench_run.run_question = counting_run_question
    sys.exit(main(sys.argv[1:]))
