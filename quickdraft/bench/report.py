"""Benchmark outputs: ``report.md`` (tables) and the plots ``speedup.png``, ``accept_hist.png``, ``cost_curve.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quickdraft.bench.base import run_seed
from quickdraft.bench.metrics import category_group
from quickdraft.costs.calibration import CurveRole

COLUMNS = (
    ("speedup", "speedup", "{:.2f}×"),
    ("speedup_ci95", "95 % interval", "{0[0]:.2f}–{0[1]:.2f}×"),
    ("tokens_per_s", "tokens/s", "{:.2f}"),
    ("decode_speedup", "speedup after the prompt", "{:.2f}×"),
    ("prefill_s", "prompt s", "{:.2f}"),
    ("mean_accepted_tokens", "τ", "{:.2f}"),
    ("acceptance_rate", "α", "{:.2f}"),
    ("lossless_fraction", "lossless", "{:.2f}"),
    ("agreement", "agreement", "{:.2f}"),
    ("efficiency", "efficiency", "{:.2f}"),
    ("latency_p50_ms", "p50 ms/token", "{:.0f}"),
    ("latency_p90_ms", "p90 ms/token", "{:.0f}"),
    ("n_questions", "questions", "{}"),
)


def cell(value: Any, pattern: str) -> str:
    return "–" if value is None else pattern.format(value)


def row(*cells: Any) -> str:
    """A markdown table row."""
    return "| " + " | ".join(map(str, cells)) + " |"


def header(*titles: str) -> list[str]:
    """A markdown table's header and its rule."""
    return [row(*titles), "|---|" + "---|" * (len(titles) - 1)]


def category_table(methods: dict[str, Any], categories: list[str], key: str, pattern: str) -> list[str]:
    """One row per method: its ``key`` in each category and overall."""
    groups = [*categories, "overall"]
    lines = header("method", *groups)
    for name, result in methods.items():
        lines.append(row(name, *(cell(category_group(result, c)[key], pattern) for c in groups)))
    return lines


def split_cost_curves(results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The per-step cost curves (target, draft: k new tokens -> ms) and the draft's prefill curve, if any (what a
    longer context adds, ms per cached token, is apart: :func:`context_cost_line`)."""
    curves = dict(results.get("cost_curves") or {})
    for role in (CurveRole.TARGET_CONTEXT, CurveRole.DRAFT_CONTEXT):
        curves.pop(role, None)
    return curves, curves.pop(CurveRole.DRAFT_PREFILL, None)


def context_cost_line(results: dict[str, Any]) -> list[str]:
    """What 1,000 more cached tokens add to a forward, by the measured context curves (none: no line)."""
    curves = results.get("cost_curves") or {}
    parts = [
        f"{role.removesuffix('_context')} k={k} {1000 * ms:.1f} ms"
        for role in (CurveRole.TARGET_CONTEXT, CurveRole.DRAFT_CONTEXT)
        for k, ms in sorted((int(k), ms) for k, ms in (curves.get(role) or {}).items())
    ]
    if not parts:
        return []
    return ["", f"What 1,000 more cached tokens add to a forward (goodput plans with it): {', '.join(parts)}."]


def incomplete(missing: dict[str, str]) -> list[str]:
    """The report's warning for methods whose entries of the questions and runs asked for are not all measured."""
    if not missing:
        return []
    listed = ", ".join(f"{method} ({entries} entries)" for method, entries in missing.items())
    return [
        f"**Incomplete**: {listed}; their figures cover only what was measured (resume the run to finish them): a "
        "speedup the questions both methods answered, tokens/s and prompt times each method's own."
    ]


def sessions_apart(mixed: dict[str, list[int]]) -> list[str]:
    """The report's warning for methods timed in another session than their baseline (a resume measured part)."""
    if not mixed:
        return []
    listed = ", ".join(f"{method} (run {', '.join(map(str, runs))})" for method, runs in mixed.items())
    return [
        f"**Measured in more than one session**: {listed}: a resume timed part of these entries or their "
        "baseline's, so their ratio compares sessions the machine may have run at different speeds; measure them "
        "again together (a new --out) to compare within one session."
    ]


def decoding(config: dict[str, Any]) -> str:
    """How the run chose tokens: greedy, or sampled at a temperature (seeded or not)."""
    if config.get("greedy", True):
        return "greedy"
    seed, runs = config.get("sampling_seed"), config.get("runs", 1)
    if seed is None:
        return f"sampled at temperature {config['temperature']} (unseeded)"
    seeds = f"seed {seed}" if runs == 1 else f"seeds {seed} to {run_seed(seed, runs - 1)}, one a run"
    return f"sampled at temperature {config['temperature']} ({seeds}: our methods' text must equal plain decoding's)"


