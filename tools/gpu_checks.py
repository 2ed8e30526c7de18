"""The GPU checks of issue 48 in one command, on a machine with a CUDA GPU; everything lands in one folder.

    python tools/gpu_checks.py --out results/gpu-h200        (on the GPU machine: --out "$OUT")

1. ``pytest tests/gpu`` (the lossless checks, the host round trips of a step): pytest.log.
2. Cost curves t(k) and t(k)/t(1) of random-weight models of real shapes on the transformers runtime in bf16 (the
   default pair's Qwen2.5-1.5B and 0.5B, the seeds' Gemma-7B and Gemma-2B): k new tokens after 512 cached ones,
   timed by CUDA events and by the wall clock (synchronized), median of 10 after 3 warm-ups. Trained weights are not
   needed for timing.
3. The engine's overhead per step: the random 1.5B/0.5B pair decodes greedily at a fixed γ; the wall time of a step
   against the forwards it runs, timed alone (t_target(γ + 1) + γ·t_draft(1)), and plain decoding's against t(1).
4. Goodput on the GPU: its calibration measured there (``measure_cost_model``) and the γ it plans at several α.
5. ``quickdraft generate --device cuda`` on a tiny Llama directory, end to end (goodput calibrates on the GPU).

Writes gpu_checks.json, report.md and pytest.log; prints the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from quickdraft.api import Pipeline  # noqa: E402
from quickdraft.config import GenerationConfig  # noqa: E402
from quickdraft.costs.calibration import measure_cost_model  # noqa: E402
from quickdraft.drafters import DRAFTERS  # noqa: E402
from quickdraft.policies.planner import best_gamma  # noqa: E402
from quickdraft.runtime import HFRuntime  # noqa: E402

SHAPES = {  # released models' shapes: (transformers config class, its fields)
    "qwen2.5-1.5b": ("Qwen2Config", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         tie_word_embeddings=True)),
    "gemma-7b": ("GemmaConfig", dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                                     num_attention_heads=16, num_key_value_heads=16, head_dim=256,
                                     vocab_size=256000)),
    "gemma-2b": ("GemmaConfig", dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                                     num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=256000)),
}  # fmt: skip
KS = (1, 2, 4, 8, 16, 32, 64)
DEVICE = torch.device("cuda")  # --device cpu: a dry run of the script itself (wall clock only), no GPU numbers
CONTEXT = 512
GAMMA = 4


def random_model(shape: str) -> HFRuntime:
    """A random-weight model of ``shape``, made on the GPU in bf16."""
    import transformers

    config_name, fields = SHAPES[shape]
    config = getattr(transformers, config_name)(max_position_embeddings=4096, **fields)
    torch.manual_seed(0)
    with DEVICE:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return HFRuntime(model.eval())


class EventTimer:
    """CUDA events around a block: the GPU's own time of the work queued inside it."""

    def __enter__(self) -> EventTimer:
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.start.record()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end.record()

    def elapsed_ms(self) -> float:
        self.end.synchronize()
        return self.start.elapsed_time(self.end)


def cost_curve(runtime: HFRuntime, repeats: int = 10, warmup: int = 3) -> dict[str, dict[int, float]]:
    """t(k) in ms after :data:`CONTEXT` cached tokens: CUDA events and the synchronized wall clock, medians."""
    cache = runtime.new_cache(1)
    runtime.fill_placeholder(cache, CONTEXT)
    generator = torch.Generator().manual_seed(0)
    events: dict[int, float] = {}
    wall: dict[int, float] = {}
    for k in KS:
        token_ids = torch.randint(0, runtime.vocab_size, (1, k), generator=generator)  # [1, k]
        by_event, by_wall = [], []
        for repeat in range(warmup + repeats):
            timer = EventTimer() if DEVICE.type == "cuda" else None
            runtime.synchronize()
            started = time.perf_counter()
            with timer or contextlib.nullcontext():
                runtime.forward(token_ids, cache)
            runtime.synchronize()
            if repeat >= warmup:
                by_wall.append(1000 * (time.perf_counter() - started))
                by_event.append(timer.elapsed_ms() if timer else by_wall[-1])
            cache.truncate(CONTEXT)
        events[k], wall[k] = statistics.median(by_event), statistics.median(by_wall)
    return {"events_ms": events, "wall_ms": wall}


