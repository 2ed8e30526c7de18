"""The bench harness: methods and peers side by side on real prompt sets (the Spec-Bench protocol); what a run
is asked to do, and ``quickdraft bench --help``'s text, are in :mod:`quickdraft.bench.settings`."""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from quickdraft.bench.base import Method, TurnResult
from quickdraft.bench.long_context import bench_questions
from quickdraft.bench.methods import parse_methods
from quickdraft.bench.metrics import Entry, aggregate, held_out_oracle, mixed_sessions, oracle, token_latencies
from quickdraft.bench.names import WARMUP_TOKENS
from quickdraft.bench.peers import package_version
from quickdraft.bench.questions import (
    Question,
    default_questions_path,
    keep_categories,
    load_questions,
    sample_questions,
)
from quickdraft.bench.report import write_markdown, write_plots
from quickdraft.bench.settings import BenchSettings
from quickdraft.bench.store import ResultStore, model_name, questions_digest
from quickdraft.config import DEFAULT_NUM_DRAFT_TOKENS, GenerationConfig
from quickdraft.costs.calibration import (
    CurveRole,
    context_costs,
    curve_from_json,
    curve_to_json,
    measure_cost_curves,
    measure_prefill_curve,
    prefill_lengths,
)
from quickdraft.errors import ConfigError, PromptError
from quickdraft.lossless.rules import check_prompt
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.machine import cpu_description
from quickdraft.progress import progress_bar, show_postfix
from quickdraft.runtime import AUTO, RUNTIMES
from quickdraft.runtime.names import KV_CACHE_DEFAULT
from quickdraft.runtime.options import draft_load_defaults

WARMUP_PROMPT_TOKENS = 512  # the warm-up reads at most this much of the first prompt (a long-context one took 65 s)
# What a resumed run must share with the entries already in OUT (methods and runs may grow).
PROFILE_REPEATS, PROFILE_WARMUP = 5, 1  # the cost curves goodput trades on: fastest of 5, target and draft in turn


def run_bench(settings: BenchSettings) -> tuple[dict[str, Any], bool]:
    """Measure what is missing in ``settings.out`` (nothing with ``report_only``) and write results.json,
    report.md and the plots there; the results and whether the plots were drawn."""
    from quickdraft.models import DEFAULT_DRAFT

    if settings.context_lengths:
        questions, questions_name = bench_questions(
            settings.target, settings.context_lengths, settings.max_new_tokens, settings.max_context
        )
    else:
        questions_path = settings.questions or default_questions_path()
        if questions_path is None:
            raise ConfigError("no question file: pass --questions PATH (no ../shared/data/spec_bench/question.jsonl)")
        sample = sample_questions(load_questions(questions_path), settings.per_category, settings.seed)
        questions = keep_categories(sample, settings.categories)
        questions_name = str(questions_path.resolve())
    methods = parse_methods(settings.methods)
    if not settings.sampling.is_greedy:
        greedy_only = [method.name for method in methods if not method.samples]
        if greedy_only:
            raise ConfigError(
                f"these methods decode greedily only: {', '.join(greedy_only)}; drop them or --temperature"
            )
    needs_draft = any(method.uses_draft_model for method in methods)
    weights, vocabulary = draft_load_defaults(settings.draft_weights, settings.draft_vocabulary)  # defaults filled in
    categories = list(dict.fromkeys(question.category for question in questions))
    config = {
        "questions": questions_name,
        "question_ids": [question.question_id for question in questions],
        "questions_sha256": questions_digest(questions),  # their text: an edited file is another sample
        "n_questions": len(questions),
        "categories": categories,
        "per_category": None if settings.context_lengths else settings.per_category,  # None: all, or one a length
        "only_categories": list(settings.categories),  # --categories: the sample's questions in these (empty: all)
        "seed": None if settings.context_lengths else settings.seed,  # None: no sample was drawn
        "max_new_tokens": settings.max_new_tokens,
        "methods": [method.name for method in methods],
        "runs": settings.runs,
        "warmup": settings.warmup,
        "target": model_name(settings.target),
        "draft": model_name(settings.draft or DEFAULT_DRAFT) if needs_draft else None,
        "draft_load": {"weights": weights, "vocabulary": vocabulary} if needs_draft else None,
        "runtime": settings.runtime,
        "kv_cache": settings.kv_cache_dtype or KV_CACHE_DEFAULT,
        "device": settings.device,
        "profile_context": settings.profile_context,
        "greedy": settings.sampling.is_greedy,
        "temperature": settings.temperature,
        "sampling_seed": settings.sampling_seed,
    }
    if settings.max_context is not None:  # given: part of what was measured (absent, results stay comparable)
        config["max_context"] = settings.max_context
    store = ResultStore(settings.out, config, keep_config=settings.report_only)
    shifts = turn_shifts(questions)
    todo = [
        (run, question, method)
        for run in range(settings.runs)
        for question, shift in zip(questions, shifts, strict=True)
        for method in rotated(methods, shift + run)
        if (method.name, question.question_id, run) not in store.entries
    ]
    if settings.report_only:
        if not store.entries:
            raise ConfigError(f"--report-only: {store.out} holds no measured entries yet")
        finished = {question_id for _, question_id, _ in store.entries}
        print(f"report only: {len(finished)} of {len(questions)} questions have entries, {len(todo)} runs missing",
              file=sys.stderr)  # fmt: skip
    elif todo or store.cost_curves is None:
        measure(store, todo, methods, questions, settings)
    entries = store.entries_for(config["methods"], config["question_ids"], settings.runs)
    incomplete = {
        name: f"{count} of {len(questions) * settings.runs}"
        for name in config["methods"]
        if (count := sum(entry.method == name for entry in entries)) < len(questions) * settings.runs
    }
    infos = {method.name: method.info() for method in methods}
    summaries = aggregate(
        entries,
        infos,
        categories,
        {role: curve_from_json(curve) for role, curve in (store.cost_curves or {}).items()},
        comparable=settings.sampling.is_greedy or settings.sampling.is_seeded,
    )
    results = {
        "config": config,
        "machine": store.machine,
        "cost_curves": store.cost_curves,
        "methods": summaries,
        "oracle": oracle(summaries, categories),
        "held_out_oracle": held_out_oracle(summaries, categories),
        "revisions": dict(Counter(entry.revision or "unknown" for entry in entries)),  # commit -> entries it measured
        "incomplete": incomplete,  # method -> its entries of those asked for, where some are missing
        "mixed_sessions": mixed_sessions(entries, {name: summary.baseline for name, summary in infos.items()}),
    }
    store.write_json("results.json", results)
    write_markdown(results, store.out / "report.md")
    return results, write_plots(results, store.out)


