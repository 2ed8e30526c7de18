"""The MoE caveat, measured: t(k)/t(1) of a mixture of experts against a dense model of the same active size.

Verifying k tokens in one forward reads each weight once for all k, which is why speculation pays when decoding
is memory-bound. A mixture of experts reads only the experts its router picks: one token touches top-k of them,
a block of k tokens the union of their picks, so a verify block reads more weights than a plain step and its
cost grows faster with k. This tool measures that with transformers (experts run one by one, only the ones hit,
as llama.cpp's and the eager implementation do) on two models of a real shape with random weights (cost curves do
not depend on trained values):

- ``moe``: OLMoE-1B-7B's configuration (16 layers, hidden 2048, 64 experts of 1024, 8 per token, 6.9 B
  parameters, 1.3 B active);
- ``dense``: the same model with one dense MLP of 8 × 1024 = 8192 in place of the experts (the same active
  parameters and FLOPs per token).

For each, at ``--context`` cached tokens: the time of a forward over k new tokens (the median of ``--repeats``,
the cache rolled back after each), and for the MoE the distinct experts a block of k touches per layer. Random
weights route alike (the tokens' hidden states share one direction), so a block touches few experts: a lower
bound. ``--routing independent`` draws each token's experts at random instead: the upper bound. A trained
router's picks for neighbouring tokens overlap somewhat, between the two.

    python tools/moe_cost.py --out results/moe-cost-xeon/cpu.json             # CPU, the bench's threads
    python tools/moe_cost.py --device cuda --out moe-h100.json                 # a GPU, same shapes

The JSON holds both curves; ``--goodput`` adds the γ that quickdraft's goodput policy picks from each curve for a
range of acceptance rates (with ``--draft-ms``, the cost of one drafted token).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

OLMOE = {  # allenai/OLMoE-1B-7B-0924's config.json (the shape; the weights here are random)
    "hidden_size": 2048,
    "intermediate_size": 1024,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "vocab_size": 50304,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "norm_topk_prob": False,
}


def build(kind: str, layers: int, device: str, dtype: torch.dtype, experts: str = "eager") -> torch.nn.Module:
    """The model on ``device`` with random weights (transformers' initialization)."""
    from transformers import LlamaConfig, LlamaForCausalLM, OlmoeConfig, OlmoeForCausalLM

    shape = {**OLMOE, "num_hidden_layers": layers}
    if kind == "moe":
        config = OlmoeConfig(**shape)
        config._experts_implementation = experts  # eager: the hit experts one by one, reading only what is used
        model_class = OlmoeForCausalLM
    else:
        dense = {k: v for k, v in shape.items() if k not in ("num_experts", "num_experts_per_tok", "norm_topk_prob")}
        dense["intermediate_size"] = OLMOE["intermediate_size"] * OLMOE["num_experts_per_tok"]
        config = LlamaConfig(**dense)
        model_class = LlamaForCausalLM
    config._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # made in its dtype on its device: no float32 copy of 6.9 B parameters
    try:
        with torch.device(device):
            model = model_class(config)  # transformers' own initialization: N(0, 0.02)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def route_independently(model: torch.nn.Module) -> None:
    """Each token's experts drawn at random, independently of the others' (uniform weights): the most experts a
    block can touch. Random weights alone route alike tokens alike (their hidden states share one direction), the
    fewest; a trained router lies between."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(2)
    for layer in model.model.layers:
        router = layer.mlp.gate

        def forward(hidden_states: torch.Tensor, router: torch.nn.Module = router) -> tuple:
            hidden_states = hidden_states.reshape(-1, router.hidden_dim)
            logits = torch.nn.functional.linear(hidden_states, router.weight)  # [T, E]: computed as usual
            draws = torch.rand(logits.shape, generator=generator, device=logits.device)
            indices = draws.topk(router.top_k, dim=-1).indices  # [T, top_k]
            weights = torch.full(indices.shape, 1.0 / router.top_k, dtype=logits.dtype, device=logits.device)
            return logits, weights, indices

        router.forward = forward


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(model: torch.nn.Module, kind: str, context: int, ks: list[int], repeats: int, device: str) -> dict:
    """Median ms of a forward over k new tokens at ``context`` cached ones; experts touched per layer (MoE)."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(1)
    vocab = OLMOE["vocab_size"]
    prompt = torch.randint(vocab, (1, context), generator=generator).to(device)
    touched: list[int] = []
    hooks = []
    if kind == "moe":
        for layer in model.model.layers:  # the router returns (logits, weights, indices [tokens, top_k])
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda module, args, output: touched.append(int(output[2].unique().numel()))
            ))  # fmt: skip
    result: dict = {"ms": {}, "experts_touched_per_layer": {}}
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        started = time.perf_counter()
        model(prompt, past_key_values=cache, use_cache=True)
        synchronize(device)
        result["prefill_s"] = time.perf_counter() - started
        for k in ks:
            times, experts = [], []
            for r in range(repeats + 1):  # the first is a warm-up
                block = torch.randint(vocab, (1, k), generator=generator).to(device)
                touched.clear()
                synchronize(device)
                started = time.perf_counter()
                model(block, past_key_values=cache, use_cache=True)
                synchronize(device)
                elapsed = time.perf_counter() - started
                cache.crop(-k)  # back to the context (a negative length: tokens removed, in every version)
                if r:
                    times.append(1000 * elapsed)
                    experts.append(statistics.mean(touched) if touched else 0.0)
            result["ms"][k] = statistics.median(times)
            if kind == "moe":
                result["experts_touched_per_layer"][k] = statistics.mean(experts)
            print(f"{kind} k={k}: {result['ms'][k]:.1f} ms" + (f", {statistics.mean(experts):.1f} experts a layer"
                  if kind == "moe" else ""), file=sys.stderr, flush=True)  # fmt: skip
    for hook in hooks:
        hook.remove()
    return result


