"""llama.cpp as a bench peer: its own 4-bit kernels on the very GGUF files quickdraft ships.

``llama-cpp`` is plain decoding (greedy, or sampling at the bench's temperature) through the Python binding
(``llama_cpp.Llama``) and
``llama-cpp-prompt-lookup`` the binding's ``LlamaPromptLookupDecoding`` draft. Both read the GGUF
file the target's transformers directory was converted from (its ``quickdraft-source.json``), after
checking its sha256, and are fed our prompt token ids (no second tokenization), with the bench's
token budget, end-of-sequence tokens and thread count. ``llama-cpp-draft`` is llama.cpp's own
draft-model speculation (not in the binding): its ``llama-speculative-simple`` tool, built once from
the binding's sdist into the cache and run once per turn on the target's and the draft's GGUF
files. llama.cpp computes with its own kernels, so its greedy tokens may differ from ours: how
often they agree is reported as agreement, not as a lossless check.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quickdraft.api import Pipeline
from quickdraft.bench.base import GREEDY, Method, TurnResult
from quickdraft.bench.llama_tools import LLAMA_CPP_PYTHON, NO_AMX, SPECULATIVE_TOOL, check_tool, llama_tool
from quickdraft.bench.peers import require_module
from quickdraft.errors import ConfigError, ModelFilesError, PromptError
from quickdraft.lossless.sampling import SamplingParams
from quickdraft.models.catalog import file_sha256
from quickdraft.models.convert import MARKER

INSTALL = f"pip install 'quickdraft[peers]' (llama-cpp-python=={LLAMA_CPP_PYTHON}, compiled from source)"
PROMPT_LOOKUP = {"max_ngram_size": 2, "num_pred_tokens": 10}  # the binding's defaults (hf-prompt-lookup: 10 too)
CONTEXT_STEP = 1024  # the context grows in these steps when a prompt needs more (a new context, outside timing)
MAX_CONTEXT = 32768  # Qwen2.5's trained context
# A prompt whose ids llama.cpp's own tokenizer must reproduce: the vocabularies must map ids alike.
TOKENIZER_CHECK = "Write a Python function `fib(n)` returning the n-th Fibonacci number. Größe: 12 × 3 = 36 (日本語)."


# ggml's AMX backend crashes in ggml_backend_amx_mul_mat on the first decode of our Q4_K_M files (llama.cpp
# issue #20824): builds on AMX machines leave it out, as GGML_NATIVE (-march=native) would enable it.
REINSTALL_WITHOUT_AMX = (  # --no-deps: forcing the whole extra would reinstall torch and the rest as well
    f"CMAKE_ARGS=\"-DCMAKE_C_FLAGS='{NO_AMX}' -DCMAKE_CXX_FLAGS='{NO_AMX}'\" "
    f"pip install --force-reinstall --no-deps --no-cache-dir 'llama-cpp-python=={LLAMA_CPP_PYTHON}'"
)


def require_llama_cpp(method: str) -> None:
    """A clear error, before anything is loaded or timed, when llama-cpp-python is not installed, does not
    load, or was built with ggml's AMX backend (which crashes on our files: llama.cpp issue #20824)."""
    require_module(method, "llama_cpp", "llama-cpp-python", INSTALL)
    import llama_cpp

    if "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode("utf-8", "replace"):
        raise ConfigError(
            f"method {method!r}: llama-cpp-python was built with ggml's AMX backend, which crashes on the first "
            f"decode of Q4_K_M files on this CPU (llama.cpp issue #20824); rebuild it without AMX: "
            f"{REINSTALL_WITHOUT_AMX}"
        )


