"""Aggregating bench entries: hand-computed numbers, speedups and their intervals, peers' agreement, oracles."""

from __future__ import annotations

import pytest
from bench_helpers import entry

from quickdraft.bench.metrics import (
    METRIC_KEYS,
    MethodInfo,
    aggregate,
    held_out_oracle,
    oracle,
    predicted_speedup,
    token_latencies,
)


def test_peers_report_agreement_not_losslessness() -> None:
    entries = [
        entry("baseline", "q1", "a", 10, 1.0),
        entry("baseline", "q2", "a", 10, 1.0),
        entry("peer", "q1", "a", 10, 2.0),  # the baseline's tokens
        entry("peer", "q2", "a", 10, 2.0, token_ids=[5] * 10),  # other arithmetic, other tokens
    ]
    results = aggregate(entries, {"baseline": MethodInfo(), "peer": MethodInfo(peer=True)}, ["a"])
    assert results["peer"]["overall"]["agreement"] == 0.5 and results["peer"]["overall"]["lossless_fraction"] is None
    assert results["peer"]["overall"]["speedup"] == pytest.approx(0.5)
    assert results["baseline"]["overall"]["lossless_fraction"] == 1.0
    assert results["baseline"]["overall"]["agreement"] is None


def test_aggregation_matches_hand_computed_numbers() -> None:
    entries = [
        entry("baseline", "q1", "a", 10, 5.0),  # 2 tok/s
        entry("baseline", "q2", "a", 10, 2.5),  # 4 tok/s
        entry("baseline", "q3", "b", 8, 8.0, token_latencies_s=[0.5, 1.0, 1.5, 2.0]),  # 1 tok/s
        entry(
            "spec", "q1", "a", 10, 2.5, step_sizes=[1, 3, 3, 3], draft_tokens_proposed=12, draft_tokens_accepted=6
        ),  # 4 tok/s
        entry(
            "spec", "q2", "a", 10, 2.0, token_ids=[2] * 10, step_sizes=[1, 4, 5],
            draft_tokens_proposed=8, draft_tokens_accepted=7,
        ),  # 5 tok/s, different tokens
        entry("spec", "q3", "b", 8, 4.0, step_sizes=[1, 1, 2, 4], draft_tokens_proposed=4, draft_tokens_accepted=4),
    ]  # fmt: skip
    target_ms = {1: 100.0, 2: 110.0, 3: 120.0}
    results = aggregate(
        entries,
        {"baseline": MethodInfo(), "spec": MethodInfo(num_draft_tokens=2, uses_draft_model=True)},
        ["a", "b"],
        {"target": target_ms, "draft": {1: 10.0}},
    )
    spec = results["spec"]
    a = spec["categories"]["a"]
    assert a["speedup"] == pytest.approx((4 + 5) / 2 / ((2 + 4) / 2))  # 1.5
    assert a["tokens_per_s"] == pytest.approx(4.5)
    assert a["acceptance_rate"] == pytest.approx(13 / 20)
    assert a["mean_accepted_tokens"] == pytest.approx(20 / 7)
    assert a["lossless_fraction"] == pytest.approx(0.5)
    assert a["n_questions"] == 2
    alpha = 13 / 20
    predicted = (1 - alpha**3) / (1 - alpha) * 100.0 / (2 * 10.0 + 120.0)
    assert a["efficiency"] == pytest.approx(1.5 / predicted)
    overall = spec["overall"]
    assert overall["speedup"] == pytest.approx((4 + 5 + 2) / 3 / ((2 + 4 + 1) / 3))
    assert overall["acceptance_rate"] == pytest.approx(17 / 24)
    assert overall["n_questions"] == 3
    baseline = results["baseline"]
    assert baseline["overall"]["speedup"] == pytest.approx(1.0)
    assert baseline["overall"]["mean_accepted_tokens"] == 1.0
    assert baseline["overall"]["acceptance_rate"] is None and baseline["overall"]["efficiency"] is None
    assert baseline["categories"]["b"]["latency_p50_ms"] == pytest.approx(1250.0)
    assert baseline["categories"]["b"]["latency_p90_ms"] == pytest.approx(1850.0)
    assert spec["step_size_counts"] == {1: 4, 2: 1, 3: 3, 4: 2, 5: 1}
    assert set(a) == set(METRIC_KEYS)