def rotated(methods: list[Method], shift: int) -> list[Method]:
    """The methods in turn order for one question, starting ``shift`` along (see :func:`turn_shifts`)."""
    shift %= len(methods)
    return methods[shift:] + methods[:shift]


def turn_shifts(questions: list[Question]) -> list[int]:
    """How far along each question starts the methods (a run adds its number): its category's place (in order of
    first appearance) plus how many questions of that category came before it. So the categories of one round start
    one further along each, and each category's questions one further along each: every method runs first in every
    category that has as many questions as there are methods, whatever the numbers of categories and methods, and no
    method always runs first (e.g. right after a long prefill)."""
    places: dict[str, int] = {}
    earlier: Counter[str] = Counter()
    shifts = []
    for question in questions:
        shifts.append(places.setdefault(question.category, len(places)) + earlier[question.category])
        earlier[question.category] += 1
    return shifts


def measure(
    store: ResultStore,
    todo: list[tuple[int, Question, Method]],
    methods: list[Method],
    questions: list[Question],
    settings: BenchSettings,
) -> None:
    from quickdraft.api import Pipeline

    pending_methods = list(dict.fromkeys(method for _, _, method in todo))
    for method in pending_methods:
        method.check()  # e.g. a peer whose package is missing: before any model is loaded
    chosen = None if settings.runtime == AUTO else RUNTIMES.get(settings.runtime).name  # auto: known once loaded
    if chosen is not None and any(RUNTIMES.get(m.runtime).name == chosen for m in pending_methods if m.runtime):
        raise ConfigError(f"the models already run on the {chosen} runtime")  # as Pipeline.on_runtime says after
    draft_flags = {"--draft": settings.draft, "--draft-weights": settings.draft_weights,
                   "--draft-vocabulary": settings.draft_vocabulary}  # fmt: skip
    unused = [flag for flag, value in draft_flags.items() if value is not None and not store.config["draft"]]
    if unused:
        verb = "is" if len(unused) == 1 else "are"
        note = f"no method uses a draft model, so {', '.join(unused)} {verb} not used"
        print(f"quickdraft: note: {note}", file=sys.stderr)
    heads = [method for method in pending_methods if method.uses_draft_head]
    if settings.draft_head is not None and not heads:
        print("quickdraft: note: no method drafts with a draft head, so --draft-head is not used", file=sys.stderr)
    elif settings.draft_head is not None and not Path(settings.draft_head).is_file():
        raise ConfigError(f"--draft-head {settings.draft_head}: no such file")
    pipeline = Pipeline.load(
        settings.target,
        store.config["draft"],
        settings.runtime,
        draft_weights=settings.draft_weights if store.config["draft"] else None,  # else noted unused
        draft_vocabulary=settings.draft_vocabulary if store.config["draft"] else None,
        device=settings.device,
        kv_cache_dtype=settings.kv_cache_dtype,
        max_context=settings.max_context,
    )
    pipeline.draft_head = Path(settings.draft_head) if settings.draft_head else None
    for method in heads:  # the head is read now: a missing one (the target's default) fails before anything is written
        if method.runtime is None:
            pipeline.drafter(method.drafter)
    if pipeline.bridge is not None:  # a draft of another vocabulary: say how it drafts
        print(f"quickdraft: note: {pipeline.pairing()}", file=sys.stderr)
    runs_on = {"target": pipeline.target.name, "draft": None if pipeline.draft is None else pipeline.draft.name}
    store.use_machine(machine_info() | {"runtimes": runs_on})  # what --runtime auto chose
    check_first_turns(pipeline, list(dict.fromkeys(question for _, question, _ in todo)), settings.max_new_tokens)
    ks = range(1, max([m.max_draft_tokens for m in methods] + [DEFAULT_NUM_DRAFT_TOKENS]) + 2)
    roles = {CurveRole.TARGET: pipeline.target}
    roles |= {CurveRole.DRAFT: pipeline.draft} if pipeline.draft is not None else {}
    store.cost_curves = ready_cost_curves(store.cost_curves or {}, roles, ks, settings.profile_context)
    store.write_json("cost_curves.json", store.cost_curves)
    curves = {CurveRole(role): curve_from_json(curve) for role, curve in store.cost_curves.items()}
    other_runtimes = {method.runtime for method in pending_methods if method.runtime is not None}
    pipelines = {None: pipeline} | {runtime: pipeline.on_runtime(runtime) for runtime in sorted(other_runtimes)}
    for method in pending_methods:
        method.load(pipelines[method.runtime], curves, settings.profile_context)
    first_prompt = encode_turn(pipeline, questions[0], [])[-WARMUP_PROMPT_TOKENS:] if pending_methods else []
    warmup_tokens = min(WARMUP_TOKENS, settings.max_new_tokens)
    warmups = pending_methods * settings.warmup
    for method in progress_bar(warmups, desc="warm-up", disable=not warmups):  # none: no empty bar
        method.run(pipelines[method.runtime], first_prompt, warmup_tokens, settings.sampling)
    total = settings.runs * len(questions) * len(methods)
    with progress_bar(total=total, initial=total - len(todo), desc="bench", unit="run") as bar:
        current_run = None
        for run, question, method in todo:
            if run != current_run:  # each run learns afresh what answers are like: independent replicates
                current_run = run
                for runtime_pipeline in pipelines.values():
                    runtime_pipeline.forget_answers()
            show_postfix(bar, f"{method.name} on {question.category} {question.question_id}")
            entry = run_question(
                pipelines[method.runtime], method, question, run, settings.max_new_tokens, settings.sampling_of_run(run)
            )
            store.add(entry)
            bar.update()
    measured = {  # what adaptive policies measured of the engine's steps (this invocation's runs)
        drafter if runtime is None else f"{drafter}@{runtime}": record.summary()
        for runtime, runtime_pipeline in pipelines.items()
        for drafter, records in runtime_pipeline.records.items()
        if (record := records.step_times).num_plain_steps or record.num_drafting_steps
    }
    store.write_json("step_times.json", measured)


