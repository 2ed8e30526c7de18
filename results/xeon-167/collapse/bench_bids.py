"""`quickdraft bench` with every bid of the default's goodput policy traced: what it chose and why (α, β, the
corrected costs, the draft model's backlog and reading, the horizon and the saving over it, the share of steps with
copies on offer), one JSON line per bid to the file named by QD_BID_TRACE, with each drafted-token cost sampled
(before the record cuts it to a plain step), and each answer's steps by source to stderr as bench_sources.py prints
them:

    QD_BID_TRACE=bids.jsonl .venv/bin/python results/xeon-167/collapse/bench_bids.py bench --per-category 5 ...
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import quickdraft.bench.run as bench_run
from quickdraft.cli import main
from quickdraft.policies.goodput import GoodputPolicy, offers_free_drafts
from quickdraft.policies.planner import best_gamma
from quickdraft.policies.records import StepTimeRecord

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from bench_sources import counting_run_question
from draft_sources import counting_observe

trace = open(os.environ["QD_BID_TRACE"], "w")  # noqa: SIM115 (open for the process's life)
current = {"question": None, "method": None}
policy_bid = GoodputPolicy.bid
add_draft_token_cost = StepTimeRecord.add_draft_token_cost


def traced_cost(record: StepTimeRecord, per_token_ms: float, plain_step_ms: float) -> None:
    trace.write(json.dumps({"q": current["question"], "draft_token_sample": round(per_token_ms, 2)}) + "\n")
    add_draft_token_cost(record, per_token_ms, plain_step_ms)


def traced_bid(policy: GoodputPolicy, state: Any) -> Any:
    bid = policy_bid(policy, state)
    priced = next((offer for offer in state.offers if not offer.free), None)
    if priced is None or current["method"] != "hybrid-suffix+goodput":
        return bid
    reading_ms, alpha, beta, costs = policy._model_estimates(state, priced.backlog, priced.token_ms)
    planned = best_gamma(costs, alpha, policy.maximum, beta)
    horizon = policy.model_horizon(state)
    saving = None if horizon is None or planned == 0 else costs.saving_ms(alpha, planned, horizon, beta)
    assert policy.step_times is not None
    row = {
        "q": current["question"], "gen": state.generated_tokens, "ctx": state.context_tokens,
        "gamma": bid.num_draft_tokens, "source": None if bid.offer is None else bid.offer.source,
        "planned": planned, "alpha": round(alpha, 3), "beta": round(beta, 3), "drafted": policy.drafted,
        "backlog": priced.backlog, "reading_ms": round(reading_ms, 1), "horizon": horizon,
        "saving_ms": None if saving is None else round(saving, 1), "t1": round(costs.step_ms(0), 1),
        "draft_ms": round(costs.draft_ms, 1), "reading_scale": round(policy.step_times.reading_scale, 2),
        "plain_steps": policy.plain_steps, "free_now": offers_free_drafts(state),
        "free_share": round(policy.free_offered.mean(), 3) if policy.free_offered.total else None,
    }  # fmt: skip
    trace.write(json.dumps(row) + "\n")
    return bid


def tracing_run_question(pipeline: Any, method: Any, question: Any, *args: Any, **kwargs: Any) -> Any:
    current["question"], current["method"] = question.question_id, method.name
    trace.write(json.dumps({"answer": question.question_id, "method": method.name}) + "\n")
    return counting_run_question(pipeline, method, question, *args, **kwargs)


if __name__ == "__main__":
    GoodputPolicy.observe = counting_observe  # type: ignore[method-assign]
    GoodputPolicy.bid = traced_bid  # type: ignore[method-assign]
    StepTimeRecord.add_draft_token_cost = traced_cost  # type: ignore[method-assign]
    bench_run.run_question = tracing_run_question
    sys.exit(main(sys.argv[1:]))
