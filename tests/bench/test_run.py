"""The ``bench`` command end to end: outputs, resume, bad questions, the native runtime, the commit it records."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from bench_helpers import SPEC_ROWS, bench_args, chat_model_dirs, entry, write_jsonl

from quickdraft.bench.metrics import METRIC_KEYS, Entry
from quickdraft.bench.questions import Question
from quickdraft.bench.run import encode_turn, rotated, source_revision, turn_shifts
from quickdraft.bench.settings import BenchSettings
from quickdraft.cli import main
from quickdraft.costs.calibration import context_ks
from quickdraft.lossless.sampling import MAX_SEED

__all__ = ["chat_model_dirs"]  # the fixture, used here by name


def test_bench_end_to_end_and_resume(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    out = tmp_path / "out"
    methods = "draft-model:2,prompt-lookup:3,hf-generate,hf-assisted-tuned,hf-prompt-lookup,prompt-lookup+goodput"
    assert main(bench_args(chat_model_dirs, questions, out, "--methods", methods, "--json")) == 0
    results = json.loads(capsys.readouterr().out)
    for name in ("results.json", "report.md", "speedup.png", "accept_hist.png", "cost_curve.png", "entries.jsonl"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "results.json").read_text()) == results
    assert results["config"]["categories"] == ["mt_bench", "translation", "summarization"]
    assert results["config"]["n_questions"] == 5
    assert set(results["cost_curves"]) == {"target", "draft", "draft_prefill", "target_context", "draft_context"}
    assert "1" in results["cost_curves"]["target"] and results["cost_curves"]["draft_prefill"]
    assert "Draft model reading a prompt" in (out / "report.md").read_text()
    assert "What 1,000 more cached tokens add to a forward" in (out / "report.md").read_text()
    runs_on = f"runtime {results['config']['runtime']} (target {results['machine']['runtimes']['target']}"
    assert runs_on in (out / "report.md").read_text()  # the runtime it chose
    names = ["baseline", "draft-model:2", "prompt-lookup:3", "hf-generate", "hf-assisted-tuned", "hf-prompt-lookup"]
    names.append("prompt-lookup+goodput")
    assert list(results["methods"]) == names
    assert set(results["oracle"]) == {"draft-model", "prompt-lookup"}
    assert results["oracle"]["prompt-lookup"]["overall"]["method"] in ("prompt-lookup:3", "baseline")  # γ 3 or 0
    assert results["methods"]["prompt-lookup+goodput"]["overall"]["lossless_fraction"] == 1.0
    assert results["methods"]["prompt-lookup+goodput"]["gamma_counts"]
    step_times = json.loads((out / "step_times.json").read_text())
    measured = step_times["prompt-lookup"]
    assert list(step_times) == ["prompt-lookup"] and measured["num_plain_steps"] + measured["num_drafting_steps"] > 0
    assert "oracle" in (out / "report.md").read_text()
    for name, result in results["methods"].items():
        for group in [result["overall"], *result["categories"].values()]:
            assert set(METRIC_KEYS) <= set(group), name
    for name in ("baseline", "draft-model:2", "prompt-lookup:3"):
        assert results["methods"][name]["overall"]["lossless_fraction"] == 1.0, name
    assert results["methods"]["hf-generate"]["overall"]["agreement"] == 1.0  # a peer: fp32 here, as ours
    assert results["methods"]["hf-generate"]["overall"]["lossless_fraction"] is None
    assert "| agreement |" in (out / "report.md").read_text()
    assert results["methods"]["baseline"]["overall"]["speedup"] == pytest.approx(1.0)
    assert results["methods"]["draft-model:2"]["overall"]["efficiency"] is not None
    assert results["methods"]["hf-generate"]["overall"]["acceptance_rate"] is None
    lines = (out / "entries.jsonl").read_text().splitlines()
    assert len(lines) == 5 * 7
    first = json.loads(lines[0])
    assert first["method"] == "baseline" and len(first["answers"]) == 2  # both turns of a multi-turn question
    assert first["new_tokens"] == len(first["token_ids"]) == sum(first["step_sizes"])
    turns = [[json.loads(line)["method"] for line in lines[start : start + 7]] for start in (0, 7, 14)]
    assert turns == [names, names[1:] + names[:1], names[2:] + names[:2]]  # each question starts one further along

    # Resume: a finished run loads no model and measures nothing again; a new method adds only its entries.
    import quickdraft.api

    def no_loading(*args, **kwargs):
        raise AssertionError("a finished benchmark must not load models")

    monkeypatch.setattr(quickdraft.api.Pipeline, "load", no_loading)
    assert main(bench_args(chat_model_dirs, questions, out, "--methods", methods)) == 0
    assert "Speedup per category" in capsys.readouterr().out
    assert len((out / "entries.jsonl").read_text().splitlines()) == 35
    # --report-only reports what a stopped run measured, even with methods still missing, and measures nothing,
    # leaving the record of what was measured as it is.
    recorded = (out / "config.json").read_text()
    assert (
        main(bench_args(chat_model_dirs, questions, out, "--methods", f"{methods},draft-model:4", "--report-only")) == 0
    )
    captured = capsys.readouterr()
    assert "Speedup per category" in captured.out and "5 runs missing" in captured.err
    assert (out / "config.json").read_text() == recorded
    report = (out / "report.md").read_text()
    assert "**Incomplete**: draft-model:4 (0 of 5 entries)" in report and "tokens/s and prompt times each" in report
    assert len((out / "entries.jsonl").read_text().splitlines()) == 35
    assert main(bench_args(chat_model_dirs, questions, tmp_path / "empty", "--report-only")) == 1
    assert "holds no measured entries" in capsys.readouterr().err
    monkeypatch.undo()

    with open(out / "entries.jsonl", "a", encoding="utf-8") as file:
        file.write('{"method": "draft-model:4", "quest')  # a run killed while writing
    assert main(bench_args(chat_model_dirs, questions, out, "--methods", f"{methods},draft-model:4")) == 0
    lines = (out / "entries.jsonl").read_text().splitlines()
    assert len(lines) == 40 and all(json.loads(line) for line in lines)
    assert "draft-model:4" in json.loads((out / "results.json").read_text())["methods"]

    # A different configuration in the same directory is refused, not mixed in.
    capsys.readouterr()
    assert main([*bench_args(chat_model_dirs, questions, out, "--methods", methods), "--max-new-tokens", "7"]) == 1
    assert "different max_new_tokens" in capsys.readouterr().err
    sampled = [*bench_args(chat_model_dirs, questions, out, "--methods", "draft-model:2"), "--temperature", "0.7"]
    for extra in ([], ["--report-only"]):  # sampled entries are never mixed into greedy ones, nor reported as them
        assert main([*sampled, *extra]) == 1
        assert "different greedy, temperature" in capsys.readouterr().err


def test_bench_bad_questions_exit_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\nnot json\n', encoding="utf-8")
    for path, message in [(tmp_path / "absent.jsonl", "no such file"), (bad, "line 2")]:
        assert main(["bench", "--questions", str(path), "--out", str(tmp_path / "o")]) == 1
        err = capsys.readouterr().err
        assert err.startswith("quickdraft: error: --questions") and message in err
    args = ["bench", "--questions", str(bad), "--out", str(tmp_path / "o"), "--all-questions", "--question-seed", "3"]
    assert main(args) == 1  # the seed draws nothing when every question runs
    assert "note: --question-seed is not used with --all-questions" in capsys.readouterr().err


def test_bench_categories_are_checked_before_any_model_is_loaded(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    for categories, message in [("rag", "no questions in rag; the questions have mt_bench"), ("qa,,", "names")]:
        args = bench_args(chat_model_dirs, questions, tmp_path / "out", "--categories", categories)
        assert main(args) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out" / "entries.jsonl").exists()


def test_a_first_turn_the_context_cannot_hold_fails_before_anything_is_measured(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quickdraft.bench.run as run

    monkeypatch.setattr(run, "measure_cost_curves", lambda *args, **kwargs: pytest.fail("measured first"))
    long = {"question_id": 7, "category": "qa", "turns": [" ".join(["w1"] * 600)]}
    questions = write_jsonl(tmp_path / "question.jsonl", [*SPEC_ROWS, long])
    assert main(bench_args(chat_model_dirs, questions, tmp_path / "out", "--methods", "prompt-lookup:2")) == 1
    err = capsys.readouterr().err
    assert "question 7 (qa): the prompt has" in err and "context holds" in err and "Traceback" not in err
    assert "note: no method uses a draft model, so --draft is not used" in err  # bench_args gives one


def test_a_missing_draft_head_fails_before_anything_is_written_and_an_unused_one_is_a_note(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eagle method reads the target's default head (none under this cache) before the folder is written to: a
    folder a failed run wrote refused later runs of another sample. A --draft-head no method uses is noted, whether
    its file exists or not."""
    import quickdraft.bench.run as run

    class Measured(Exception):
        pass

    def measured(*args: object, **kwargs: object) -> None:
        raise Measured

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    assert main(bench_args(chat_model_dirs, questions, tmp_path / "out", "--methods", "eagle:2")) == 1
    assert "no draft head at" in capsys.readouterr().err and not list((tmp_path / "out").glob("*.json"))
    monkeypatch.setattr(run, "measure_cost_curves", measured)
    args = bench_args(chat_model_dirs, questions, tmp_path / "out", "--methods", "prompt-lookup:2")
    with pytest.raises(Measured):
        main([*args, "--draft-head", str(tmp_path / "absent.safetensors")])
    assert "no method drafts with a draft head, so --draft-head is not used" in capsys.readouterr().err


