"""``quickdraft bench-serve``'s harness (its arguments: :mod:`quickdraft.cli.bench_serve`): start the servers, drive
the load of ``bench/serve_load.py`` through each configuration and rate, check the answers, write the report."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quickdraft.bench.base import run_sampling
from quickdraft.bench.llama_server import free_port, gguf_files, server_command
from quickdraft.bench.llama_tools import SERVER_TOOL, check_tool
from quickdraft.bench.serve_load import (
    Prompt,
    ServedConfig,
    check_reachable,
    parse_rate,
    record_json,
    request_failure,
    run_load,
    summarize_run,
)
from quickdraft.bench.serve_report import write_report
from quickdraft.bench.store import BENCH_FILES
from quickdraft.bench.workloads import DEFAULT_MAX_TOKENS, requests_digest, served_input, workload_prompts
from quickdraft.cli.common import chat_template_of, check_output_dir, draft_for, load_models
from quickdraft.cli.serve import given_serving_arguments
from quickdraft.drafters import DRAFTERS
from quickdraft.errors import ConfigError
from quickdraft.progress import progress_bar, show_postfix


def run_bench_serve(args: argparse.Namespace) -> None:
    out = Path(args.out)
    configs = [ServedConfig.parse(text) for text in args.configs.split(",")]
    if len({config.name for config in configs}) < len(configs):
        raise ConfigError(f"--configs {args.configs} names a configuration twice: give each its own name")
    DRAFTERS.get(args.drafter)  # an unknown name fails here, not in the servers it starts later
    if args.url is None and any(not config.is_peer for config in configs):  # the server it will start: checked now
        from quickdraft.server.setup import ServerOptions

        ServerOptions.from_args(args)
    rates = args.rates.split(",")
    if len({parse_rate(rate) for rate in rates}) < len(rates):  # one load measured twice, as two rows of the report
        raise ConfigError(f"--rates {args.rates} names a rate twice: give each once")
    for flag, count in (("--num-prompts", args.num_prompts), ("--max-tokens", args.max_tokens)):
        if count is not None and count < 1:
            raise ConfigError(f"{flag} must be >= 1, got {count}")
    if not 0 <= args.disconnect_fraction < 1:  # NaN too
        raise ConfigError(f"--disconnect-fraction must be in [0, 1), got {args.disconnect_fraction:g}")
    if args.url is not None and not re.match(r"^https?://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?/?$", args.url):
        raise ConfigError(f"--url must be a loopback address (http://127.0.0.1:PORT), got {args.url!r}")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {args.timeout}")
    chat_template_of(args)  # a file that cannot be read fails before any server starts
    if args.url is not None and (ignored := given_serving_arguments(args)):
        raise ConfigError(
            f"{', '.join(ignored)} set{'s' if len(ignored) == 1 else ''} up the server bench-serve starts, and --url "
            "names one already running: give them to that server's `quickdraft serve`, or leave out --url"
        )
    args.sampling = run_sampling(args.temperature, args.seed)
    if not (args.sampling.is_greedy or args.sampling.is_seeded):
        args.no_reference = True  # unseeded samples have nothing to equal
    if any(config.is_peer for config in configs):  # before references are decoded: a build it cannot do fails now
        check_tool(SERVER_TOOL, "a llama-server configuration")
    prompts = workload_prompts(args.workload, args.questions, args.conversations, args.num_prompts,
                               args.question_seed, args.max_tokens)  # fmt: skip
    if args.num_prompts is not None and len(prompts) < args.num_prompts:
        note = f"--num-prompts {args.num_prompts}: the workload holds {len(prompts)} prompts; each run sends them all"
        print(f"quickdraft: note: {note}", file=sys.stderr)
    if args.max_tokens is None:  # at most: the largest of the requests' own limits
        args.max_tokens = max(prompt.max_tokens or DEFAULT_MAX_TOKENS for prompt in prompts)
    check_output_dir(out)
    if held := [name for name in BENCH_FILES if (out / name).exists()]:  # its results.json would replace bench's
        message = f"--out {out} holds a bench's results ({', '.join(held)})"
        raise ConfigError(f"{message}: give bench-serve another directory")
    if args.url is not None:
        check_reachable(args.url)
    ours = [config for config in configs if not config.is_peer]
    references = None if args.no_reference or not ours else reference_outputs(args, prompts, out / "references.json")
    alone = single_request_runs(args, prompts, ours) if args.single_request and ours else None
    servers: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        urls, described = start_servers(args, configs, len(prompts), out, servers)
        settings = {
            "workload": args.workload, "num_prompts": len(prompts), "max_tokens": args.max_tokens, "rates": rates,
            "seed": args.question_seed, "temperature": args.temperature, "sampling_seed": args.seed,
            "configs": [vars(config) for config in configs], "server": described.pop("quickdraft", "–"),
            "peer_servers": described,
        }  # fmt: skip
        results: dict[str, Any] = {"settings": settings, "runs": []}
        if alone is not None:
            results["single_request"] = alone
        plotted = asyncio.run(drive(args, urls, prompts, configs, rates, references, results, out))
    finally:
        for server, log in servers:
            stop_server(server, log)
    print(f"wrote {out}/results.json, report.md{', latency.png' if plotted else ''}", file=sys.stderr)


def start_servers(
    args: argparse.Namespace, configs: list[ServedConfig], slots: int, out: Path,
    servers: list[tuple[subprocess.Popen[bytes], Path]],
) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """Every server the configurations need, healthy (appended to ``servers`` as they start): each
    configuration's URL, and each server's command line (quickdraft's under "quickdraft")."""
    urls: dict[str, str] = {}
    described: dict[str, str] = {}
    if any(not config.is_peer for config in configs):
        if args.url:
            url = args.url.rstrip("/")
            described["quickdraft"] = url
        else:
            command = quickdraft_command(args, port := free_port())
            url = start_server(command, port, out / "server.log", servers)
            described["quickdraft"] = " ".join(command[3:])
        urls |= {config.name: url for config in configs if not config.is_peer}
    peers = [config for config in configs if config.is_peer]
    if peers:
        import torch

        draft = draft_for(args, ["draft-model"]) if any(c.drafter != "none" for c in peers) else None
        target_gguf, draft_gguf = gguf_files(args.target, draft)
        for config in peers:
            command = server_command(
                config, target_gguf, draft_gguf, slots, torch.get_num_threads(), port := free_port(),
                chat_template=Path(args.chat_template) if args.chat_template else None,
            )  # fmt: skip
            urls[config.name] = start_server(command, port, out / f"{config.name}.log", servers)
            described[config.name] = " ".join([Path(command[0]).name, *command[1:]])
    return urls, described


async def drive(
    args: argparse.Namespace, urls: dict[str, str], prompts: list[Prompt], configs: list[ServedConfig],
    rates: list[str], references: dict[str, list[int]] | None, results: dict[str, Any], out: Path,
) -> bool:  # fmt: skip
    """Every run, with one client per server; results are saved after each. True if the plot was written."""
    import httpx
    import openai

    clients = {
        url: openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=args.timeout)
        for url in set(urls.values())
    }
    ours = [config for config in configs if not config.is_peer]
    results["planned"] = {"runs": len(rates) * len(configs), "disconnects": bool(args.disconnect_fraction > 0 and ours)}
    try:
        models = {config.name: await warm_up(clients[urls[config.name]], config, prompts[0]) for config in configs}
        with progress_bar(total=len(rates) * len(configs), desc="runs", unit="run") as bar:
            for rate in rates:  # configurations take turns at every rate, so drift of the machine hits all alike
                for config in configs:
                    show_postfix(bar, f"{config.name} @ {rate}")
                    records, wall_s = await run_load(
                        clients[urls[config.name]],
                        models[config.name],
                        prompts,
                        config,
                        parse_rate(rate),
                        args.max_tokens,
                        args.question_seed,
                        args.timeout,
                        sampling=args.sampling,
                    )
                    summary = summarize_run(records, wall_s, None if config.is_peer else references)
                    results["runs"].append({"config": config.name, "rate": rate, "summary": summary,
                                            "records": [record_json(record) for record in records]})  # fmt: skip
                    mean_s, lossless = summary["e2e_s"]["mean"] or math.nan, summary.get("lossless", "–")
                    said = f"{config.name} @ {rate}: {summary['throughput_tok_s']:.1f} tok/s, mean e2e {mean_s:.2f} s"
                    bar.write(f"{said}, lossless {lossless}", file=sys.stderr)
                    bar.update(1)
                    save(out, results)
        if results["planned"]["disconnects"]:
            url = urls[ours[0].name]
            results["disconnects"] = await disconnect_run(
                args, clients[url], models[ours[0].name], url, prompts, ours, rates, references
            )
    except (openai.APIError, httpx.HTTPError) as error:  # the warm-up's or /metrics': a run's own are recorded
        raise request_failure(error) from None
    finally:
        for client in clients.values():
            await client.close()
    return save(out, results)