def ready_cost_curves(
    saved: dict[str, dict[str, float]], roles: dict[CurveRole, Any], ks: range, context: int
) -> dict[str, dict[str, float]]:
    """``saved`` curves (JSON: role -> k -> ms) with what this run's models and γ need measured where it is missing:
    each model's forward over every k of ``ks``, what the context adds to the target's blocks up to ``ks[-1]``
    and to a drafted token, and the draft model's prompt reading. A resumed run whose methods draft further, or
    use a draft model the first run did not load, extends them (a note says so); what was measured stays."""
    curves = {role: dict(curve) for role, curve in saved.items()}  # keys are CurveRole values
    missing = {role: [k for k in ks if str(k) not in curves.get(str(role), {})] for role in roles}
    missing = {role: role_ks for role, role_ks in missing.items() if role_ks}
    if missing and curves:
        gaps = ", ".join(f"{role} k = {role_ks[0]}..{role_ks[-1]}" for role, role_ks in missing.items())
        print(f"quickdraft: note: the saved cost curves lack {gaps}; measuring them now", file=sys.stderr)
    if missing:
        runtimes = {role: roles[role] for role in missing}
        measured = measure_cost_curves(runtimes, missing, context, PROFILE_REPEATS, PROFILE_WARMUP, True)
        for role, curve in measured.items():
            curves[str(role)] = curves.get(str(role), {}) | curve_to_json(curve)
    longest = {CurveRole.TARGET_CONTEXT: ks[-1], CurveRole.DRAFT_CONTEXT: 1}  # the blocks whose context cost is used
    slopes_of = {CurveRole.TARGET: CurveRole.TARGET_CONTEXT, CurveRole.DRAFT: CurveRole.DRAFT_CONTEXT}
    reach = {role: max(map(int, curves.get(str(slopes_of[role]), {"0": 0}))) for role in roles}
    if any(reach[role] < longest[slopes_of[role]] for role in roles):
        slopes = context_costs(roles, context, ks[-1])  # none where a model's context has too little room
        curves |= {str(role): {str(k): ms for k, ms in curve.items()} for role, curve in slopes.items()}
    if CurveRole.DRAFT in roles and CurveRole.DRAFT_PREFILL not in curves:
        prefill = measure_prefill_curve(roles[CurveRole.DRAFT], prefill_lengths(roles[CurveRole.DRAFT]))
        curves[str(CurveRole.DRAFT_PREFILL)] = curve_to_json(prefill)
    return curves