def add_goodput_picks(report: dict, draft_ms: float | None) -> None:
    """Each curve's γ picks (quickdraft's cost model; ``draft_ms`` default: t(1) / 10)."""
    for model in report["models"].values():
        curve = {int(k): ms for k, ms in model["ms"].items()}
        model["draft_ms"] = draft_ms if draft_ms is not None else curve[1] / 10
        model["goodput_gamma"] = goodput_picks(curve, model["draft_ms"], [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 16)


def goodput_picks(curve: dict[int, float], draft_ms: float, rates: list[float], max_gamma: int) -> dict[str, int]:
    """The γ quickdraft's goodput policy picks from this curve at each acceptance rate."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from quickdraft.costs import CostModel
    from quickdraft.policies import best_gamma

    costs = CostModel({int(k): ms for k, ms in curve.items()}, draft_ms)
    return {f"{rate:.2f}": best_gamma(costs, rate, max_gamma) for rate in rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--layers", type=int, default=OLMOE["num_hidden_layers"], help="layers (16: the real depth)")
    parser.add_argument("--context", type=int, default=512, help="cached tokens before each block (512)")
    parser.add_argument("--ks", default="1,2,3,4,5,6,8,12,16", help="block sizes")
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per block size (median)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--models", default="moe,dense")
    parser.add_argument(
        "--routing", default="model", choices=("model", "independent"),
        help="model: the random router's own picks; independent: each token's experts drawn at random",
    )  # fmt: skip
    parser.add_argument(
        "--experts", default="eager", help="transformers' experts implementation (eager; on a GPU also grouped_mm)"
    )
    parser.add_argument("--goodput", action="store_true", help="add goodput's γ per acceptance rate")
    parser.add_argument("--draft-ms", type=float, default=None, help="one drafted token's ms (default: t(1) / 10)")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument(
        "--picks-only", action="store_true", help="add goodput's picks to the --out file, measure nothing"
    )
    args = parser.parse_args()
    if args.picks_only:  # curves measured elsewhere (a GPU machine without quickdraft's dependencies)
        report = json.loads(Path(args.out).read_text(encoding="utf-8"))
        add_goodput_picks(report, args.draft_ms)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    dtype = getattr(torch, args.dtype)
    report: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "dtype": args.dtype, "layers": args.layers, "context": args.context,
        "torch": torch.__version__, "experts": args.experts, "routing": args.routing, "shape": OLMOE, "models": {},
    }  # fmt: skip
    for kind in args.models.split(","):
        model = build(kind, args.layers, args.device, dtype, args.experts)
        if kind == "moe" and args.routing == "independent":
            route_independently(model)
        report["models"][kind] = {
            "parameters": sum(p.numel() for p in model.parameters()),
            **measure(model, kind, args.context, ks, args.repeats, args.device),
        }
        curve = report["models"][kind]["ms"]
        report["models"][kind]["ratio"] = {k: ms / curve[1] for k, ms in curve.items()} if 1 in curve else {}
        del model
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.goodput:
        add_goodput_picks(report, args.draft_ms)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
