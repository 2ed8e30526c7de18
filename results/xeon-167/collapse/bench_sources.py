"""`quickdraft bench` with every question's steps counted by source (the draft model's drafts, copies, plain steps),
printed to stderr after each answer of the default, to see how a collapsed math answer ran:

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


def counting_run_question(pipeline: Any, method: Any, question: Any, *args: Any, **kwargs: Any) -> Any:
    tally.clear()
    entry = run_question(pipeline, method, question, *args, **kwargs)
    if tally:
        counts = {source: [tally[source, key] for key in ("steps", "drafted", "accepted")] for source, _ in tally}
        print(f"sources {method.name} {question.question_id} {question.category} {counts}", file=sys.stderr, flush=True)
    return entry


if __name__ == "__main__":
    GoodputPolicy.observe = counting_observe  # type: ignore[method-assign]
    bench_run.run_question = counting_run_question
    sys.exit(main(sys.argv[1:]))