def reference_outputs(args: argparse.Namespace, prompts: list[Prompt], path: Path) -> dict[str, list[int]]:
    """Single-request plain greedy decoding of every prompt (kept in ``path`` for later runs of the same settings)."""
    from quickdraft.api import Pipeline

    key = {"target": args.target, "runtime": args.runtime, "device": args.device, "max_tokens": args.max_tokens}
    key |= {"kv_cache_dtype": args.kv_cache_dtype} if args.kv_cache_dtype else {}
    key |= {"max_context": args.max_context} if args.max_context else {}
    template = chat_template_of(args)
    key |= {"chat_template": hashlib.sha256(template.encode()).hexdigest()} if template is not None else {}
    if args.workload != "spec-bench":  # recorded requests: which ones, with their own limits
        key |= {"workload": args.workload, "requests": requests_digest(prompts)}
    if not args.sampling.is_greedy:
        key |= {"temperature": args.temperature, "seed": args.seed}
    saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if saved.get("key") != key:
        saved = {"key": key, "outputs": {}}
    missing = [prompt for prompt in prompts if prompt.question_id not in saved["outputs"]]
    if missing:
        pipeline = Pipeline.load(
            target=args.target, draft=None, runtime=args.runtime, device=args.device,
            kv_cache_dtype=args.kv_cache_dtype, max_context=args.max_context, chat_template=template,
        )  # fmt: skip
        with progress_bar(missing, desc="references (plain decoding)", unit="prompt") as bar:
            for prompt in bar:
                prompt_ids, config = served_input(pipeline, prompt, args.max_tokens, args.sampling)
                result = pipeline.generate(prompt_ids, config, drafter="none")
                saved["outputs"][prompt.question_id] = result.token_ids
        path.write_text(json.dumps(saved), encoding="utf-8")
    return saved["outputs"]