def engine_overhead(target: HFRuntime, draft: HFRuntime, tokens: int) -> dict[str, Any]:
    """The median wall time of a step of greedy decoding that drafts γ = :data:`GAMMA` tokens, and of a plain step,
    through the engine and through a bare loop of the same forwards at the same contexts (argmax, the token to the
    host, the caches rolled back; no engine), taking turns, after one untimed round of both (a GPU's first pass over
    new context lengths is slower): the difference is what the engine adds."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_level(target.vocab_size))
    pipeline = Pipeline(target=target, tokenizer=tokenizer, eos_token_ids=frozenset(), draft=draft)
    prompt = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    runs = {}
    for name, drafter, gamma in (("plain", "none", 0), ("draft-model", "draft-model", GAMMA)):
        config = GenerationConfig(max_new_tokens=tokens, num_draft_tokens=gamma)
        pipeline.generate(prompt, config, drafter)  # warm-up
        bare_steps(target, draft, prompt, tokens, gamma)
        engine_ms, split, bare_ms = [], [], []
        for _ in range(2):
            bare_ms.append(statistics.median(bare_steps(target, draft, prompt, tokens, gamma)))
            stats = pipeline.generate(prompt, config, drafter).stats
            ends = stats.step_times_s  # [1 + steps]: the prefill's token, then each step's commit
            proposed = stats.proposed_per_step or [0] * (len(ends) - 1)  # [steps]
            durations = [1000 * (ends[i + 1] - ends[i]) for i in range(len(ends) - 1)]
            full = [ms for ms, drafted in zip(durations, proposed, strict=True) if drafted == gamma][1:]
            engine_ms.append(statistics.median(full or durations))  # the first step also reads the prompt
            steps = len(ends) - 1
            split.append({"draft_ms": 1000 * stats.draft_s / steps, "verify_ms": 1000 * stats.verify_s / steps})
        overhead = min(engine_ms) - min(bare_ms)
        runs[name] = {"engine_step_ms": engine_ms, "bare_step_ms": bare_ms, "engine_split": split,
                      "overhead_ms": overhead, "accepted": stats.draft_tokens_accepted}  # fmt: skip
    return {"gamma": GAMMA, "tokens": tokens, "runs": runs}


def bare_steps(target: HFRuntime, draft: HFRuntime, prompt: list[int], tokens: int, gamma: int) -> list[float]:
    """Milliseconds of each step of a minimal greedy loop: γ draft forwards (each token to the host), one target
    forward over the last token and the drafts, its choices to the host, one token committed (as with drafts that
    are all rejected: random models), both caches rolled back."""
    target_cache, draft_cache = target.new_cache(1), draft.new_cache(1)
    last = int(target.forward(torch.tensor([prompt]), target_cache, last_only=True)[0, -1].argmax())
    if gamma:
        draft.forward(torch.tensor([prompt]), draft_cache, last_only=True)
    times = []
    for _ in range(tokens):
        target.synchronize()
        started = time.perf_counter()
        length = int(target_cache.lengths[0])
        feed, drafts = [last], []
        for _ in range(gamma):
            drafts.append(int(draft.forward(torch.tensor([feed]), draft_cache, last_only=True)[0, -1].argmax()))
            feed = [drafts[-1]]
        choices = target.forward(torch.tensor([[last, *drafts]]), target_cache)[0].argmax(dim=-1).tolist()  # [γ + 1]
        last = choices[0]
        target_cache.truncate(length + 1)
        if gamma:
            draft_cache.truncate(length + 1)
        target.synchronize()
        times.append(1000 * (time.perf_counter() - started))
    return times[1:]


def profile_steps(target: HFRuntime, draft: HFRuntime) -> str:
    """Where a step's time goes on the host: cProfile of plain decoding and of drafting at γ, by own time."""
    import cProfile
    import io
    import pstats

    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_level(target.vocab_size))
    pipeline = Pipeline(target=target, tokenizer=tokenizer, eos_token_ids=frozenset(), draft=draft)
    text = io.StringIO()
    for drafter, gamma in (("none", 0), ("draft-model", GAMMA)):
        config = GenerationConfig(max_new_tokens=32, num_draft_tokens=gamma)
        pipeline.generate(list(range(64)), config, drafter)
        profiler = cProfile.Profile()
        profiler.enable()
        pipeline.generate(list(range(64)), config, drafter)
        profiler.disable()
        text.write(f"## {drafter}, γ {gamma}, 32 tokens\n")
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    return text.getvalue()