def runs_on(machine: dict[str, Any]) -> str:
    """`` (target native, draft native)``: the runtimes the models ran on, where the run recorded them."""
    runtimes = machine.get("runtimes") or {}
    chosen = [f"{role} {name}" for role, name in runtimes.items() if name]
    return f" ({', '.join(chosen)})" if chosen else ""


def sample_note(config: dict[str, Any]) -> str:
    """How the questions were drawn: a seeded sample of a question file, or one per context length."""
    if config["seed"] is None:
        return "one per context length"
    return f"{config['per_category'] or 'all'} per category, seed {config['seed']}{only_categories(config)}"


def only_categories(config: dict[str, Any]) -> str:
    """The report's note of ``--categories`` (empty when every category of the sample ran)."""
    kept = config.get("only_categories")
    return f"; only {', '.join(kept)} of the sample" if kept else ""


def write_markdown(results: dict[str, Any], path: Path) -> None:
    config, machine, methods = results["config"], results["machine"] or {}, results["methods"]
    revisions = results.get("revisions") or {}
    categories = config["categories"]
    asked = f"{config['n_questions']} question{'' if config['n_questions'] == 1 else 's'}"
    lines = [
        "# quickdraft bench",
        "",
        f"Questions: `{config['questions']}`, {asked} "
        f"({sample_note(config)}); "
        f"max_new_tokens {config['max_new_tokens']}; {decoding(config)}; runs {config['runs']}, "
        f"warm-up {config['warmup']}.",
        f"Target `{config['target']}`, "
        + (f"draft `{config['draft']}`" if config["draft"] else "no draft model")
        + f", runtime {config['runtime']}{runs_on(machine)}.",
        f"Machine: {machine.get('platform')}, {machine.get('cpu')}, torch {machine.get('torch')}, "
        f"transformers {machine.get('transformers')}"
        + (f", llama-cpp-python {machine['llama_cpp_python']}" if machine.get("llama_cpp_python") else "")
        + (f", openvino-genai {machine['openvino_genai']}" if machine.get("openvino_genai") else "")
        + f", {machine.get('threads')} threads.",
        "Code (the quickdraft commit of each measured entry): "
        + (", ".join(f"{revision} ({count} entries)" for revision, count in revisions.items()) or "none recorded")
        + ".",
        *incomplete(results.get("incomplete") or {}),
        *sessions_apart(results.get("mixed_sessions") or {}),
        "",
        "Speedup = mean per-question tokens/s ÷ the baseline's (Spec-Bench; for METHOD@RUNTIME, baseline@RUNTIME's). "
        "τ = tokens per target step. "
        "α = accepted ÷ proposed drafts. lossless = share of questions whose tokens equal that baseline's. "
        "agreement = the same share for peers (transformers, llama.cpp, OpenVINO), whose arithmetic differs from ours: "
        "how often their greedy tokens match, not a lossless check. "
        "efficiency = measured speedup ÷ the speedup predicted from α, γ and the measured cost curves.",
        "",
        "## Speedup per category",
        "",
        *category_table(methods, categories, "speedup", "{:.2f}×"),
        "",
        "## Speedup intervals (95 %, bootstrap over questions)",
        "",
        "Each question is drawn again with replacement, keeping all its runs paired with the baseline's: "
        "an interval that excludes 1.00× says the method is faster (or slower) than its baseline beyond "
        "this sample's question-to-question and run-to-run noise. Percentiles expanded for few questions "
        "(Hesterberg); with 5 a category's interval still holds the true speedup a little less than 95 % "
        "of the time (docs/benchmarks.md).",
        "",
        *category_table(methods, categories, "speedup_ci95", "{0[0]:.2f}–{0[1]:.2f}"),
    ]
    lines += oracle_section(results, categories)
    for title, category in [("Overall", "overall"), *((c, c) for c in categories)]:
        lines += ["", f"## {title}", "", *header("method", *(heading for _, heading, _ in COLUMNS))]
        for name, result in methods.items():
            metrics = category_group(result, category)
            lines.append(row(name, *(cell(metrics[key], fmt) for key, _, fmt in COLUMNS)))
    curves, prefill = split_cost_curves(results)
    if curves:
        lines += ["", f"## Cost curves (ms per forward of k new tokens, {config['profile_context']} cached)", ""]
        ks = sorted({int(k) for curve in curves.values() for k in curve})
        lines += header("model", *(f"k={k}" for k in ks))
        lines += [row(role, *(cell(curve.get(str(k)), "{:.1f}") for k in ks)) for role, curve in curves.items()]
    if prefill:
        reads = ", ".join(f"{n} tokens {ms:.0f} ms" for n, ms in sorted((int(n), ms) for n, ms in prefill.items()))
        lines += ["", f"Draft model reading a prompt into an empty cache (goodput weighs it): {reads}."]
    lines += context_cost_line(results)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def oracle_section(results: dict[str, Any], categories: list[str]) -> list[str]:
    """The best fixed γ per drafter and category in hindsight, each adaptive method against it, and its γ."""
    best, methods = results.get("oracle") or {}, results["methods"]
    held_out = results.get("held_out_oracle") or {}
    adaptive = [name for name in methods if "+" in name]
    if not best:
        return []
    lines = [
        "",
        "## Best fixed γ in hindsight (oracle) and adaptive policies",
        "",
        "γ = 0 is plain decoding, the baseline itself (1.00×): the oracle where every measured γ loses. "
        "The oracle is the largest of several noisy speedups, so it is biased upward; the held-out oracle "
        "measures, in each run, the γ that was best on the other runs (mean over runs; 2 runs or more).",
        "",
        *header("drafter / method", *categories, "overall"),
    ]
    groups = [*categories, "overall"]
    for drafter, by_category in best.items():
        cells = ["–" if (o := by_category.get(c)) is None else f"{o['speedup']:.2f}× (γ={o['gamma']})" for c in groups]
        lines.append(row(f"{drafter} oracle", *cells))
        unbiased = held_out.get(drafter, {})
        if unbiased:
            lines.append(row(f"{drafter} held-out oracle", *(cell(unbiased.get(c), "{:.2f}×") for c in groups)))
        for name in (n for n in adaptive if n.split("+")[0] == drafter and "@" not in n):  # same runtime only
            cells = []
            for category in groups:
                group = category_group(methods[name], category)
                reference, unbiased_reference = by_category.get(category), unbiased.get(category)
                share = (
                    f" ({group['speedup'] / reference['speedup']:.0%} of oracle"
                    + (f", {group['speedup'] / unbiased_reference:.0%} held out)" if unbiased_reference else ")")
                    if group["speedup"] is not None and reference
                    else ""
                )
                cells.append(cell(group["speedup"], "{:.2f}×") + share)
            lines.append(row(name, *cells))
    for name in adaptive:
        counts = methods[name].get("gamma_counts") or {}
        total = sum(counts.values())
        if total:
            shares = ", ".join(f"γ={g}: {n / total:.0%}" for g, n in counts.items())
            lines.append(f"\nγ chosen by {name}: {shares}")
    return lines


