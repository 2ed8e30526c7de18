"""TEAL-style activation sparsity (Liu et al. 2024) in the draft model: what it costs in acceptance. Each linear
layer's input row loses its smallest-magnitude share of channels (zeroed, per row) before the layer; the draft then
reads the target's own answers (../sampled-levers/answers.json: greedy and seeded T 0.7) and is scored at every
position as tools/draft_bits.py scores it: greedy agreement, the seeded match under the answer's own noise, and the
tokens a step of a γ 4 chain replayed along the answer. The draft runs as transformers float32 weights (every
token of its vocabulary), not the native q4 runtime, so compare the rows with each other, not with draft_bits.

    .venv/bin/python results/xeon-167/draft-sparsity/teal_probe.py all=0 all=0.4 qkv+gate_up=0.5,out+down=0.3

A spec names the layers (qkv, out, gate_up, down, or all) and the share of their input channels zeroed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parents[3] / "tools"))
from sampling_acceptance import Setting, draft_matches, replay

from quickdraft.models import DEFAULT_DRAFT, resolve_model

LAYERS = {
    "q_proj": "qkv",
    "k_proj": "qkv",
    "v_proj": "qkv",
    "o_proj": "out",
    "gate_proj": "gate_up",
    "up_proj": "gate_up",
    "down_proj": "down",
}
zeroed: dict[str, float] = {}  # layer kind -> share of input channels zeroed


def sparsify(kind: str):  # type: ignore[no-untyped-def]
    def before(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor] | None:
        x = args[0]  # [B, T, K]
        drop = int(zeroed.get(kind, 0.0) * x.shape[-1])
        if not drop:
            return None
        return (x.scatter(-1, x.abs().topk(drop, dim=-1, largest=False).indices, 0.0),)

    return before


def parse(spec: str) -> dict[str, float]:
    shares = {}
    for item in spec.split(","):
        kinds, share = item.split("=")
        for kind in ("qkv", "out", "gate_up", "down") if kinds == "all" else kinds.split("+"):
            shares[kind] = float(share)
    return shares


def main() -> None:
    torch.set_num_threads(2)
    answers_file = Path(__file__).parents[1] / "sampled-levers" / "answers.json"
    answers = [row for row in json.loads(answers_file.read_text()) if row["t"] in (0.0, 0.7)]
    model = AutoModelForCausalLM.from_pretrained(resolve_model(DEFAULT_DRAFT), dtype=torch.float32).eval()
    for name, module in model.named_modules():
        if (kind := LAYERS.get(name.rsplit(".", 1)[-1])) is not None:
            module.register_forward_pre_hook(sparsify(kind))
    for spec in sys.argv[1:] or ["all=0"]:
        zeroed.clear()
        zeroed.update(parse(spec))
        counts: dict[float, list[int]] = {}  # temperature -> matches, positions, chain tokens, chain steps
        began = time.perf_counter()
        with torch.inference_mode():
            for row in answers:
                prompt, answer = row["prompt"], row["answer"]
                logits = model(torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1 :]  # [T, V]
                matches = draft_matches(logits, answer, Setting(row["t"]).sampling(1), len(prompt), 151936)
                tokens, steps = replay(matches, 4)
                count = counts.setdefault(row["t"], [0, 0, 0, 0])
                for i, value in enumerate((sum(matches), len(matches), tokens, steps)):
                    count[i] += value
        line = "  ".join(
            f"T {t}: match {c[0] / c[1]:.3f}, tokens a step (γ 4) {c[2] / c[3]:.3f}" for t, c in sorted(counts.items())
        )
        print(f"{spec:<30} {line}  ({time.perf_counter() - began:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
