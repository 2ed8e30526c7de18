"""The benchmark harness on tiny models: question files, methods, aggregation, outputs, resume."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import word_tokenizer

from quickdraft.api import Pipeline
from quickdraft.bench.base import Method, TurnResult
from quickdraft.bench.methods import make_method, parse_methods
from quickdraft.bench.metrics import (
    METRIC_KEYS,
    Entry,
    MethodInfo,
    aggregate,
    held_out_oracle,
    oracle,
    predicted_speedup,
    token_latencies,
)
from quickdraft.bench.questions import load_questions, sample_questions
from quickdraft.bench.run import source_revision
from quickdraft.cli import main
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.errors import ConfigError, ModelFilesError, QuickdraftError

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
SPEC_ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["w1 w2 w3", "w4 w5"]},
    {"question_id": 2, "category": "coding", "turns": ["w6 w7", "w8"]},
    {"question_id": 3, "category": "translation", "turns": ["w9 w10 w11"]},
    {"question_id": 4, "category": "translation", "turns": ["w12 w13"]},
    {"question_id": 5, "category": "summarization", "turns": ["w3 w4 w5 w6 w3 w4 w5"]},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def chat_model_dirs(tiny_model_dirs: dict[str, Path]) -> dict[str, Path]:
    """The tiny target/draft directories with a chat template (multi-turn questions need one)."""
    from transformers import AutoTokenizer

    for role in ("target", "draft"):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs[role])
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(tiny_model_dirs[role])
    return tiny_model_dirs


def bench_args(dirs: dict[str, Path], questions: Path, out: Path, *extra: str) -> list[str]:
    return [
        "bench",
        "--questions",
        str(questions),
        "--target",
        str(dirs["target"]),
        "--draft",
        str(dirs["draft"]),
        "--out",
        str(out),
        "--max-new-tokens",
        "6",
        "--per-category",
        "2",
        "--profile-context",
        "16",
        *extra,
    ]


# --- question files ---------------------------------------------------------------------------


def test_spec_bench_groups_mt_bench_categories(tmp_path: Path) -> None:
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", SPEC_ROWS))
    assert [q.category for q in questions] == ["mt_bench", "mt_bench", "translation", "translation", "summarization"]
    assert questions[0].turns == ("w1 w2 w3", "w4 w5") and questions[0].question_id == "1"


def test_mt_bench_alone_keeps_its_categories(tmp_path: Path) -> None:
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", SPEC_ROWS[:2]))
    assert [q.category for q in questions] == ["writing", "coding"]


def test_humaneval_and_gsm8k_formats(tmp_path: Path) -> None:
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        file.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "x"}) + "\n")
    (humaneval,) = load_questions(path)
    assert (humaneval.category, humaneval.chat, humaneval.turns) == ("humaneval", False, ("def f():\n",))
    gsm = load_questions(write_jsonl(tmp_path / "test.jsonl", [{"question": "2+2?", "answer": "4"}] * 2))
    assert [q.category for q in gsm] == ["gsm8k", "gsm8k"] and gsm[1].question_id == "2"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n{"broken\n', "line 2 of"),
        ('{"x": 1}\n', "unknown format"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"question_id": 1, "category": "qa", "turns": [""]}\n', "empty"),
        ("", "no questions"),
    ],
)
def test_bad_question_files_give_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_questions(path)


def test_missing_question_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_questions(tmp_path / "absent.jsonl")


def test_stratified_sample_is_seeded_and_per_category(tmp_path: Path) -> None:
    rows = [{"question_id": i, "category": f"c{i % 3}", "turns": ["w1"]} for i in range(30)]
    questions = load_questions(write_jsonl(tmp_path / "q.jsonl", rows))
    first = sample_questions(questions, 4, seed=7)
    assert first == sample_questions(questions, 4, seed=7)
    assert first != sample_questions(questions, 4, seed=8)
    assert [q.category for q in first] == ["c0", "c1", "c2"] * 4  # round-robin: a partial run covers all
    assert len(sample_questions(questions, 50, seed=0)) == 30
    with pytest.raises(ConfigError):
        sample_questions(questions, 0, seed=0)


# --- methods ------------------------------------------------------------------------------------


def test_method_specs() -> None:
    methods = parse_methods("draft-model:2,prompt-lookup,hf-generate")
    assert [m.name for m in methods] == ["baseline", "draft-model:2", "prompt-lookup:4", "hf-generate"]
    assert [m.num_draft_tokens for m in methods] == [None, 2, 4, None]
    assert [m.uses_draft_model for m in methods] == [False, True, False, False]
    assert make_method("hf-assisted").uses_draft_model
    control = parse_methods("control")
    assert [m.name for m in control] == ["baseline", "control"]  # plain decoding twice: an A/A control
    assert (control[1].drafter, control[1].policy, control[1].num_draft_tokens) == ("none", "fixed", None)
    policy = make_method("prompt-lookup+confidence:0.5")
    assert (policy.name, policy.num_draft_tokens, policy.max_draft_tokens) == ("prompt-lookup+confidence:0.5", None, 16)
    for bad in (
        "nope",
        "control:2",
        "control@transformers",
        "draft-model:x",
        "draft-model:0",
        "hf-generate:3",
        "baseline,baseline",
        "baseline+goodput",
        "draft-model+oracle",
        "draft-model+fixed:x",
    ):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def test_llama_cpp_method_specs() -> None:
    methods = parse_methods("llama-cpp,llama-cpp-prompt-lookup,hf-generate")
    assert [m.name for m in methods] == ["baseline", "llama-cpp", "llama-cpp-prompt-lookup", "hf-generate"]
    assert [m.peer for m in methods] == [False, True, True, True]
    assert [m.uses_draft_model for m in methods] == [False, False, False, False]
    assert [m.num_draft_tokens for m in methods] == [None, None, None, None]  # no theory check for peers
    assert methods[1].info().peer and not methods[0].info().peer
    for bad in ("llama-cpp:3", "llama-cpp@transformers", "llama-cpp+goodput", "llama-cpp-prompt-lookup:2"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine (CI) where llama-cpp-python is not installed."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError


def bench_error_before_loading(
    dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, methods: str
) -> str:
    """The one error line of a bench naming ``methods`` that cannot run here: it must stop before any model
    is loaded."""
    import quickdraft.api

    def no_loading(*args, **kwargs):
        raise AssertionError("a method that cannot run must fail before any model is loaded")

    monkeypatch.setattr(quickdraft.api.Pipeline, "load", no_loading)
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    assert main(bench_args(dirs, questions, tmp_path / "out", "--methods", methods)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, no traceback
    return err


def test_llama_cpp_missing_says_how_to_install_before_loading_models(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_llama_cpp(monkeypatch)
    with pytest.raises(ConfigError, match=r"llama-cpp-python.*pip install 'quickdraft\[peers\]'"):
        make_method("llama-cpp").check()
    err = bench_error_before_loading(chat_model_dirs, tmp_path, capsys, monkeypatch, "llama-cpp-prompt-lookup")
    assert "'llama-cpp-prompt-lookup' needs llama-cpp-python" in err and "pip install 'quickdraft[peers]'" in err


EOS_ID = 31  # the tiny pipeline's end-of-sequence token


def next_word(context: list[int]) -> int:
    """The fake llama.cpp model's greedy choice: counts up 1..9 cyclically, ends after 40 positions."""
    return EOS_ID if len(context) >= 40 else context[-1] % 9 + 1