def test_bench_on_the_native_runtime(
    native_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    methods = "draft-model:2,early-exit:2,prompt-lookup+goodput,early-exit+heuristic,hf-generate"
    methods += ",draft-model:2@transformers,prompt-lookup+goodput@transformers"
    args = bench_args(native_model_dirs, questions, tmp_path / "out", "--methods", methods, "--runtime", "native")
    assert main([*args, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    for name in ("draft-model:2", "early-exit:2", "prompt-lookup+goodput", "early-exit+heuristic"):
        assert results["methods"][name]["overall"]["lossless_fraction"] == 1.0, name
    for name in ("draft-model:2@transformers", "prompt-lookup+goodput@transformers"):  # vs baseline@transformers
        assert results["methods"][name]["overall"]["lossless_fraction"] == 1.0, name
        assert results["methods"][name]["overall"]["n_questions"] == 5, name
    # transformers runs the float weights, the native runtime its integer form: their tokens may differ.
    assert results["methods"]["hf-generate"]["overall"]["n_questions"] == 5
    assert results["methods"]["early-exit:2"]["overall"]["efficiency"] is not None
    assert results["config"]["runtime"] == "native"


def test_bench_samples_at_a_temperature(
    native_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeded: our methods' text equals plain decoding's (lossless 1.0) and the report says how tokens were chosen;
    unseeded: no lossless fraction; greedy-only methods and a seed without a temperature are refused."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    methods = ("--methods", "draft-model:2,prompt-lookup+goodput", "--runtime", "native")
    args = bench_args(native_model_dirs, questions, tmp_path / "seeded", *methods)
    assert main([*args, "--temperature", "0.8", "--seed", "5", "--runs", "2", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["config"]["temperature"] == 0.8 and not results["config"]["greedy"]
    for name in ("draft-model:2", "prompt-lookup+goodput"):
        assert results["methods"][name]["overall"]["lossless_fraction"] == 1.0, name
    assert "sampled at temperature 0.8 (seeds 5 to 6, one a run" in (tmp_path / "seeded" / "report.md").read_text()
    plain = {}  # (question, run) -> plain decoding's tokens: the two runs are two samples (seeds 5 and 6)
    for line in (tmp_path / "seeded" / "entries.jsonl").read_text().splitlines():
        if (found := json.loads(line))["method"] == "baseline":
            plain[found["question_id"], found["run"]] = found["token_ids"]
    assert any(plain[question, 0] != plain[question, 1] for question, _ in plain)
    args = bench_args(native_model_dirs, questions, tmp_path / "unseeded", *methods, "--categories", "translation")
    assert main([*args, "--temperature", "0.8", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["methods"]["draft-model:2"]["overall"]["lossless_fraction"] is None
    assert results["config"]["categories"] == ["translation"] and results["config"]["question_ids"] == ["3", "4"]
    assert "seed 0; only translation of the sample)" in (tmp_path / "unseeded" / "report.md").read_text()
    args = bench_args(native_model_dirs, questions, tmp_path / "refused", "--methods", "hf-generate")
    assert main([*args, "--temperature", "0.8"]) == 1
    assert "decode greedily only: hf-generate" in capsys.readouterr().err
    assert main([*bench_args(native_model_dirs, questions, tmp_path / "refused"), "--seed", "3"]) == 1
    assert "give a --temperature" in capsys.readouterr().err


def test_seeded_runs_sample_with_seeds_one_apart() -> None:
    """Run r of a seeded bench samples with seed S + r (modulo 2⁶⁴); greedy and unseeded runs sample alike."""
    assert [BenchSettings(temperature=0.7, sampling_seed=5).sampling_of_run(run).seed for run in range(3)] == [5, 6, 7]
    assert BenchSettings(temperature=0.7, sampling_seed=MAX_SEED).sampling_of_run(1).seed == 0
    assert BenchSettings(temperature=0.7).sampling_of_run(2).is_unseeded
    assert BenchSettings().sampling_of_run(2).is_greedy


def test_bench_refuses_a_method_on_its_own_runtime(
    native_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before any model is loaded."""
    import quickdraft.api

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(quickdraft.api.Pipeline, "load", lambda *args, **kwargs: pytest.fail("loaded the models"))
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    args = bench_args(native_model_dirs, questions, tmp_path / "out", "--methods", "draft-model:2@native")
    assert main([*args, "--runtime", "native"]) == 1
    assert "already run on the native runtime" in capsys.readouterr().err


def test_entries_say_which_commit_measured_them() -> None:
    revision = source_revision()  # the tests run from a git checkout
    assert revision is not None and re.fullmatch(r"[0-9a-f]{4,40}(\+changes)?", revision)
    row = entry("baseline", "q1", "qa", 10, 1.0).to_dict()
    assert Entry.from_dict(row | {"revision": "abc1234"}).revision == "abc1234"
    older = {key: value for key, value in row.items() if key != "revision"}  # entries measured before it was kept
    assert Entry.from_dict(older).revision is None


def test_every_category_sees_the_methods_in_different_orders() -> None:
    """Whatever the numbers of categories and methods, and whether the questions come in their categories' turn (c0,
    c1, …, c0, …) or category by category, each method runs first somewhere in every category with at least as many
    questions as there are methods (a step of one per question alone gave each category one order whenever the
    number of methods divides the number of categories; one per category's question and per question, whenever it
    divides one more)."""
    for num_categories, num_methods, run in itertools.product(range(1, 7), range(1, 7), range(2)):
        categories = [f"c{c}" for c in range(num_categories)]
        methods = [f"m{m}" for m in range(num_methods)]
        in_turn = [Question(f"{n}-{c}", c, ("turn",)) for n in range(num_methods) for c in categories]
        by_category = sorted(in_turn, key=lambda question: question.category)
        for questions in (in_turn, by_category):
            shifts = turn_shifts(questions)
            for category in categories:
                firsts = {
                    rotated(methods, shift + run)[0]  # type: ignore[arg-type]
                    for shift, question in zip(shifts, questions, strict=True)
                    if question.category == category
                }
                assert firsts == set(methods), (num_categories, num_methods, run, category, firsts)


def test_saved_cost_curves_are_extended_to_what_a_resumed_run_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A resumed run drafting further, or with a draft model the first run did not load, measures only what the
    saved curves lack; what was measured stays."""
    import quickdraft.bench.run as run

    calls: list[tuple[str, object]] = []

    def curves(runtimes, ks, *args, **kwargs):  # 10 ms a new token for the target, 1 for the draft
        calls.append(("curves", {str(role): list(role_ks) for role, role_ks in ks.items()}))
        return {role: {k: (10.0 if role == "target" else 1.0) * k for k in ks[role]} for role in runtimes}

    def slopes(runtimes, context, longest):
        calls.append(("context", longest))
        return {"target_context": {k: 0.01 for k in context_ks(longest)}, "draft_context": {1: 0.001}}

    def prefill(runtime, lengths):
        calls.append(("prefill", None))
        return {128: 5.0}

    monkeypatch.setattr(run, "measure_cost_curves", curves)
    monkeypatch.setattr(run, "context_costs", slopes)
    monkeypatch.setattr(run, "measure_prefill_curve", prefill)
    monkeypatch.setattr(run, "prefill_lengths", lambda runtime: [128])
    target_only = run.ready_cost_curves({}, {run.CurveRole.TARGET: "target model"}, range(1, 4), 64)
    assert calls == [("curves", {"target": [1, 2, 3]}), ("context", 3)] and "note" not in capsys.readouterr().err
    calls.clear()
    roles = {run.CurveRole.TARGET: "target model", run.CurveRole.DRAFT: "draft model"}
    both = run.ready_cost_curves(target_only, roles, range(1, 6), 64)
    assert calls == [("curves", {"target": [4, 5], "draft": [1, 2, 3, 4, 5]}), ("context", 5), ("prefill", None)]
    assert "lack target k = 4..5, draft k = 1..5; measuring them now" in capsys.readouterr().err
    assert both["target"] == {str(k): 10.0 * k for k in range(1, 6)} and both["draft_prefill"] == {"128": 5.0}
    calls.clear()
    assert run.ready_cost_curves(both, roles, range(1, 5), 64) == both and calls == []  # nothing missing


def test_an_infilling_question_is_asked_in_the_fill_in_the_middle_format() -> None:
    class Encoder:  # what encode_turn asks of a pipeline
        def encode_infill(self, prefix: str, suffix: str) -> list[str]:
            return ["infill", prefix, suffix]

        def encode(self, text: str) -> list[str]:
            return ["plain", text]

    middle = Question("HumanEval/0/middle", "infill", ("def f():\n",), chat=False, suffix="    return x\n")
    assert encode_turn(Encoder(), middle, []) == ["infill", "def f():\n", "    return x\n"]
    assert encode_turn(Encoder(), Question("HumanEval/0", "humaneval", ("def f():\n",), chat=False), []) == [
        "plain", "def f():\n"]  # fmt: skip
