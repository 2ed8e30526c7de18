"""How many bits does the draft model need? Its acceptance with its layers' weights requantized to fewer bits.

    .venv/bin/python tools/draft_bits.py [QUESTIONS.jsonl] [--per-category N] [--tokens N]
        [--formats q4,4,3,3:mlp,2:mlp] [--temperature 0.7] [--seed 1] [--gamma 4] [--out FILE]

At one row the draft model's GEMMs stream their weights from memory (``tools/gemm_speed.cpp`` runs them about 3x
faster when the weights sit in cache), so a drafted token costs about what its weight bytes cost, and fewer bits
would make it cheaper. This tool measures the other half: what fewer bits do to acceptance.

A format ``B[:mlp]`` requantizes the draft's layer weights (``:mlp``: the gate, up and down projections only; else
also the attention projections and the LM head) to B bits: 2^B levels per group of 32 weights between an offset and
a step (the Q4_K structure with B-bit codes, B + 0.5 bits a weight with its scales), the clipping of each group
chosen from a few factors for the least squared error. The source is the GGUF file's own weights (Q4_K and Q6_K
exact, ``auto``), so even the 4-bit format differs from the default ``q4`` draft, which keeps the file's Q4_K blocks.
The codes are stored in the Q4_K layout (code x (15 // (2^B - 1))), so the native kernels run them unchanged and the
acceptance measured is exactly that of a B-bit draft; its speed is not (no kernel reads B-bit codes).

For each sampled Spec-Bench question (first turn, the bench's seed-0 sample) the target decodes ``--tokens`` tokens
greedily and as seeded plain decoding does at ``--temperature``; each draft format reads prompt and answer in one
forward (its default 49,152-token vocabulary focused on the prompt, as the drafter does) and is scored at every
answer position: greedy agreement, the seeded draft's token under the answer's own noise (what ``coupled_verify``
accepts), and the tokens per step of a γ-chain replayed along each answer. Also printed: the draft's weight bytes a
token (layers and LM head) relative to the default q4 draft.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from sampling_acceptance import Setting, draft_matches, replay, target_answers, teacher_forced_logits

from quickdraft.api import Pipeline
from quickdraft.bench.questions import default_questions_path, load_questions, sample_questions
from quickdraft.models import DEFAULT_DRAFT, resolve_model
from quickdraft.runtime import LoadOptions
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.kquants import GROUP, Q4Part
from quickdraft.runtime.native.model import Decoder
from quickdraft.runtime.options import DRAFT_VOCABULARY
from quickdraft.tokens import frequent_tokens

CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)  # each group's range is scaled by the factor with the least squared error
MLP = ("gate_up", "down")
ATTENTION = ("qkv", "out")


def quantize_bits(weight: torch.Tensor, bits: int) -> Q4Part:
    """Float ``weight [N, K]`` -> B-bit codes in the Q4_K structure (``Q4Part.from_groups``), each group's offset
    and step those of the clipping factor with the least squared error."""
    levels = 2**bits - 1
    groups = weight.float().reshape(weight.shape[0], -1, GROUP)  # [N, G, 32]
    low = groups.amin(dim=-1).clamp(max=0.0)  # [N, G]
    high = groups.amax(dim=-1)
    best_error = torch.full(low.shape, float("inf"))
    best_low, best_step = low.clone(), torch.zeros_like(low)
    for clip in CLIPS:
        step = ((high - low) * clip).clamp_min(1e-30) / levels
        offset = low * clip
        codes = torch.round((groups - offset[..., None]) / step[..., None]).clamp_(0, levels)
        error = ((codes * step[..., None] + offset[..., None] - groups) ** 2).sum(-1)  # [N, G]
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_low, best_step = torch.where(better, offset, best_low), torch.where(better, step, best_step)
    return Q4Part.from_groups(weight, best_low, best_step, levels)


def requantize(draft: NativeRuntime, source: Decoder, bits: int, names: tuple[str, ...], head: bool) -> None:
    """Replace ``draft``'s layers ``names`` (and its LM head) with ``source``'s weights at ``bits`` bits."""
    decoder = draft.decoder
    for layer, source_layer in zip(decoder.layers, source.layers, strict=True):
        for name in names:
            linear = getattr(layer, name)
            linear.parts = [quantize_bits(getattr(source_layer, name).dequantize(), bits)]
    if head:
        decoder.all_rows_head.parts = [quantize_bits(source.all_rows_head.dequantize(), bits)]
        decoder.restrict_vocabulary(decoder.vocabulary)
    decoder._layers_spec = None  # rebuilt from the new parts on the next forward


@dataclass(frozen=True)
class DraftFormat:
    """A ``--formats`` item: ``q4`` (the default draft as loaded) or ``B[:mlp]``."""

    name: str
    bits: int | None  # None: the default q4 draft, unchanged
    mlp_only: bool = False

    @classmethod
    def parse(cls, spec: str) -> DraftFormat:
        if spec == "q4":
            return cls(spec, None)
        bits_text, _, scope = spec.partition(":")
        if bits_text not in ("1", "2", "3", "4") or scope not in ("", "mlp"):
            raise SystemExit(f"a format is q4 or B[:mlp] with B in 1..4, not {spec!r}")
        return cls(spec, int(bits_text), scope == "mlp")

    def load(self, path: Path, vocabulary: list[int], source: Decoder) -> NativeRuntime:
        """The default draft (q4, the drafter's vocabulary) in this format."""
        draft = NativeRuntime.load(path, LoadOptions("q4", vocabulary))
        if self.bits is not None:
            requantize(draft, source, self.bits, MLP if self.mlp_only else MLP + ATTENTION, head=not self.mlp_only)
        return draft

    def megabytes(self, draft: NativeRuntime) -> float:
        """Weight megabytes a drafted token reads: layer linears at their bits, the restricted LM head too."""
        decoder = draft.decoder
        bits = 4.5 if self.bits is None else self.bits + 0.5  # the codes and their scales
        total = 0.0
        for layer in decoder.layers:
            for name in MLP + ATTENTION:
                linear = getattr(layer, name)
                layer_bits = bits if (name in MLP or not self.mlp_only) else 4.5
                total += linear.out_features * linear.in_features * layer_bits / 8
        head_bits = 4.5 if self.mlp_only else bits
        total += decoder.lm_head.out_features * decoder.lm_head.in_features * head_bits / 8
        return total / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("questions", nargs="?", type=Path, default=default_questions_path())
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128, help="target tokens per question (default 128)")
    parser.add_argument("--formats", default="q4,4,3,3:mlp,2:mlp")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=4, help="drafts per step of the replayed chain (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the per-question counts")
    args = parser.parse_args()
    formats = [DraftFormat.parse(spec) for spec in args.formats.split(",")]
    began = time.perf_counter()
    pipeline = Pipeline.load(draft=None)
    draft_path = resolve_model(DEFAULT_DRAFT)
    vocabulary = frequent_tokens(pipeline.tokenizer, DRAFT_VOCABULARY)
    questions = sample_questions(load_questions(args.questions), args.per_category, 0)
    settings = {"greedy": Setting(0.0), f"T{args.temperature:g}": Setting(args.temperature)}
    answers: list[dict[str, list[int]]] = []
    prompts = [pipeline.encode(question.turns[0], chat=True) for question in questions]
    for number, prompt in enumerate(prompts, start=1):
        answers.append(target_answers(pipeline, prompt, settings, args.tokens, args.seed))
        print(f"[{time.perf_counter() - began:.0f}s] target answers {number}/{len(prompts)}", file=sys.stderr)
    source = NativeRuntime.load(draft_path, LoadOptions("auto")).decoder
    results: dict[str, dict] = {}
    vocab_size = pipeline.target.vocab_size
    for draft_format in formats:
        spec = draft_format.name
        draft = draft_format.load(draft_path, vocabulary, source)
        counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # name -> [hits or tokens, positions or steps]
        for question, prompt, answer in zip(questions, prompts, answers, strict=True):
            draft.focus_vocabulary(prompt)
            cache = draft.new_cache(1)  # the prompt, read once: each answer is read after it
            first = draft.forward(torch.tensor([prompt]), cache, last_only=True)[0, -1]  # [V_draft]
            for name, setting in settings.items():
                tokens = answer[name]
                logits = teacher_forced_logits(draft, cache, first, len(prompt), tokens)  # [T, V_draft]
                matches = draft_matches(logits, tokens, setting.sampling(args.seed), len(prompt), vocab_size)
                for key in (name, f"{name} {question.category}"):
                    counts[key][0] += sum(matches)
                    counts[key][1] += len(matches)
                chain_tokens, steps = replay(matches, args.gamma)
                counts[f"{name} replay"][0] += chain_tokens
                counts[f"{name} replay"][1] += steps
        megabytes = draft_format.megabytes(draft)
        results[spec] = {"megabytes": megabytes, "counts": dict(counts)}
        line = "  ".join(f"{name} {hits / total:.3f}" for name, (hits, total) in counts.items() if " " not in name)
        replays = "  ".join(f"{name} {hits / total:.3f}" for name, (hits, total) in counts.items() if "replay" in name)
        print(f"{spec:<7} {megabytes:6.1f} MB  {line}  tokens/step {replays}", flush=True)
    by_category = sorted({key for spec in results.values() for key in spec["counts"] if key.count(" ") == 1})
    for key in by_category:
        if "replay" in key:
            continue
        row = "  ".join(
            f"{spec} {hits / total:.3f}" for spec, value in results.items() for hits, total in [value["counts"][key]]
        )
        print(f"  {key:<28} {row}")
    print(f"# {len(questions)} questions, {time.perf_counter() - began:.0f} s")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"arguments": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