class FakeLlama:
    """``llama_cpp.Llama`` as the bench uses it: ``generate`` runs the binding's loop (eval the pending
    tokens, sample after each, stop at the first draft token the model disagrees with, then draft)."""

    instances: ClassVar[list[FakeLlama]] = []
    tokenize_differently = False

    def __init__(self, model_path: str, **kwargs) -> None:
        self.model_path, self.kwargs = model_path, kwargs
        self.draft_model = kwargs["draft_model"]
        self.tokens: list[int] = []
        self.evals: list[list[int]] = []
        self.resets = 0
        FakeLlama.instances.append(self)

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        ids = [int(word[1:]) for word in text.decode().split()]
        return [*ids, 1] if self.tokenize_differently else ids

    def reset(self) -> None:
        self.resets += 1
        self.tokens = []

    def eval(self, tokens: list[int]) -> None:
        self.evals.append(list(tokens))
        self.tokens += tokens

    def generate(self, tokens: list[int], temp: float, repeat_penalty: float, reset: bool):
        import numpy as np

        assert temp == 0.0 and repeat_penalty == 1.0 and self.tokens == []  # greedy, nothing reused
        pending = list(tokens)
        sample_idx = len(pending) - 1  # sample after the prompt's last token, then after each new one
        while True:
            self.eval(pending)
            while sample_idx < len(self.tokens):
                token = next_word(self.tokens[: sample_idx + 1])
                sample_idx += 1
                yield token
                pending = [token]
                if sample_idx < len(self.tokens) and token != self.tokens[sample_idx]:  # a rejected draft
                    del self.tokens[sample_idx:]
                    break
            if self.draft_model is not None:
                pending += [int(t) for t in self.draft_model(np.array([*self.tokens, token], dtype=np.intc))]