def test_speedup_averages_per_run_ratios_over_common_questions() -> None:
    entries = [
        entry("baseline", "q1", "a", 10, 5.0, run=0),  # 2
        entry("baseline", "q1", "a", 10, 2.5, run=1),  # 4
        entry("spec", "q1", "a", 10, 2.5, run=0),  # 4 -> 2.0
        entry("spec", "q1", "a", 10, 2.0, run=1),  # 5 -> 1.25
        entry("spec", "q2", "a", 10, 1.0, run=1),  # no baseline for q2: left out of the ratio
    ]
    results = aggregate(entries, {"baseline": MethodInfo(), "spec": MethodInfo()}, ["a"])
    assert results["spec"]["overall"]["speedup"] == pytest.approx((2.0 + 1.25) / 2)
    assert results["spec"]["overall"]["lossless_fraction"] == 1.0  # q1's tokens, each run against the baseline's


def test_each_run_is_checked_against_the_baselines_tokens_of_that_run() -> None:
    """A seeded run samples with its own seed: run 1's tokens must equal the baseline's run 1, not its run 0."""
    entries = [
        entry("baseline", "q1", "a", 10, 1.0, run=0),
        entry("baseline", "q1", "a", 10, 1.0, run=1, token_ids=[2] * 10),
        entry("spec", "q1", "a", 10, 0.5, run=0),
        entry("spec", "q1", "a", 10, 0.5, run=1, token_ids=[2] * 10),
        entry("wrong", "q1", "a", 10, 0.5, run=0),
        entry("wrong", "q1", "a", 10, 0.5, run=1),  # run 0's text in run 1
    ]
    results = aggregate(entries, {"baseline": MethodInfo(), "spec": MethodInfo(), "wrong": MethodInfo()}, ["a"])
    assert results["spec"]["overall"]["lossless_fraction"] == 1.0
    assert results["wrong"]["overall"]["lossless_fraction"] == 0.5


def test_speedup_interval_resamples_questions_with_their_runs() -> None:
    entries = []
    for question, ratio in (("q1", 1.0), ("q2", 1.2), ("q3", 1.4)):
        for run in (0, 1):
            entries.append(entry("baseline", question, "a", 10, 1.0, run=run))
            entries.append(entry("spec", question, "a", 10, 1.0 / ratio, run=run))
    results = aggregate(entries, {"baseline": MethodInfo(), "spec": MethodInfo()}, ["a"])
    low, high = results["spec"]["overall"]["speedup_ci95"]
    assert low == pytest.approx(1.0, abs=0.07) and high == pytest.approx(1.4, abs=0.07)  # mostly one question thrice
    assert results["spec"]["overall"]["speedup"] == pytest.approx(1.2)
    assert low < 1.2 < high
    assert results["baseline"]["overall"]["speedup_ci95"] == pytest.approx((1.0, 1.0))
    one = aggregate(entries[:4], {"baseline": MethodInfo(), "spec": MethodInfo()}, ["a"])
    assert one["spec"]["overall"]["speedup_ci95"] is None  # one question: no interval


def test_methods_on_another_runtime_are_compared_with_that_runtimes_baseline() -> None:
    entries = [
        entry("baseline", "q1", "a", 10, 1.0),  # 10 tok/s
        entry("baseline@slow", "q1", "a", 10, 4.0, token_ids=[3] * 10),  # 2.5 tok/s, other tokens
        entry("spec@slow", "q1", "a", 10, 2.0, token_ids=[3] * 10),  # 5 tok/s, the slow baseline's tokens
    ]
    methods = {
        "baseline": MethodInfo(),
        "baseline@slow": MethodInfo(),
        "spec@slow": MethodInfo(baseline="baseline@slow"),
    }
    results = aggregate(entries, methods, ["a"])
    assert results["spec@slow"]["overall"]["speedup"] == pytest.approx(2.0)
    assert results["spec@slow"]["overall"]["lossless_fraction"] == 1.0
    assert results["baseline@slow"]["overall"]["speedup"] == pytest.approx(0.25)
    assert results["baseline@slow"]["overall"]["lossless_fraction"] == 0.0