def single_request_runs(args: argparse.Namespace, prompts: list[Prompt], configs: list[ServedConfig]) -> dict[str, Any]:
    """Every prompt decoded alone (the engine in this process, no server) under each configuration: its latencies."""
    from dataclasses import replace

    from quickdraft.bench.base import GREEDY
    from quickdraft.bench.serve_load import distribution

    draft = draft_for(args, [config.drafter for config in configs])
    pipeline = load_models(args, draft)
    runs = {}
    for config in configs:
        first = served_input(pipeline, replace(prompts[0], max_tokens=8), 8, GREEDY, config.policy)
        pipeline.generate(*first, drafter=config.drafter)  # warm-up
        inputs = [served_input(pipeline, prompt, args.max_tokens, args.sampling, config.policy) for prompt in prompts]
        results = [pipeline.generate(*served, drafter=config.drafter) for served in inputs]
        runs[config.name] = {"e2e_s": distribution([result.stats.wall_time_s for result in results])}
        print(f"single request, {config.name}: mean {runs[config.name]['e2e_s']['mean']:.2f} s", file=sys.stderr)
    return runs


def quickdraft_command(args: argparse.Namespace, port: int) -> list[str]:
    """``quickdraft serve`` on loopback ``port`` with the serving arguments."""
    command = [sys.executable, "-m", "quickdraft", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--target", args.target, "--runtime", args.runtime, "--device", args.device, "--drafter", args.drafter]
    command += ["--max-running", str(args.max_running), "--max-waiting", str(args.max_waiting)]
    command += ["--prefill-tokens-per-step", str(args.prefill_tokens_per_step)]
    command += ["--prefix-cache-mb", str(args.prefix_cache_mb)]
    command += [] if args.kv_cache_mb is None else ["--kv-cache-mb", str(args.kv_cache_mb)]
    command += ["--max-draft-tokens", str(args.max_draft_tokens)] + (["--draft", args.draft] if args.draft else [])
    command += (["--policy", args.policy] if args.policy else []) + (["--recalibrate"] if args.recalibrate else [])
    command += ["--draft-weights", args.draft_weights] if args.draft_weights else []
    command += ["--draft-vocabulary", str(args.draft_vocabulary)] if args.draft_vocabulary is not None else []
    command += ["--draft-head", args.draft_head] if args.draft_head else []
    command += ["--kv-cache-dtype", args.kv_cache_dtype] if args.kv_cache_dtype else []
    command += ["--max-context", str(args.max_context)] if args.max_context else []
    command += ["--chat-template", args.chat_template] if args.chat_template else []
    return command


def start_server(command: list[str], port: int, log: Path, servers: list[tuple[subprocess.Popen[bytes], Path]]) -> str:
    """Start the server ``command`` on ``port``, its output into ``log`` (appended to ``servers`` at once, to be
    stopped whatever happens next); its URL once its ``/health`` answers 200 (both servers answer 503 while
    loading)."""
    import httpx

    with log.open("wb") as log_file:
        server = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    servers.append((server, log))
    print(f"starting a server on port {port} (a first start times its costs: minutes; it logs to {log})",
          file=sys.stderr)  # fmt: skip
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 1200
    while time.monotonic() < deadline:
        if server.poll() is not None:  # said here, so no longer one to stop
            servers.remove((server, log))
            raise ConfigError(f"the server exited with status {server.returncode}{last_error(log)}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise ConfigError(f"the server did not become healthy in 20 minutes; see {log}")


def last_error(log: Path) -> str:
    """``: <its error>``, the last error line a server that stopped wrote to ``log`` (empty if none)."""
    errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("quickdraft: error: ")]
    return f": {errors[-1].removeprefix('quickdraft: error: ')}" if errors else ""


def stop_server(server: subprocess.Popen[bytes], log: Path) -> None:
    """Stop the server as a service manager does, with SIGTERM; say so if it does not exit cleanly."""
    if server.poll() is not None:  # it stopped of itself while the runs went on
        print(f"quickdraft: the server had stopped, status {server.returncode}{last_error(log)}; see {log}",
              file=sys.stderr)  # fmt: skip
        return
    server.terminate()
    try:
        status = server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        print(f"quickdraft: the server did not stop within 30 s of SIGTERM and was killed; see {log}", file=sys.stderr)
        return
    if status not in (0, -signal.SIGTERM, -signal.SIGINT):  # ended by the signal itself: after a Ctrl-C it had too
        print(f"quickdraft: the server exited with status {status} on SIGTERM; see {log}", file=sys.stderr)


async def warm_up(client: Any, config: ServedConfig, prompt: Prompt) -> str:
    """One short untimed request (first calls pay one-off costs); the served model's name."""
    model = (await client.models.list()).data[0].id
    await client.chat.completions.create(
        model=model, **prompt.chat(), max_tokens=8, temperature=0, extra_body=config.extra_body()
    )  # fmt: skip
    return model


def server_state(url: str) -> dict[str, float]:
    """Resident memory (MB) and running/waiting requests from the server's /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    value = {name: float(number) for name, number in re.findall(r"^(\w+) ([0-9.e+-]+)$", text, re.MULTILINE)}
    return {
        "rss_mb": value.get("process_resident_memory_bytes", math.nan) / 2**20,
        "busy": value.get("quickdraft_requests_running", 0) + value.get("quickdraft_requests_waiting", 0),
    }


async def disconnect_run(
    args: argparse.Namespace, client: Any, model: str, url: str, prompts: list[Prompt], configs: list[ServedConfig],
    rates: list[str], references: dict[str, list[int]] | None,
) -> dict[str, Any]:  # fmt: skip
    """At the highest rate, under the first goodput configuration: some clients disconnect mid-stream."""
    config = next((c for c in configs if c.policy == "goodput"), configs[-1])
    rate = max(rates, key=parse_rate)
    before = server_state(url)["rss_mb"]
    records, wall_s = await run_load(client, model, prompts, config, parse_rate(rate), args.max_tokens,
                                     args.question_seed + 7, args.timeout, args.disconnect_fraction,
                                     args.sampling)  # fmt: skip
    deadline = time.monotonic() + 120
    while (state := server_state(url))["busy"] and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)  # the last cancelled requests' caches go at the next step
    state = server_state(url)
    return {
        "config": config.name, "rate": rate, "summary": summarize_run(records, wall_s, references),
        "rss_idle_before_mb": before, "rss_idle_after_mb": state["rss_mb"], "running_after": state["busy"],
        "records": [record_json(record) for record in records],
    }  # fmt: skip


def save(out: Path, results: dict[str, Any]) -> bool:
    (out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return write_report(out, results)