def write_plots(results: dict[str, Any], out: Path) -> bool:
    """The three plots; False (and none written) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    categories = [*results["config"]["categories"], "overall"]
    names = [name for name in methods if name != "baseline"]

    figure, axes = plt.subplots(figsize=(min(16, max(8, 0.25 * len(categories) * max(1, len(names)))), 5))
    width = 0.8 / max(1, len(names))
    colors = plt.get_cmap("tab20").colors  # distinct colours for up to 20 methods
    for i, name in enumerate(names):
        values = [category_group(methods[name], c)["speedup"] or 0.0 for c in categories]
        positions = [x + i * width - 0.4 + width / 2 for x in range(len(categories))]
        axes.bar(positions, values, width, label=name, color=colors[i % len(colors)])
    axes.axhline(1.0, color="black", linewidth=1, linestyle="--", label="baseline")
    axes.set_xticks(range(len(categories)), categories, rotation=20)
    axes.set_ylabel("speedup over our plain decoding (@RUNTIME: on that runtime)")
    axes.legend(fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(out / "speedup.png", dpi=120)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(8, 5))
    for name in methods:
        counts = {int(size): count for size, count in methods[name]["step_size_counts"].items()}
        total = sum(counts.values())
        if total and max(counts) > 1:
            sizes = range(1, max(counts) + 1)
            axes.plot(sizes, [counts.get(s, 0) / total for s in sizes], marker="o", label=name)
    axes.set_xlabel("tokens appended per target step (accepted drafts + 1)")
    axes.set_ylabel("share of steps")
    if axes.get_legend_handles_labels()[0]:  # no line where no method appended more than a token a step
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out / "accept_hist.png", dpi=120)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(8, 5))
    for role, curve in split_cost_curves(results)[0].items():
        ks = sorted(int(k) for k in curve)
        axes.plot(ks, [curve[str(k)] for k in ks], marker="o", label=role)
    axes.set_xlabel("new tokens k in one forward")
    axes.set_ylabel("ms per forward")
    axes.set_ylim(bottom=0)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "cost_curve.png", dpi=120)
    plt.close(figure)
    return True