def _word_level(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def goodput_plans(target: HFRuntime, draft: HFRuntime) -> dict[str, Any]:
    """Goodput's costs as its calibration measures them on the GPU, and the γ it plans at several α."""
    measurement = measure_cost_model(target, draft, DRAFTERS.get("draft-model"), max_draft_tokens=16)
    costs = measurement.costs
    plans = {f"{alpha:.1f}": best_gamma(costs, alpha, 16) for alpha in (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)}
    return {"target_ms": costs.target_ms, "draft_ms": costs.draft_ms, "unsteady": measurement.unsteady, "plans": plans}


def cli_on_gpu(out: Path) -> dict[str, Any]:
    """``quickdraft generate --device cuda`` on a tiny Llama directory, goodput calibrating there; its output."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny"
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
        LlamaForCausalLM(config).save_pretrained(model_dir)  # a family whose AutoTokenizer keeps a toy tokenizer
        PreTrainedTokenizerFast(tokenizer_object=_word_level(64), eos_token="w63").save_pretrained(model_dir)
        command = [sys.executable, "-m", "quickdraft", "generate", "w1 w2 w3", "--target", str(model_dir),
                   "--draft", str(model_dir), "--device", DEVICE.type, "--runtime", "transformers",
                   "--max-new-tokens", "16", "--json"]  # fmt: skip
        env = os.environ | {"QUICKDRAFT_CACHE": str(Path(tmp) / "cache"), "PYTHONPATH": str(ROOT)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    (out / "cli.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    output = json.loads(done.stdout) if done.returncode == 0 else None
    return {"returncode": done.returncode, "device": output and output["device"], "stats": output and output["stats"]}


def report(results: dict[str, Any]) -> str:
    lines = [f"# GPU checks: {results['gpu']}", "", f"`{results['command']}`; torch {results['torch']}, "
             f"transformers {results['transformers']}, CUDA {results['cuda']}.", "",
             f"pytest tests/gpu: {results['pytest']['summary']}", "",
             f"## Cost curves: t(k) ms after {CONTEXT} cached tokens, bf16, CUDA events (wall clock)", "",
             "| model | " + " | ".join(f"k={k}" for k in KS) + " |", "|---|" + "---|" * len(KS)]  # fmt: skip
    for shape, curve in results["cost_curves"].items():
        events, wall = curve["events_ms"], curve["wall_ms"]
        cells = [f"{events[k]:.2f} ({wall[k]:.2f}) ×{events[k] / events[1]:.2f}" for k in KS]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    overhead = results["engine_overhead"]
    lines += ["", f"## The engine's overhead per step (random Qwen2.5-1.5B/0.5B, γ {overhead['gamma']}, median)", "",
              "| decoding | engine step ms (two runs) | bare loop step ms (two runs) | overhead ms (fastest) |",
              "|---|---|---|---|"]  # fmt: skip
    for name, run in overhead["runs"].items():
        engine, bare = (" / ".join(f"{ms:.2f}" for ms in run[key]) for key in ("engine_step_ms", "bare_step_ms"))
        lines.append(f"| {name} | {engine} | {bare} | {run['overhead_ms']:.2f} |")
    plans = results["goodput"]["plans"]
    lines += ["", "## Goodput's γ from the costs measured on the GPU", "",
              "| α | " + " | ".join(plans) + " |", "|---|" + "---|" * len(plans),
              "| γ | " + " | ".join(str(g) for g in plans.values()) + " |", "",
              f"`quickdraft generate --device cuda`: {results['cli']}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_checks.json, report.md, pytest.log")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="cost-curve shapes (default all)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded for the overhead (default 128)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run of the script")
    args = parser.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_checks: torch sees no CUDA GPU here")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers

    results: dict[str, Any] = {
        "command": " ".join(["python", "tools/gpu_checks.py", *sys.argv[1:]]),
        "gpu": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "none (a dry run on the CPU)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    started = time.perf_counter()

    def save() -> None:  # after each part: a run stopped at its time limit keeps what it measured
        results["seconds"] = time.perf_counter() - started
        (out / "gpu_checks.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-s", "-p", "no:cacheprovider", "--confcutdir", "tests/gpu",
         "tests/gpu"], cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    (out / "pytest.log").write_text(test.stdout + test.stderr, encoding="utf-8")
    results["pytest"] = {"returncode": test.returncode, "summary": (test.stdout.strip().splitlines() or [""])[-1]}
    print(f"pytest: {results['pytest']['summary']} ({time.perf_counter() - started:.0f} s)", flush=True)
    save()
    results["cost_curves"] = {}
    for shape in args.shapes.split(","):
        runtime = random_model(shape)
        results["cost_curves"][shape] = cost_curve(runtime)
        print(f"{shape}: {results['cost_curves'][shape]['events_ms']}", flush=True)
        save()
        del runtime
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    target, draft = random_model("qwen2.5-1.5b"), random_model("qwen2.5-0.5b")
    results["engine_overhead"] = engine_overhead(target, draft, args.tokens)
    save()
    results["goodput"] = goodput_plans(target, draft)
    save()
    (out / "profile.txt").write_text(profile_steps(target, draft), encoding="utf-8")
    del target, draft
    results["cli"] = cli_on_gpu(out)
    save()
    (out / "report.md").write_text(report(results), encoding="utf-8")
    print(report(results))


if __name__ == "__main__":
    main()