def test_oracle_is_the_best_fixed_gamma_per_category() -> None:
    def group(speedup):
        return {"speedup": speedup}

    methods = {
        "baseline": {"overall": group(1.0), "categories": {"a": group(1.0), "b": group(1.0)}},
        "dm:2": {"overall": group(1.1), "categories": {"a": group(1.3), "b": group(0.9)}},
        "dm:4": {"overall": group(1.2), "categories": {"a": group(1.1), "b": group(None)}},
        "dm+goodput": {"overall": group(5.0), "categories": {"a": group(5.0), "b": group(5.0)}},
    }
    assert oracle(methods, ["a", "b"]) == {
        "dm": {
            "a": {"method": "dm:2", "gamma": 2, "speedup": 1.3},
            "b": {"method": "baseline", "gamma": 0, "speedup": 1.0},  # every γ lost: not drafting is best
            "overall": {"method": "dm:4", "gamma": 4, "speedup": 1.2},
        }
    }


def test_held_out_oracle_chooses_gamma_on_the_other_runs() -> None:
    """Two fixed γ equally good but noisy: the oracle in hindsight takes the lucky one of each
    category; the held-out oracle measures each run's choice on the run it was not chosen on."""

    def group(*per_run):
        return {"speedup_per_run": {str(run): speedup for run, speedup in enumerate(per_run)}}

    methods = {
        "dm:1": {"overall": group(1.2, 1.0), "categories": {"a": group(1.2, 1.0), "b": group(0.8, 0.9)}},
        "dm:2": {"overall": group(1.0, 1.2), "categories": {"a": group(1.0, 1.2), "b": group(0.9, 0.95)}},
        "dm+goodput": {"overall": group(5.0, 5.0), "categories": {"a": group(5.0, 5.0), "b": group(5.0, 5.0)}},
        "pl:3": {"overall": group(1.1), "categories": {"a": group(1.1), "b": group(1.1)}},  # one run: left out
    }
    held_out = held_out_oracle(methods, ["a", "b"])
    # run 0 takes run 1's best (γ = 2: 1.0 in run 0), run 1 takes run 0's (γ = 1: 1.0 in run 1)
    assert held_out == {"dm": {"a": pytest.approx(1.0), "b": pytest.approx(1.0), "overall": pytest.approx(1.0)}}


def test_predicted_speedup() -> None:
    curve = {1: 100.0, 3: 150.0}
    assert predicted_speedup(0.0, 2, 0.0, curve) == pytest.approx(100 / 150)
    assert predicted_speedup(1.0, 2, 25.0, curve) == pytest.approx(3 * 100 / 200)
    assert predicted_speedup(0.5, 2, 0.0, curve) == pytest.approx(1.75 * 100 / 150)
    assert predicted_speedup(0.5, 4, 0.0, curve) is None


def test_token_latencies_spread_step_time_over_its_tokens() -> None:
    assert token_latencies([0.4, 0.5, 0.8], [1, 1, 3]) == pytest.approx([0.4, 0.1, 0.1, 0.1, 0.1])


def test_entries_timed_in_another_session_than_their_baseline_are_named() -> None:
    """A resume re-measures only what is missing: its entries' ratio to the old session's compares sessions."""
    import dataclasses

    from quickdraft.bench.metrics import mixed_sessions
    from quickdraft.bench.report import sessions_apart

    def timed(method: str, run: int, session: str | None) -> object:
        return dataclasses.replace(entry(method, "q1", "a", 10, 1.0, run=run), session=session)

    baselines = {"baseline": "baseline", "spec": "baseline", "other": "baseline"}
    entries = [timed("baseline", 0, "s1"), timed("spec", 0, "s1"), timed("baseline", 1, "s1"), timed("spec", 1, "s2")]
    entries += [timed("other", 0, None)]  # from before sessions were recorded: nothing to tell
    assert mixed_sessions(entries, baselines) == {"spec": [1]}
    (line,) = sessions_apart({"spec": [1]})
    assert line.startswith("**Measured in more than one session**: spec (run 1)")
