"""``bench-serve``'s report: a table per configuration and rate, SmartSpec's claims checked, latency against rate."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quickdraft.bench.serve_load import ServedConfig, parse_rate
from quickdraft.drafters import DEFAULT_DRAFTER

WORKLOAD_NAMES = {"spec-bench": "Spec-Bench prompts", "agent": "recorded agent requests"}
CLAIM_MARGIN = 1.05  # goodput's mean latency may be this much above the better of plain and fixed γ


def rate_label(rate: str) -> str:
    return "1 user" if rate == "seq" else ("all at once" if rate == "inf" else f"{rate} req/s")


def families(configs: list[ServedConfig]) -> dict[str, dict[str, str]]:
    """Per drafter, the names of its fixed-γ and goodput configurations, and plain decoding's (``none``)."""
    configs = [config for config in configs if not config.is_peer and not config.prompt_cache]
    plain = next((c.name for c in configs if c.drafter == "none"), None)
    found: dict[str, dict[str, str]] = {}
    for config in configs:
        if config.drafter == "none" or config.policy is None:
            continue
        kind = "goodput" if config.policy == "goodput" else "fixed" if config.policy.startswith("fixed") else None
        if kind is not None:
            found.setdefault(config.drafter, {"plain": plain or ""})[kind] = config.name
    return {drafter: names for drafter, names in found.items() if names["plain"] and len(names) == 3}


def claims(results: dict[str, Any]) -> list[str]:
    """SmartSpec's claims, measured: at each rate goodput's mean latency ≤ 1.05 × the better of plain and fixed
    γ; at the highest rate its throughput ≥ plain's; at one user its speedup over plain."""
    runs = {(run["config"], run["rate"]): run["summary"] for run in results["runs"]}
    configs = [ServedConfig(**config) for config in results["settings"]["configs"]]
    rates = results["settings"]["rates"]
    checked = families(configs)
    if not checked:
        return [
            "Nothing to check: no drafter ran as plain decoding, at a fixed γ and with goodput, all with prompt caches "
            "off (e.g. `--configs plain=none,fixed-hy=hybrid+fixed:3,goodput-hy=hybrid+goodput`)."
        ]
    lines = []
    for drafter, names in checked.items():
        lines.append(
            f"**{drafter}** (plain = `{names['plain']}`, fixed γ = `{names['fixed']}`, goodput = `{names['goodput']}`):"
        )
        for rate in rates:
            latency = {
                kind: (runs.get((name, rate)) or {}).get("e2e_s", {}).get("mean") for kind, name in names.items()
            }
            if None in latency.values():
                lines.append(f"- {rate_label(rate)}: not measured for all three")
                continue
            failed = {kind: failures(runs[(name, rate)]) for kind, name in names.items()}
            if any(failed.values()):  # their means leave the failed requests out: not a like-for-like comparison
                counts = ", ".join(f"{kind} {count}" for kind, count in failed.items())
                lines.append(f"- {rate_label(rate)}: not comparable, requests failed ({counts})")
                continue
            bound = CLAIM_MARGIN * min(latency["plain"], latency["fixed"])
            verdict = "holds" if latency["goodput"] <= bound else "FAILS"
            ratio = latency["goodput"] / min(latency["plain"], latency["fixed"])
            lines.append(
                f"- {rate_label(rate)}: mean latency goodput {latency['goodput']:.2f} s, "
                f"plain {latency['plain']:.2f} s, fixed γ {latency['fixed']:.2f} s; "
                f"goodput ÷ the better = {ratio:.2f}: ≤ 1.05 {verdict}"
            )
        top = max(rates, key=parse_rate)
        throughput = {kind: (runs.get((name, top)) or {}).get("throughput_tok_s") for kind, name in names.items()}
        if None not in throughput.values() and not any(failures(runs[(name, top)]) for name in names.values()):
            verdict = "holds" if throughput["goodput"] >= throughput["plain"] else "FAILS"
            lines.append(
                f"- saturation ({rate_label(top)}): goodput {throughput['goodput']:.1f} tok/s, plain "
                f"{throughput['plain']:.1f}, fixed γ {throughput['fixed']:.1f}: goodput ≥ plain {verdict}"
            )
        if "seq" in rates and all(runs.get((names[k], "seq")) for k in ("plain", "goodput")):
            plain_mean = runs[(names["plain"], "seq")]["e2e_s"]["mean"]
            speedup = plain_mean / runs[(names["goodput"], "seq")]["e2e_s"]["mean"]
            lines.append(f"- 1 user: goodput's mean latency is {speedup:.2f}× shorter than plain decoding's")
    return lines


