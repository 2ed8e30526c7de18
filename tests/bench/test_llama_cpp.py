"""The llama.cpp peers through a fake ``llama_cpp`` binding (CI has none): build checks, turns, the tool, GGUF files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from bench_helpers import (
    COUNTING_PROMPT,
    EOS_ID,
    bench_error_before_loading,
    chat_model_dirs,
    next_word,
    run_to_budget,
)

from quickdraft.api import Pipeline
from quickdraft.bench.methods import make_method, parse_methods
from quickdraft.errors import ConfigError, ModelFilesError, QuickdraftError

__all__ = ["chat_model_dirs"]  # the fixture, used here by name


def without_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine (CI) where llama-cpp-python is not installed."""
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError


def test_llama_cpp_missing_says_how_to_install_before_loading_models(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_llama_cpp(monkeypatch)
    with pytest.raises(ConfigError, match=r"llama-cpp-python.*pip install 'quickdraft\[peers\]'"):
        make_method("llama-cpp").check()
    err = bench_error_before_loading(chat_model_dirs, tmp_path, capsys, monkeypatch, "llama-cpp-prompt-lookup")
    assert "'llama-cpp-prompt-lookup' needs llama-cpp-python" in err and "pip install 'quickdraft[peers]'" in err
    from quickdraft.bench.llama_cpp import one_batch_context  # profile --against llama-cpp's context

    with pytest.raises(ConfigError, match=r"needs llama-cpp-python"):
        one_batch_context(tmp_path / "any.gguf", 1, 8)


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

    def generate(
        self, tokens: list[int], temp: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float, reset: bool
    ):
        import numpy as np

        assert temp == 0.0 and repeat_penalty == 1.0 and self.tokens == []  # greedy, nothing reused
        assert (top_k, top_p, min_p) == (0, 1.0, 0.0)  # sampling at a temperature means only that
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


def test_llama_tools_are_built_without_amx_offline_and_cached_by_their_options(monkeypatch) -> None:
    import quickdraft.bench.llama_tools as llama_tools

    flags = [option for option in llama_tools.CMAKE_OPTIONS if option.startswith("-DCMAKE_C")]
    assert flags == [f"-DCMAKE_{lang}_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" for lang in ("C", "CXX")]
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in llama_tools.CMAKE_OPTIONS  # nothing is downloaded at build time
    assert set(llama_tools.TOOLS) == {"llama-speculative-simple", "llama-server"}
    with_flags = llama_tools.tool_dir()
    assert with_flags.name.startswith(f"{llama_tools.LLAMA_CPP_PYTHON}-")
    monkeypatch.setattr(llama_tools, "CMAKE_OPTIONS", llama_tools.CMAKE_OPTIONS[:1])
    assert llama_tools.tool_dir() != with_flags  # an older build (with AMX) is not reused
    with pytest.raises(ValueError, match=r"unknown llama\.cpp tool"):
        llama_tools.llama_tool("llama-cli")


@pytest.mark.parametrize("failure", [ConfigError("cmake failed"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_build_leaves_no_scratch_folder(
    failure: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each build's scratch (the sdist and the build tree: hundreds of MB) goes when the build ends, however it ends;
    a build removes those that builds killed earlier left."""
    import quickdraft.bench.llama_tools as llama_tools

    monkeypatch.setattr(llama_tools, "tool_dir", lambda: tmp_path / "tools")
    (tmp_path / "tools" / "tmpk1lled" / "build").mkdir(parents=True)  # left by a build that was killed
    (tmp_path / "tools" / "bin").mkdir()

    def failing_download(work: Path, what: str) -> Path:
        (work / "llama_cpp_python.tar.gz").write_bytes(b"\0" * 1000)
        raise failure

    monkeypatch.setattr(llama_tools, "vendored_source", failing_download)
    with pytest.raises(type(failure)):
        llama_tools.build_tools(tmp_path / "tools" / "bin", progress=False)
    assert sorted(path.name for path in (tmp_path / "tools").iterdir()) == ["bin"]


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
    monkeypatch.setattr(llama_cpp_peer, "llama_tool", lambda name: tmp_path / name)
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
