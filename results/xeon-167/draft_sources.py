"""Which source the default's drafts came from, greedy against seeded T 0.7, on some Spec-Bench categories: a probe
(it wraps GoodputPolicy.observe to count each step's outcome by its bid's offer source), kept beside its output.

    .venv/bin/python results/xeon-167/draft_sources.py rag,summarization
"""

from __future__ import annotations

import collections
import json
import sys

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.policies import StepOutcome
from quickdraft.policies.goodput import GoodputPolicy

COUNTS = ("steps", "drafted", "judged", "accepted")
tally: collections.Counter[tuple[str, str]] = collections.Counter()
observe_outcome = GoodputPolicy.observe


def counting_observe(policy: GoodputPolicy, outcome: StepOutcome) -> None:
    offer = outcome.bid.offer
    source = offer.source if offer is not None and outcome.num_drafted else "plain"
    tally[source, "steps"] += 1
    tally[source, "drafted"] += outcome.num_drafted
    tally[source, "judged"] += outcome.num_judged
    tally[source, "accepted"] += outcome.num_accepted
    observe_outcome(policy, outcome)


def main() -> None:
    GoodputPolicy.observe = counting_observe  # type: ignore[method-assign]
    pipeline = Pipeline.load()
    categories = sys.argv[1].split(",")
    questions = sample_questions(load_questions(default_questions_path()), 5, 0)
    prompts = [pipeline.encode(q.turns[0], chat=True) for q in questions if q.category in categories]
    for mode, sampling in (("greedy", SamplingParams()), ("seeded0.7", SamplingParams(temperature=0.7, seed=1))):
        tally.clear()
        config = GenerationConfig(max_new_tokens=128, sampling=sampling, policy="goodput")
        tokens = sum(pipeline.generate(p, config, drafter="hybrid-suffix").stats.new_tokens for p in prompts)
        sources = {source: {key: tally[source, key] for key in COUNTS} for source, _ in tally}
        print(json.dumps({"mode": mode, "cats": categories, "tokens": tokens, **sources}))


if __name__ == "__main__":
    main()