def fake_llama_cpp(monkeypatch: pytest.MonkeyPatch, amx: bool = False) -> None:
    """A ``llama_cpp`` module with the fake ``Llama``, the binding's prompt lookup (pure numpy, copied) and
    its system info (built with ggml's AMX backend or not)."""

    class PromptLookup:
        def __init__(self, max_ngram_size: int, num_pred_tokens: int) -> None:
            self.n, self.k = max_ngram_size, num_pred_tokens

        def __call__(self, input_ids):
            ids = input_ids.tolist()
            for size in range(min(self.n, len(ids) - 1), 0, -1):
                for start in range(len(ids) - size):
                    if ids[start : start + size] == ids[-size:] and start + size < len(ids):
                        return input_ids[start + size : start + size + self.k]
            return input_ids[:0]

    module, speculative = types.ModuleType("llama_cpp"), types.ModuleType("llama_cpp.llama_speculative")
    module.Llama, speculative.LlamaPromptLookupDecoding = FakeLlama, PromptLookup
    module.llama_print_system_info = lambda: f"CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = {int(amx)} | ".encode()
    module.llama_speculative = speculative
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", speculative)
    FakeLlama.instances = []


def test_llama_cpp_built_with_amx_says_how_to_rebuild_before_loading_models(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ggml's AMX backend crashes on our Q4_K_M files (llama.cpp #20824): such a build is refused up front."""
    fake_llama_cpp(monkeypatch, amx=True)
    for name in ("llama-cpp", "llama-cpp-prompt-lookup"):
        with pytest.raises(ConfigError, match=r"AMX backend.*#20824.*CMAKE_ARGS=.*-mno-amx-int8.*--force-reinstall"):
            make_method(name).check()
    err = bench_error_before_loading(chat_model_dirs, tmp_path, capsys, monkeypatch, "llama-cpp")
    assert "pip install --force-reinstall --no-deps --no-cache-dir 'llama-cpp-python==0.3.36'" in err
    fake_llama_cpp(monkeypatch, amx=False)
    make_method("llama-cpp").check()  # a build without AMX passes


def test_llama_speculative_tool_is_built_without_amx_and_cached_by_its_options(monkeypatch) -> None:
    import quickdraft.bench.llama_cpp as llama_cpp_peer

    flags = [option for option in llama_cpp_peer.CMAKE_OPTIONS if option.startswith("-DCMAKE_C")]
    assert flags == [f"-DCMAKE_{lang}_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" for lang in ("C", "CXX")]
    with_flags = llama_cpp_peer.tool_dir()
    assert with_flags.name.startswith(f"{llama_cpp_peer.LLAMA_CPP_PYTHON}-")
    monkeypatch.setattr(llama_cpp_peer, "CMAKE_OPTIONS", llama_cpp_peer.CMAKE_OPTIONS[:1])
    assert llama_cpp_peer.tool_dir() != with_flags  # an older build (with AMX) is not reused


COUNTING_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # the fake peers' models count on: 3, 4, ...


def run_to_budget(pipeline: Pipeline, *methods: Method) -> list[TurnResult]:
    """Each fake peer's turn after :data:`COUNTING_PROMPT` with a budget of 20 tokens, which stops it; its
    steps add up to its tokens and are timed in order within the call."""
    results = [method.run(pipeline, COUNTING_PROMPT, max_new_tokens=20) for method in methods]
    for result in results:
        assert result.token_ids == [3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]
        assert sum(result.step_sizes) == 20 and len(result.step_times_s) == len(result.step_sizes)
        assert result.step_times_s == sorted(result.step_times_s) and result.wall_time_s >= result.step_times_s[-1]
    return results


def converted_from_gguf(tmp_path: Path, gguf: bytes = b"GGUF fake weights", recorded: str | None = None) -> Path:
    """A model directory with quickdraft's conversion marker naming its source GGUF and its digest."""
    from quickdraft.models.convert import MARKER

    (tmp_path / "model.gguf").write_bytes(gguf)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    sha256 = recorded or hashlib.sha256(gguf).hexdigest()
    (hf_dir / MARKER).write_text(json.dumps({"sha256": sha256, "source": str(tmp_path / "model.gguf")}))
    return hf_dir


def test_llama_cpp_turn_results_with_a_fake_binding(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake_llama_cpp(monkeypatch)
    pipeline = dataclasses.replace(pipeline, target_path=converted_from_gguf(tmp_path))
    plain, lookup = make_method("llama-cpp"), make_method("llama-cpp-prompt-lookup")
    for method in (plain, lookup):
        method.load(pipeline, {})
    plain_llama, lookup_llama = FakeLlama.instances
    assert plain_llama.model_path == lookup_llama.model_path == str(tmp_path / "model.gguf")
    assert plain_llama.kwargs["n_threads"] == plain_llama.kwargs["n_threads_batch"] == torch.get_num_threads()
    assert plain_llama.draft_model is None and not plain_llama.kwargs["logits_all"]
    assert lookup_llama.kwargs["logits_all"] and lookup_llama.kwargs["n_ctx"] == 2048

    results = run_to_budget(pipeline, plain, lookup)
    assert results[0].step_sizes == [1] * 20 and results[0].draft_tokens_proposed is None
    assert results[1].step_sizes[0] == 1 and max(results[1].step_sizes) > 1  # the prompt's cycle is looked up
    assert results[1].draft_tokens_accepted == 20 - len(results[1].step_sizes) <= results[1].draft_tokens_proposed
    assert plain_llama.evals[0] == COUNTING_PROMPT and len(plain_llama.evals) == 20  # one forward per step
    assert len(lookup_llama.evals) == len(results[1].step_sizes)
    assert "eval" not in vars(lookup_llama) and lookup_llama.draft_model is not None  # unwrapped again

    # An end-of-sequence token ends the turn and is kept; every turn starts from an empty context.
    for method, llama in ((plain, plain_llama), (lookup, lookup_llama)):
        resets = llama.resets
        result = method.run(pipeline, [5] * 30, max_new_tokens=50)
        assert result.token_ids == [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, EOS_ID] and llama.resets == resets + 1
    # A prompt that needs a longer context gets a new one before the clock starts.
    assert lookup.run(pipeline, [1] * 2100, max_new_tokens=4).token_ids == [EOS_ID]
    assert FakeLlama.instances[-1].kwargs["n_ctx"] == 3072


def test_llama_cpp_checks_its_gguf_file_and_tokenizer(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_llama_cpp(monkeypatch)
    method = make_method("llama-cpp")
    with pytest.raises(ConfigError, match="need the target as a GGUF file"):
        method.load(pipeline, {})  # a transformers directory quickdraft did not convert
    (tmp_path / "tampered").mkdir()
    tampered = dataclasses.replace(pipeline, target_path=converted_from_gguf(tmp_path / "tampered", recorded="0" * 64))
    with pytest.raises(ModelFilesError, match=r"not the 0{64} it was converted from"):
        method.load(tampered, {})
    monkeypatch.setattr(FakeLlama, "tokenize_differently", True)
    with pytest.raises(ModelFilesError, match=r"tokenizes a prompt .* differently"):
        method.load(dataclasses.replace(pipeline, target_path=converted_from_gguf(tmp_path)), {})


SPECULATIVE_LOG = """0.02.453.016 I common_speculative_init_result: loading draft model 'draft.gguf'
0.09.624.727 I encoded   11 tokens in    0.250 seconds, speed:   44.000 t/s
0.09.624.779 I decoded    3 tokens in    0.500 seconds, speed:    6.000 t/s
0.09.624.826 I
0.09.624.870 I n_draft   = 3
0.09.624.914 I n_predict = 3
0.09.624.957 I n_drafted = 4
0.09.625.001 I n_accept  = 2
0.09.625.045 I accept    = 50.000%
"""


def test_llama_cpp_draft_runs_llamas_speculative_tool(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``llama-cpp-draft`` runs llama.cpp's tool (faked here: nothing is compiled in tests) on both GGUF
    files and takes its own timing summary; the text it prints is encoded again with our tokenizer."""
    import subprocess

    import torch

    import quickdraft.bench.llama_cpp as llama_cpp_peer

    for role in ("target", "draft"):
        (tmp_path / role).mkdir()
    target, draft = converted_from_gguf(tmp_path / "target"), converted_from_gguf(tmp_path / "draft")
    pipeline = dataclasses.replace(pipeline, target_path=target, draft_path=draft)
    monkeypatch.setattr(llama_cpp_peer, "speculative_tool", lambda: tmp_path / "llama-speculative-simple")
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        prompt = Path(command[command.index("-f") + 1]).read_text(encoding="utf-8")
        return subprocess.CompletedProcess(command, 0, stdout=f"\n\n{prompt} w4 w5\n\n", stderr=SPECULATIVE_LOG)

    monkeypatch.setattr(llama_cpp_peer.subprocess, "run", fake_run)
    method = make_method("llama-cpp-draft")
    assert method.uses_draft_model and method.peer and method.num_draft_tokens is None
    method.load(pipeline, {})
    result = method.run(pipeline, [1, 2, 3], max_new_tokens=8)
    assert result.token_ids == [4, 5, EOS_ID]  # 3 predicted < 8: it stopped at an end-of-generation token
    assert result.wall_time_s == pytest.approx(0.75)  # its prefill and decoding, not the process start
    assert (result.draft_tokens_proposed, result.draft_tokens_accepted) == (4, 2)
    assert result.step_sizes == result.step_times_s == []  # no per-step times from the tool
    over = method.run(pipeline, [1, 2, 3], max_new_tokens=2)  # its last step drafted past the budget
    assert over.token_ids == [4, 5] and over.wall_time_s == pytest.approx(0.25 + 0.5 * 2 / 3)  # prorated
    command = calls[0]
    threads = str(torch.get_num_threads())
    assert command[:5] == [str(tmp_path / "llama-speculative-simple"), "-m", str(tmp_path / "target" / "model.gguf"),
                           "-md", str(tmp_path / "draft" / "model.gguf")]  # fmt: skip
    assert command[command.index("--spec-type") + 1] == "draft-simple"  # -md alone does not speculate
    assert command[command.index("-t") + 1] == command[command.index("-td") + 1] == threads
    assert command[command.index("--temp") + 1] == "0" and command[command.index("-n") + 1] == "7"
    for bad in ("llama-cpp-draft:4", "llama-cpp-draft@transformers"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)
    with pytest.raises(ConfigError, match="no timing summary"):
        llama_cpp_peer.parse_speculative_log("error: unknown argument")


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


# --- aggregation -------------------------------------------------------------------------------


def entry(method: str, question: str, category: str, tokens: int, seconds: float, **kw) -> Entry:
    defaults = {"run": 0, "token_ids": [1] * tokens, "step_sizes": [1] * tokens, "token_latencies_s": []}
    return Entry(method, question, category, new_tokens=tokens, wall_time_s=seconds, **(defaults | kw))


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
    assert results["spec"]["overall"]["lossless_fraction"] == 1.0  # q1's tokens, compared with baseline run 0


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


def test_method_specs_on_another_runtime() -> None:
    methods = parse_methods("draft-model:2@transformers,prompt-lookup+goodput@transformers,hf-generate")
    names = [m.name for m in methods]
    assert names == ["baseline", "baseline@transformers", "draft-model:2@transformers",
                     "prompt-lookup+goodput@transformers", "hf-generate"]  # fmt: skip
    assert [m.baseline for m in methods[:3]] == ["baseline", "baseline", "baseline@transformers"]
    assert methods[2].runtime == "transformers" and methods[2].num_draft_tokens is None  # no theory check
    for bad in ("draft-model:2@nope", "hf-generate@native", "baseline@"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


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


def test_each_question_starts_a_new_conversation(pipeline) -> None:
    """Methods share a drafter: one must not find the prompt another method (or the warm-up) just read,
    only the start that every request shares (the chat template's system prompt), as far as it was read."""
    method = make_method("draft-model:2")
    method.run(pipeline, [3, 1, 4, 1, 5], max_new_tokens=4)
    drafter = pipeline.drafter("draft-model")
    assert isinstance(drafter, DraftModelDrafter)
    (conversation,) = [kept for kept in drafter.kept if kept.cached_ids[:5] == [3, 1, 4, 1, 5]]
    method.start_conversation(pipeline, [3, 1, 7])
    assert conversation.cached_ids == [3, 1] and int(conversation.cache.lengths[0]) == 2
    method.start_conversation(pipeline)
    assert conversation.cached_ids == [] and int(conversation.cache.lengths[0]) == 0
    make_method("prompt-lookup:2").start_conversation(pipeline)  # drafters without a conversation: a no-op


def test_chat_prefix_is_what_every_chat_request_starts_with() -> None:
    tokenizer = word_tokenizer(16, prefix="")  # words "0" .. "14"
    pipeline = Pipeline(target=None, tokenizer=tokenizer, eos_token_ids=frozenset())
    tokenizer.chat_template = "5 6 {% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == [5, 6]
    assert pipeline.encode_chat([{"role": "user", "content": "9 9"}]) == [5, 6, 9, 9]
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    assert pipeline.chat_prefix() == []


def test_profile_command_prints_json(tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    args = ["profile", "--model", str(tiny_model_dirs["target"]), "--max-k", "3", "--context", "8", "--json"]
    assert main([*args, "--repeats", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "transformers" and report["context"] == 8
    assert sorted(report["t_ms"]) == ["1", "2", "3"]


# --- the whole command -------------------------------------------------------------------------------


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
    assert set(results["cost_curves"]) == {"target", "draft", "draft_prefill"}
    assert "1" in results["cost_curves"]["target"] and results["cost_curves"]["draft_prefill"]
    assert "Draft model reading a prompt" in (out / "report.md").read_text()
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
    # --report-only reports what a stopped run measured, even with methods still missing, and measures nothing.
    assert (
        main(bench_args(chat_model_dirs, questions, out, "--methods", f"{methods},draft-model:4", "--report-only")) == 0
    )
    captured = capsys.readouterr()
    assert "Speedup per category" in captured.out and "5 runs missing" in captured.err
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


def test_bench_bad_questions_exit_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\nnot json\n', encoding="utf-8")
    for path, message in [(tmp_path / "absent.jsonl", "no such file"), (bad, "line 2")]:
        assert main(["bench", "--questions", str(path), "--out", str(tmp_path / "o")]) == 1
        err = capsys.readouterr().err
        assert err.startswith("quickdraft: error: --questions") and message in err


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


def test_bench_refuses_a_method_on_its_own_runtime(
    native_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    args = bench_args(native_model_dirs, questions, tmp_path / "out", "--methods", "draft-model:2@native")
    assert main([*args, "--runtime", "native"]) == 1
    assert "already run on the native runtime" in capsys.readouterr().err


def test_profile_command_on_the_native_runtime(native_model_dirs: dict[str, Path], capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(Path(str(native_model_dirs["target"])).parent / "cache"))
    args = ["profile", "--model", str(native_model_dirs["target"]), "--runtime", "auto", "--max-k", "3", "--json"]
    assert main([*args, "--context", "8", "--repeats", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "native" and sorted(report["t_ms"]) == ["1", "2", "3"]


def test_entries_say_which_commit_measured_them() -> None:
    revision = source_revision()  # the tests run from a git checkout
    assert revision is not None and re.fullmatch(r"[0-9a-f]{4,40}(\+changes)?", revision)
    row = entry("baseline", "q1", "qa", 10, 1.0).to_dict()
    assert Entry.from_dict(row | {"revision": "abc1234"}).revision == "abc1234"
    older = {key: value for key, value in row.items() if key != "revision"}  # entries measured before it was kept
    assert Entry.from_dict(older).revision is None