def against_peers(results: dict[str, Any]) -> list[str]:
    """quickdraft's default (its first goodput configuration of the default drafter, else its first goodput one)
    against the best llama-server configuration at each rate, with prompt caches off, then on (where both ran)."""
    configs = [ServedConfig(**config) for config in results["settings"]["configs"]]
    lines: list[str] = []
    for cached in (False, True):
        alike = [config for config in configs if config.prompt_cache == cached]
        goodput = [c for c in alike if not c.is_peer and c.policy == "goodput"]
        ours = next((c for c in goodput if c.drafter == DEFAULT_DRAFTER), goodput[0] if goodput else None)
        peers = [c.name for c in alike if c.is_peer]
        if ours is not None and peers:
            lines += ["", "With prompt caches on (`:cache`):" if cached else "With prompt caches off:", ""]
            lines += side_by_side(results, ours.name, peers)
    return lines[1:]


def failures(summary: dict[str, Any]) -> int:
    """Requests of a run that failed: the run's means and percentiles leave them out."""
    return len(summary.get("errors") or [])


def side_by_side(results: dict[str, Any], ours: str, peers: list[str]) -> list[str]:
    runs = {(run["config"], run["rate"]): run["summary"] for run in results["runs"]}
    lines = [
        f"quickdraft's `{ours}` against the best llama-server configuration at each rate (of {', '.join(peers)}).",
        "",
        "| rate | quickdraft mean e2e | best llama-server mean e2e | latency ÷ | quickdraft tok/s | "
        "best llama-server tok/s | throughput × |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, tuple[float, float]] = {}  # rate: (latency ÷, throughput ×)
    for rate in results["settings"]["rates"]:
        mine = runs.get((ours, rate))
        theirs = {name: runs[(name, rate)] for name in peers if (name, rate) in runs}
        if mine is None or not theirs or mine["e2e_s"]["mean"] is None:
            continue
        failed = failures(mine) + sum(failures(summary) for summary in theirs.values())
        if failed:  # the means leave the failed requests out: not a like-for-like comparison
            lines.append(f"| {rate_label(rate)} | not comparable: {failed} requests failed | | | | | |")
            continue
        fastest = min(theirs, key=lambda name: theirs[name]["e2e_s"]["mean"] or math.inf)
        busiest = max(theirs, key=lambda name: theirs[name]["throughput_tok_s"] or 0.0)
        ratios[rate] = (
            mine["e2e_s"]["mean"] / (theirs[fastest]["e2e_s"]["mean"] or math.nan),
            (mine["throughput_tok_s"] or 0.0) / (theirs[busiest]["throughput_tok_s"] or math.nan),
        )
        lines.append(
            f"| {rate_label(rate)} | {fmt(mine['e2e_s']['mean'])} s | {fmt(theirs[fastest]['e2e_s']['mean'])} s "
            f"(`{fastest}`) | {ratios[rate][0]:.2f} | {fmt(mine['throughput_tok_s'], 1)} | "
            f"{fmt(theirs[busiest]['throughput_tok_s'], 1)} (`{busiest}`) | {ratios[rate][1]:.2f} |"
        )
    if ratios:
        top = max(ratios, key=parse_rate)
        faster = all(latency < 1 for latency, _ in ratios.values())
        lines += ["", f"Lower mean latency at every rate: {'yes' if faster else 'NO'}; higher throughput at "
                  f"saturation ({rate_label(top)}): {'yes' if ratios[top][1] > 1 else 'NO'}."]  # fmt: skip
    return lines


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def decoding(settings: dict[str, Any]) -> str:
    """How the requests chose tokens: greedy, or sampled at a temperature (seeded or not)."""
    temperature, seed = settings.get("temperature", 0.0), settings.get("sampling_seed")
    if not temperature:
        return "greedy"
    return f"temperature {temperature}, " + (f"seed {seed}" if seed is not None else "unseeded")


def write_report(out: Path, results: dict[str, Any]) -> bool:
    """report.md (and latency.png when matplotlib is there); True if the plot was written."""
    settings = results["settings"]
    lines = [
        "# bench-serve",
        "",
        f"{settings['num_prompts']} {WORKLOAD_NAMES[settings.get('workload', 'spec-bench')]} per run (chat, "
        f"{decoding(settings)}, "
        f"{settings['max_tokens']} new tokens at "
        f"most), streamed by the openai client; server: `{settings['server']}`. Latencies in seconds; TPOT: time "
        "per output token after the first; lossless: responses equal to single-request plain decoding.",
        "",
        "| config | rate | done | tok/s | TTFT mean / p50 / p90 / p99 | TPOT mean / p50 / p90 / p99 | "
        "e2e mean / p50 / p90 / p99 | lossless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        s = run["summary"]
        quantiles = [" / ".join(fmt(s[key][q], 3 if key == "tpot_s" else 2) for q in ("mean", "p50", "p90", "p99"))
                     for key in ("ttft_s", "tpot_s", "e2e_s")]  # fmt: skip
        lossless = f"{s['lossless']}/{s['compared']}" if "compared" in s else "–"
        lines.append(
            f"| {run['config']} | {rate_label(run['rate'])} | {s['completed']}/{s['requests']} | "
            f"{fmt(s['throughput_tok_s'], 1)} | {' | '.join(quantiles)} | {lossless} |"
        )
    lines += ["", "## SmartSpec's claims, measured here", "", *claims(results)]
    if peer_lines := against_peers(results):
        lines += ["", "## quickdraft against llama.cpp's server", "", *peer_lines]
        lines += ["", "llama-server's command lines:", ""]
        lines += [f"- `{name}`: `{command}`" for name, command in settings.get("peer_servers", {}).items()]
    if (alone := results.get("single_request")) is not None and "seq" in settings["rates"]:
        runs = {run["config"]: run["summary"] for run in results["runs"] if run["rate"] == "seq"}
        lines += ["", "## One user: the server against the single-request engine", ""]
        lines += ["| config | single-request engine, mean latency | server, 1 user, mean latency |", "|---|---|---|"]
        for name, single in alone.items():
            served = runs.get(name, {}).get("e2e_s", {}).get("mean")
            lines.append(f"| {name} | {fmt(single['e2e_s']['mean'])} s | {fmt(served)} s |")
    if (cut := results.get("disconnects")) is not None:
        s = cut["summary"]
        lines += [
            "",
            "## Clients disconnecting",
            "",
            f"`{cut['config']}` at {rate_label(cut['rate'])}: {s['disconnected']} of {s['requests']} clients closed "
            f"their stream mid-way; {s['completed']} of the other {s['requests'] - s['disconnected']} completed, "
            f"{s.get('lossless', '–')} of them lossless, errors: {len(s['errors'])}. Server memory (resident): "
            f"{fmt(cut['rss_idle_before_mb'], 0)} MB idle before, {fmt(cut['rss_idle_after_mb'], 0)} MB idle after; "
            f"running after: {cut['running_after']}.",
        ]
        if not s["disconnected"]:  # each client leaves at random: a run of few may test nothing
            advice = "raise --disconnect-fraction or --num-prompts"
            lines += ["", f"No client disconnected, so nothing was tested: {advice}."]
    planned = results.get("planned", {})
    missing = planned.get("runs", 0) - len(results["runs"]) + (planned.get("disconnects", False) and not cut)
    if missing > 0:  # saved after each run: a bench stopped part-way says so
        lines[1:1] = ["", f"**Incomplete:** {missing} of the planned runs are missing (stopped before they ran)."]
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return plot(out, results)


def plot(out: Path, results: dict[str, Any]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rates = results["settings"]["rates"]
    figure, (latency_axis, throughput_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for config in results["settings"]["configs"]:
        runs = {run["rate"]: run["summary"] for run in results["runs"] if run["config"] == config["name"]}
        xs = [i for i, rate in enumerate(rates) if rate in runs]
        latency_axis.plot(xs, [runs[rates[i]]["e2e_s"]["mean"] for i in xs], marker="o", label=config["name"])
        throughput_axis.plot(xs, [runs[rates[i]]["throughput_tok_s"] for i in xs], marker="o", label=config["name"])
    for axis, title in ((latency_axis, "mean end-to-end latency (s)"), (throughput_axis, "throughput (tokens/s)")):
        axis.set_xticks(range(len(rates)), [rate_label(rate) for rate in rates], rotation=20)
        axis.set_xlabel("request rate")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    latency_axis.legend()
    figure.tight_layout()
    figure.savefig(out / "latency.png", dpi=110)
    plt.close(figure)
    return True
