"""The bench commands' names and defaults that their ``--help`` shows, kept free of torch so that showing it imports
neither torch nor the models (BENCH_DOC: what ``quickdraft bench --help`` shows). The modules that act on them import
them here."""

from __future__ import annotations

from quickdraft.drafters import DRAFTERS

BENCH_DOC = """``quickdraft bench``: methods and peers side by side on real prompt sets (the Spec-Bench protocol).

Every method runs greedily (or at --temperature) in this one process on the same questions; multi-turn questions
run turn by turn with the method's own previous answers in the chat history. Runs are
interleaved question by question, so slow drift of the machine hits every method alike, and the
order of the methods rotates from one question to the next, so none always runs in the same place.
What adaptive policies learn of answers (acceptance, lengths) is dropped at the start of every run,
so each run is an independent replicate in which a question's earlier runs teach nothing. Seeded
(--seed S), run r samples with seed S + r: every run is another answer to each question, and our
methods' text is checked against plain decoding's in the same run.
Wall time covers each whole generate call (prefill included). Each finished (method,
question, run) is appended to OUT/entries.jsonl at once; rerunning with the same --out
resumes and only runs what is missing (a run resumed part-way learns afresh from where it resumes,
so its later questions see less of what the run had learned). Outputs: results.json, report.md, speedup.png,
accept_hist.png, cost_curve.png, and step_times.json (what goodput measured of the engine's
steps, per drafter, against the profiled cost curves).

--context-lengths 1024,4096,… asks instead one question per length about source code of this Python's standard
library filling that many tokens (prompts up to the model's context, 32,768 tokens for the default pair). There the
prompt's reading dominates the wall time, and the report's "after the prompt" columns time the answer alone.
"""

DEFAULT_METHODS = "baseline,draft-model:2,draft-model:4,prompt-lookup,hf-generate,hf-assisted,hf-assisted-tuned"
DEFAULT_METHODS += ",hf-prompt-lookup"

WARMUP_TOKENS = 16  # each untimed warm-up generation's new tokens

# The peers ``quickdraft bench`` runs (quickdraft.bench.methods builds each): transformers' generate on the same
# weights, llama.cpp on the GGUF files, OpenVINO GenAI on int4 exports.
PEER_NAMES = (
    "hf-generate",
    "hf-assisted",
    "hf-assisted-tuned",
    "hf-prompt-lookup",
    "llama-cpp",
    "llama-cpp-prompt-lookup",
    "llama-cpp-draft",
    "openvino",
    "openvino-draft",
)

WORKLOADS = ("spec-bench", "agent")  # what ``quickdraft bench-serve --workload`` sends


def method_names() -> list[str]:
    """Every method name ``--methods`` takes (before ``:γ``, ``+POLICY`` or ``@RUNTIME``), sorted."""
    drafters = [name for name in DRAFTERS.names() if name != "none"]
    return sorted(["baseline", "control", *drafters, *PEER_NAMES])