def verified_gguf(model_dir: Path | None, role: str = "target") -> Path:
    """The GGUF file a converted model directory was made from (its conversion marker says), checked against the
    digest the conversion recorded."""
    try:
        marker = json.loads((Path(model_dir or "") / MARKER).read_text(encoding="utf-8"))
        path, sha256 = Path(marker["source"]), str(marker["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(
            f"the llama.cpp peers need the {role} as a GGUF file: {model_dir} was not converted by quickdraft "
            f"from one (no {MARKER}); pass a packaged model name or a .gguf file"
        ) from None
    if not path.is_file():
        raise ModelFilesError(f"{path} ({role}) is missing: run `quickdraft models` to assemble it again")
    found = file_sha256(path, progress=False)
    if found != sha256:
        raise ModelFilesError(
            f"{path} ({role}) has sha256 {found}, not the {sha256} it was converted from; "
            f"delete it and run `quickdraft models`"
        )
    return path


def context_size(needed: int) -> int:
    """A context of at least ``needed`` tokens, rounded up to :data:`CONTEXT_STEP` (at least 2 steps)."""
    if needed > MAX_CONTEXT:
        raise PromptError(f"llama.cpp peers: a prompt and its new tokens need {needed} positions, over {MAX_CONTEXT}")
    return max(2, math.ceil(needed / CONTEXT_STEP)) * CONTEXT_STEP


class LlamaCppMethod(Method):
    """Decoding by llama-cpp-python on the target's GGUF file: plain (greedy or sampled) or greedy with its prompt
    lookup."""

    peer = True

    def __init__(self, name: str, prompt_lookup: bool = False) -> None:
        self.name = name
        self.prompt_lookup = prompt_lookup
        self.samples = not prompt_lookup  # plain decoding samples with llama.cpp's sampler
        self._llama: Any = None
        self._n_ctx = 0
        self._gguf: Path | None = None
        self._threads = 1

    def check(self) -> None:
        require_llama_cpp(self.name)

    def load(self, pipeline: Pipeline, cost_curves: Mapping[str, Mapping[int, float]], context: int = 0) -> None:
        """Find and verify the GGUF file, load it with the bench's thread count, and check that llama.cpp's
        tokenizer gives our ids for a chat prompt (the ids we feed it must mean the same tokens)."""
        import torch

        self.check()
        self._gguf = verified_gguf(pipeline.target_path)
        self._threads = torch.get_num_threads()
        self._load(context_size(2048))
        messages = [{"role": "user", "content": TOKENIZER_CHECK}]
        ours = pipeline.encode_chat(messages) if pipeline.tokenizer.chat_template else pipeline.encode(TOKENIZER_CHECK)
        text = pipeline.tokenizer.decode(ours)
        theirs = list(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        if theirs != ours:
            raise ModelFilesError(
                f"llama.cpp tokenizes a prompt of {self._gguf.name} differently from quickdraft's tokenizer "
                f"({len(theirs)} against {len(ours)} tokens): their token ids would not mean the same tokens"
            )

    def _load(self, n_ctx: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self._llama = None  # free the old context first
        draft = LlamaPromptLookupDecoding(**PROMPT_LOOKUP) if self.prompt_lookup else None
        self._llama = Llama(
            model_path=str(self._gguf),
            n_ctx=n_ctx,
            n_threads=self._threads,
            n_threads_batch=self._threads,
            n_gpu_layers=0,
            draft_model=draft,
            logits_all=draft is not None,  # the binding verifies drafts on every position's logits
            verbose=False,
        )
        self._n_ctx = n_ctx

    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        """Feed ``prompt_ids`` to a context cleared of any earlier prompt (the baseline too reads every
        prompt whole) and take greedy tokens (or sampled ones, at ``sampling``'s temperature with llama.cpp's own
        sampler: its top-k, top-p and min-p off) until an end-of-sequence token or the budget. A target step is
        one ``eval`` call of the binding: the tokens coming out after it are that step's."""
        if self._llama is None:
            raise ConfigError(f"method {self.name!r}: load() was not called")
        needed = len(prompt_ids) + max_new_tokens + PROMPT_LOOKUP["num_pred_tokens"] + 1
        if needed > self._n_ctx:
            self._load(context_size(needed))  # before the clock starts
        llama = self._llama
        evals = 0
        evaluate = llama.eval

        def counted_eval(tokens: Any) -> None:
            nonlocal evals
            evals += 1
            evaluate(tokens)

        proposed = 0
        draft = llama.draft_model
        if draft is not None:

            def counted_draft(input_ids: Any, /, **kwargs: Any) -> Any:
                nonlocal proposed
                tokens = draft(input_ids, **kwargs)
                proposed += len(tokens)
                return tokens

            llama.draft_model = counted_draft
        llama.eval = counted_eval
        token_ids: list[int] = []
        step_sizes: list[int] = []
        step_times_s: list[float] = []
        seen_evals = 0
        try:
            started = time.perf_counter()
            llama.reset()  # nothing of the previous prompt is reused
            if sampling.seed is not None:
                llama.set_seed(sampling.seed % 2**32)
            generator = llama.generate(
                prompt_ids, temp=sampling.temperature, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True
            )
            for token in generator:
                now = time.perf_counter() - started
                token_ids.append(int(token))
                if evals != seen_evals:  # the first token after a new forward: a new step
                    seen_evals = evals
                    step_sizes.append(1)
                    step_times_s.append(now)
                else:
                    step_sizes[-1] += 1
                    step_times_s[-1] = now
                if int(token) in pipeline.eos_token_ids or len(token_ids) >= max_new_tokens:
                    break
            generator.close()
            wall_time_s = time.perf_counter() - started
        finally:
            del llama.eval  # the class's own again
            llama.draft_model = draft
        accepted = sum(size - 1 for size in step_sizes[1:])
        return TurnResult(
            token_ids=token_ids,
            wall_time_s=wall_time_s,
            step_sizes=step_sizes,
            step_times_s=step_times_s,
            draft_tokens_proposed=proposed if draft is not None else None,
            draft_tokens_accepted=accepted if draft is not None else None,
        )


def one_batch_context(gguf: Path, threads: int, n_ctx: int, logits_all: bool = False) -> Any:
    """A llama.cpp context on ``gguf`` on the CPU that reads up to ``n_ctx`` tokens in one batch."""
    require_llama_cpp("llama-cpp")  # before the import: a missing binding is a clear error
    from llama_cpp import Llama

    sizes = {"n_ctx": n_ctx, "n_batch": n_ctx, "n_ubatch": n_ctx, "n_threads": threads, "n_threads_batch": threads}
    return Llama(model_path=str(gguf), n_gpu_layers=0, verbose=False, logits_all=logits_all, **sizes)


def prompt_reader(gguf: Path, threads: int, n_ctx: int) -> Any:
    """A function that reads token ids into an emptied llama.cpp context on ``gguf`` (one batch, as llama-bench's
    ``pp`` test does) and returns the milliseconds it took: llama.cpp's prompt speed, timed in our process."""
    llama = one_batch_context(gguf, threads, n_ctx)

    def read(token_ids: list[int]) -> float:
        llama.reset()
        started = time.perf_counter()
        llama.eval(token_ids)
        return 1000 * (time.perf_counter() - started)

    return read


def all_logits(gguf: Path, token_ids: list[int], threads: int) -> Any:
    """llama.cpp's float32 logits ``[T, V]`` at every position of ``token_ids`` read in one evaluation of ``gguf``
    (a numpy array): the peer's own computation on the same file and ids, for perplexity and greedy agreement."""
    llama = one_batch_context(gguf, threads, len(token_ids), logits_all=True)
    llama.eval(token_ids)
    return llama.scores[: len(token_ids)].copy()


# --- llama.cpp's draft-model speculation: its llama-speculative-simple tool -----------------------------

DRAFT_TOKENS = 3  # llama.cpp's default --spec-draft-n-max (and p_min 0: no confidence cut-off)


TIMINGS = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNTS = re.compile(r"\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)")  # lines may start with a time and level


def parse_speculative_log(log: str) -> dict[str, float]:
    """The tool's summary: prefill and decoding seconds, tokens predicted, drafted and accepted."""
    timings = {kind: float(seconds) for kind, _, seconds in TIMINGS.findall(log)}
    counts = {name: float(value) for name, value in COUNTS.findall(log)}
    if set(timings) != {"encoded", "decoded"} or set(counts) != {"n_drafted", "n_accept", "n_predict"}:
        raise ConfigError(f"{SPECULATIVE_TOOL} printed no timing summary; its log ends:\n{log[-2000:]}")
    return {"prefill_s": timings["encoded"], "decode_s": timings["decoded"]} | counts


class LlamaCppDraftMethod(Method):
    """llama.cpp's draft-model speculation: ``llama-speculative-simple`` on the target's and the draft's
    GGUF files, one process per turn, timed by its own clock (prefill of both models + decoding, not the
    process start or model loading). It takes text, so the prompt is our ids decoded (special tokens
    written out, which it parses back); the tokens it prints are encoded again with our tokenizer."""

    peer = True
    uses_draft_model = True

    def __init__(self, name: str) -> None:
        self.name = name
        self._command: list[str] = []

    def check(self) -> None:
        check_tool(SPECULATIVE_TOOL, f"method {self.name!r}")

    def load(self, pipeline: Pipeline, cost_curves: Mapping[str, Mapping[int, float]], context: int = 0) -> None:
        import torch

        target, draft = verified_gguf(pipeline.target_path), verified_gguf(pipeline.draft_path, "draft")
        threads = str(torch.get_num_threads())
        self._command = [
            str(llama_tool(SPECULATIVE_TOOL)), "-m", str(target), "-md", str(draft),
            "--spec-type", "draft-simple",  # in this version -md alone does not speculate
            "--spec-draft-n-max", str(DRAFT_TOKENS),
            "-t", threads, "-tb", threads, "-td", threads, "-tbd", threads,
            "--temp", "0", "--repeat-penalty", "1.0", "-ngl", "0", "-ngld", "0",
            "--no-escape",  # the prompt as written: code's backslashes are not escape sequences
        ]  # fmt: skip

    def run(
        self, pipeline: Pipeline, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams = GREEDY
    ) -> TurnResult:
        if not self._command:
            raise ConfigError(f"method {self.name!r}: load() was not called")
        prompt = pipeline.tokenizer.decode(prompt_ids)
        n_ctx = context_size(len(prompt_ids) + max_new_tokens + DRAFT_TOKENS + 2)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
            file.write(prompt + "\n")  # -f drops a file's last newline: the prompt's own one stays
            file.flush()
            # -n one less: the tool stops only once it has predicted more than -n tokens
            limits = ["-n", str(max_new_tokens - 1), "-c", str(n_ctx), "-b", str(n_ctx)]
            command = [*self._command, "-f", file.name, *limits]
            result = subprocess.run(command, capture_output=True, text=True, errors="replace")
        if result.returncode != 0:
            raise ConfigError(f"{SPECULATIVE_TOOL} failed ({result.returncode}): {result.stderr[-2000:]}")
        summary = parse_speculative_log(result.stderr)
        text = result.stdout.removeprefix("\n\n")
        if not text.startswith(prompt):
            raise ConfigError(f"{SPECULATIVE_TOOL} did not echo the prompt as given; its output starts {text[:200]!r}")
        answer = text[len(prompt) :].removesuffix("\n\n")
        produced = list(pipeline.tokenizer(answer, add_special_tokens=False).input_ids)
        predicted = int(summary["n_predict"])  # its end-of-generation token included, which it does not print
        token_ids = produced[:max_new_tokens]
        if len(produced) < min(predicted, max_new_tokens):
            eos = pipeline.tokenizer.eos_token_id
            token_ids.append(eos if eos in pipeline.eos_token_ids else min(pipeline.eos_token_ids))
        # Its last step may pass the budget by up to its draft length (it drafts its full n_max): the
        # decoding time is prorated to the tokens kept.
        decode_s = summary["decode_s"] * min(1.0, len(token_ids) / predicted) if predicted else summary["decode_s"]
        return TurnResult(
            token_ids=token_ids,
            wall_time_s=summary["prefill_s"] + decode_s,
            step_sizes=[],  # the tool reports no per-step times: τ and latencies are left out
            step_times_s=[],
            draft_tokens_proposed=int(summary["n_drafted"]),
            draft_tokens_accepted=int(summary["n_accept"]),
        )