def check_first_turns(pipeline: Any, questions: list[Question], max_new_tokens: int) -> None:
    """Raise ``PromptError`` for a question whose first turn and ``max_new_tokens`` the target's context cannot hold:
    before any cost is measured or answer run (a later turn is checked when it runs: its history is not known)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    for question in questions:
        try:
            check_prompt(
                encode_turn(pipeline, question, []), config, pipeline.target.max_context, pipeline.target.vocab_size
            )
        except PromptError as error:
            raise PromptError(f"question {question.question_id} ({question.category}): {error}") from None


def encode_turn(pipeline: Any, question: Question, answers: list[str]) -> list[int]:
    """Prompt ids of the next turn (after ``answers``): chat history, the raw text for completions, or the
    fill-in-the-middle prompt of an infilling question."""
    if question.suffix is not None:
        return pipeline.encode_infill(question.turns[0], question.suffix)
    if not question.chat:
        return pipeline.encode(question.turns[len(answers)])
    messages: list[dict[str, str]] = []
    for user, answer in zip(question.turns, [*answers, None], strict=False):
        messages.append({"role": "user", "content": user})
        if answer is None:
            break
        messages.append({"role": "assistant", "content": answer})
    return pipeline.encode_chat(messages)


def run_question(
    pipeline: Any, method: Method, question: Question, run: int, max_new_tokens: int, sampling: SamplingParams
) -> Entry:
    """All turns of ``question``, each answered by ``method`` with its own previous answers in the history."""
    answers: list[str] = []
    turns: list[TurnResult] = []
    method.start_conversation(pipeline, pipeline.chat_prefix() if question.chat else [])
    for _ in question.turns:
        turns.append(method.run(pipeline, encode_turn(pipeline, question, answers), max_new_tokens, sampling))
        answers.append(pipeline.tokenizer.decode(turns[-1].token_ids, skip_special_tokens=True))
    token_ids = [token for turn in turns for token in turn.token_ids]
    drafting = [turn for turn in turns if turn.draft_tokens_proposed is not None]
    return Entry(
        method=method.name,
        question_id=question.question_id,
        category=question.category,
        run=run,
        new_tokens=len(token_ids),
        wall_time_s=sum(turn.wall_time_s for turn in turns),
        token_ids=token_ids,
        step_sizes=[size for turn in turns for size in turn.step_sizes],
        token_latencies_s=[s for turn in turns for s in token_latencies(turn.step_times_s, turn.step_sizes)],
        draft_tokens_proposed=sum(turn.draft_tokens_proposed or 0 for turn in drafting) if drafting else None,
        draft_tokens_accepted=sum(turn.draft_tokens_accepted or 0 for turn in drafting) if drafting else None,
        answers=answers,
        gammas=[gamma for turn in turns for gamma in turn.gammas],
        revision=source_revision(),
        session=session_id(),
        prefill_s=sum(turn.step_times_s[0] for turn in turns) if all(turn.step_times_s for turn in turns) else None,
    )


@functools.cache
def session_id() -> str:
    """This bench process's id, in every entry it measures: a resumed folder's report sees which ran apart."""
    return uuid.uuid4().hex[:8]


@functools.cache
def source_revision() -> str | None:
    """The git commit this quickdraft runs from, "+changes" when tracked files differ from it; None
    outside a git checkout (an installed package). A resumed bench can span commits: each entry says which."""
    root = Path(__file__).resolve().parents[2]

    def git(*command: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *command], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")


def machine_info() -> dict[str, Any]:
    import transformers

    cpu = cpu_description()
    return {
        "platform": platform.platform(),
        "cpu": cpu["name"],
        "cpu_family_model": f"{cpu['family']}/{cpu['model']}",
        "isa": cpu["isa"],
        "cpu_count": cpu["cpu_count"],
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama_cpp_python": package_version("llama-cpp-python"),  # None: not installed (no llama.cpp peer can run)
        "openvino_genai": package_version("openvino-genai"),  # None: not installed (no OpenVINO peer can run)
    }
