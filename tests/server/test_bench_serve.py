"""``quickdraft serve`` and ``bench-serve`` from the command line, on tiny native model directories."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from quickdraft.bench.serve_load import RequestRecord, ServedConfig, arrival_times, parse_rate, summarize_run
from quickdraft.bench.serve_report import write_report
from quickdraft.cli import main
from quickdraft.errors import ConfigError


def test_rates_configs_and_arrivals() -> None:
    assert (parse_rate("seq"), parse_rate("inf"), parse_rate("0.5")) == (0.0, math.inf, 0.5)
    for bad in ("0", "-1", "fast"):
        with pytest.raises(ConfigError, match="rate"):
            parse_rate(bad)
    assert ServedConfig.parse("g=draft-model+goodput") == ServedConfig("g", "draft-model", "goodput")
    assert ServedConfig.parse("plain=none").extra_body() == {
        "drafter": "none", "return_token_ids": True, "cache_prompt": False
    }  # fmt: skip
    cached = ServedConfig.parse("c=hybrid+fixed:3:cache")
    assert (cached.policy, cached.prompt_cache, cached.extra_body()["cache_prompt"]) == ("fixed:3", True, True)
    with pytest.raises(ConfigError, match="NAME=DRAFTER"):
        ServedConfig.parse("draft-model")
    times = arrival_times(2000, 4.0, seed=1)
    assert times == sorted(times) and times[0] == 0.0 and abs(times[-1] / 1999 - 0.25) < 0.02  # Poisson at 4/s
    assert arrival_times(3, math.inf, seed=1) == [0.0, 0.0, 0.0]


def test_a_run_summary_counts_what_completed_and_what_matched() -> None:
    records = [
        RequestRecord(0, "a", 0.0, ttft_s=0.5, e2e_s=2.5, token_ids=[1, 2, 3], finish_reason="length"),
        RequestRecord(1, "b", 0.1, ttft_s=1.0, e2e_s=2.0, token_ids=[4, 5], finish_reason="stop"),
        RequestRecord(2, "c", 0.2, error="APITimeoutError: timed out"),
        RequestRecord(3, "d", 0.3, ttft_s=0.2, e2e_s=0.4, token_ids=[7], disconnected=True),
    ]
    summary = summarize_run(records, wall_s=5.0, references={"a": [1, 2, 3], "b": [4, 6]})
    assert (summary["completed"], summary["disconnected"], summary["lossless"], summary["compared"]) == (2, 1, 1, 2)
    assert summary["errors"] == ["APITimeoutError: timed out"]
    assert summary["throughput_tok_s"] == 1.0 and summary["e2e_s"]["mean"] == 2.25
    assert summary["tpot_s"]["mean"] == pytest.approx((1.0 + 1.0) / 2)  # (2.5 - 0.5) / 2 and (2.0 - 1.0) / 1


def test_tokens_of_another_server_are_counted_from_its_usage() -> None:
    """A server without quickdraft's token ids (llama-server, vLLM): its usage counts the tokens."""
    records = [
        RequestRecord(0, "a", 0.0, ttft_s=0.5, e2e_s=2.5, completion_tokens=5, finish_reason="length"),
        RequestRecord(1, "b", 0.1, ttft_s=1.0, e2e_s=2.0, token_ids=[4, 5], completion_tokens=2, finish_reason="stop"),
    ]
    summary = summarize_run(records, wall_s=7.0, references=None)
    assert summary["output_tokens"] == 7 and summary["throughput_tok_s"] == 1.0
    assert summary["tpot_s"]["mean"] == pytest.approx((2.0 / 4 + 1.0 / 1) / 2)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["serve", "--port", "0"], "--port"),
        (["serve", "--policy", "fixed:x"], "fixed:K"),
        (["serve", "--max-running", "0"], "max_running"),
        (["bench-serve", "--rates", "seq,fast"], "rate"),
        (["bench-serve", "--configs", "draft-model"], "NAME=DRAFTER"),
        (["bench-serve", "--url", "http://10.0.0.1:8000"], "loopback"),
        (["bench-serve", "--seed", "3"], "give a --temperature"),
    ],
)
def test_bad_arguments_fail_before_any_work(args: list[str], words: str, capsys: pytest.CaptureFixture) -> None:
    assert main(args) == 1
    assert words in capsys.readouterr().err


def write_questions(tmp_path: Path, count: int) -> Path:
    """``count`` one-turn questions whose text repeats itself (copies pay), in Spec-Bench's format."""
    questions = tmp_path / "questions.jsonl"
    rows = [
        {"question_id": i, "category": "qa", "turns": [f"w{i} w{i + 1} w{i} w{i + 1}"]} for i in range(1, count + 1)
    ]
    questions.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    return questions


def test_bench_serve_against_a_server_it_starts(
    native_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_questions(tmp_path, 4)
    out = tmp_path / "out"
    args = ["bench-serve", "--questions", str(questions), "--num-prompts", "5", "--max-tokens", "6"]  # 4 there
    args += ["--rates", "seq,inf", "--configs", "plain=none,goodput=draft-model+goodput,fixed=draft-model+fixed:2"]
    args += ["--target", str(native_model_dirs["target"]), "--draft", str(native_model_dirs["draft"])]
    args += ["--out", str(out), "--max-running", "4", "--prefill-tokens-per-step", "16", "--disconnect-fraction", "0.5"]
    args += ["--single-request"]
    assert main(args) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "SIGTERM" not in err  # the server it started stopped cleanly when told to
    assert "note: --num-prompts 5: the workload holds 4 prompts; each run sends them all" in err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [(run["config"], run["rate"]) for run in results["runs"]] == [
        (config, rate) for rate in ("seq", "inf") for config in ("plain", "goodput", "fixed")
    ]
    for run in results["runs"]:
        summary = run["summary"]
        assert summary["completed"] == summary["compared"] == summary["lossless"] == 4 and not summary["errors"]
    cut = results["disconnects"]["summary"]
    assert cut["disconnected"] > 0 and cut["completed"] + cut["disconnected"] == 4 and not cut["errors"]
    assert cut["lossless"] == cut["completed"] and results["disconnects"]["running_after"] == 0
    assert set(results["single_request"]) == {"plain", "goodput", "fixed"}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "SmartSpec's claims" in report and "Clients disconnecting" in report and "single-request engine" in report
    assert (out / "latency.png").is_file()
    results["disconnects"]["summary"]["disconnected"] = 0  # each client leaves at random: a run may test nothing
    write_report(out, results)
    assert "No client disconnected, so nothing was tested" in (out / "report.md").read_text(encoding="utf-8")
    assert "Incomplete" not in report
    del results["runs"][-1], results["disconnects"]  # as a bench stopped before its last runs saves them
    write_report(out, results)
    assert "**Incomplete:** 2 of the planned runs are missing" in (out / "report.md").read_text(encoding="utf-8")


def test_bench_serve_samples_seeded_requests(
    native_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """At a temperature with a seed, every served response equals seeded single-request plain decoding."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = write_questions(tmp_path, 3)
    out = tmp_path / "out"
    args = ["bench-serve", "--questions", str(questions), "--num-prompts", "3", "--max-tokens", "6"]
    args += ["--rates", "seq,inf", "--configs", "plain=none,fixed=draft-model+fixed:2", "--disconnect-fraction", "0"]
    args += ["--target", str(native_model_dirs["target"]), "--draft", str(native_model_dirs["draft"])]
    args += ["--out", str(out), "--temperature", "0.9", "--seed", "11"]
    assert main(args) == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["settings"]["temperature"] == 0.9 and results["settings"]["sampling_seed"] == 11
    for run in results["runs"]:
        assert run["summary"]["lossless"] == run["summary"]["completed"] == 3
    assert "temperature 0.9, seed 11" in (out / "report.md").read_text(encoding="utf-8")


def test_a_bench_s_results_folder_is_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """bench-serve writes results.json and report.md: into a bench's folder they replaced the bench's own."""
    out = tmp_path / "bench-results"
    out.mkdir()
    (out / "entries.jsonl").write_text("", encoding="utf-8")
    args = ["bench-serve", "--questions", str(write_questions(tmp_path, 2)), "--out", str(out)]
    assert main(args) == 1
    assert "holds a bench's results (entries.jsonl): give bench-serve another directory" in capsys.readouterr().err
    assert sorted(path.name for path in out.iterdir()) == ["entries.jsonl"]


def test_a_llama_server_that_cannot_be_built_fails_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import quickdraft.bench.llama_tools as llama_tools

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))  # no build there
    monkeypatch.setattr(llama_tools, "missing_build_tools", lambda: ["cmake"])
    args = ["bench-serve", "--questions", str(write_questions(tmp_path, 2)), "--configs", "llama=llama-server"]
    assert main([*args, "--out", str(tmp_path / "out")]) == 1
    assert "builds llama.cpp's llama-server once: it needs cmake" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # before any reference was decoded


def test_llama_server_configurations_parse_into_their_own_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    from quickdraft.bench import llama_server

    plain, draft = ServedConfig.parse("l=llama-server"), ServedConfig.parse("ld=llama-server:draft:cache")
    assert (plain.is_peer, plain.drafter, plain.prompt_cache) == (True, "none", False)
    assert (draft.drafter, draft.prompt_cache, draft.policy) == ("draft-model", True, None)
    assert plain.extra_body() == {"cache_prompt": False}  # none of quickdraft's extras go to llama-server
    for bad in ("l=llama-server:fast", "l=llama-server:draft:draft", "l=llama-server:cache:draft"):
        with pytest.raises(ConfigError, match=r"llama-server\[:draft\]\[:cache\]"):
            ServedConfig.parse(bad)
    monkeypatch.setattr(llama_server, "llama_tool", lambda name: Path("/bin") / name)
    command = llama_server.server_command(plain, Path("t.gguf"), None, slots=12, threads=2, port=8123)
    assert command[:3] == ["/bin/llama-server", "-m", "t.gguf"]
    assert command[command.index("--parallel") + 1] == "12" and "--kv-unified" in command
    assert command[command.index("-c") + 1] == str(12 * llama_server.CONTEXT_PER_SLOT)
    assert command[command.index("--cache-ram") + 1] == "0" and "-md" not in command  # cache off: not kept
    assert "--jinja" not in command  # the GGUF's own template, as llama-server reads it by default
    command = llama_server.server_command(draft, Path("t.gguf"), Path("d.gguf"), 1, 2, 8123, Path("chat.jinja"))
    assert command[-3:] == ["--jinja", "--chat-template-file", "chat.jinja"]
    assert command[command.index("-md") + 1] == "d.gguf" and command[command.index("-td") + 1] == "2"
    assert command[command.index("--spec-type") + 1] == "draft-simple" and "--cache-ram" not in command
    with pytest.raises(ConfigError, match="draft model"):
        llama_server.server_command(draft, Path("t.gguf"), None, slots=1, threads=2, port=8123)


def test_bench_serve_starts_a_server_per_peer_and_reports_them_side_by_side(
    native_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """llama-server stands in here as a second quickdraft server (nothing is compiled in tests): it gets its own
    process, slots for every request of a run, no quickdraft extras, no lossless check, and a column beside ours."""
    import sys

    import quickdraft.cli.bench_serve_run as bench_serve

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    started = []

    def stand_in(config, target, draft, slots, threads, port, chat_template=None):
        started.append((config.name, slots, draft, chat_template))
        return [sys.executable, "-m", "quickdraft", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--target", str(native_model_dirs["target"]), "--drafter", "none"]  # fmt: skip

    monkeypatch.setattr(bench_serve, "gguf_files", lambda target, draft: (Path("t.gguf"), draft and Path("d.gguf")))
    monkeypatch.setattr(bench_serve, "server_command", stand_in)
    monkeypatch.setattr(bench_serve, "check_tool", lambda name, user: None)  # nothing is compiled in tests
    out = tmp_path / "out"
    args = ["bench-serve", "--questions", str(write_questions(tmp_path, 3)), "--num-prompts", "3"]
    args += ["--max-tokens", "5", "--rates", "seq,inf", "--disconnect-fraction", "0", "--out", str(out)]
    args += ["--configs", "goodput=hybrid+goodput,llama=llama-server,llama-draft=llama-server:draft"]
    args += ["--target", str(native_model_dirs["target"]), "--draft", str(native_model_dirs["draft"])]
    template = tmp_path / "template.jinja"  # every server and the references read the same one
    template.write_text("{% for m in messages %}w3 {{ m['content'] }} {% endfor %}", encoding="utf-8")
    assert main([*args, "--chat-template", str(template)]) == 0, capsys.readouterr().err
    assert started == [("llama", 3, Path("d.gguf"), template), ("llama-draft", 3, Path("d.gguf"), template)]
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert set(results["settings"]["peer_servers"]) == {"llama", "llama-draft"}
    assert f"--chat-template {template}" in results["settings"]["server"]
    for run in results["runs"]:
        assert run["summary"]["completed"] == 3 and not run["summary"]["errors"]
        assert ("lossless" in run["summary"]) == (run["config"] == "goodput")  # llama.cpp's kernels differ
        assert run["summary"].get("lossless", 3) == 3
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "## quickdraft against llama.cpp's server" in report and "Lower mean latency at every rate:" in report
    assert "| 1 user |" in report and "| all at once |" in report


def test_the_side_by_side_verdict_takes_the_best_peer_at_each_rate() -> None:
    from quickdraft.bench.serve_report import against_peers

    def run(config: str, rate: str, latency: float, throughput: float) -> dict:
        return {"config": config, "rate": rate, "summary": {"e2e_s": {"mean": latency}, "throughput_tok_s": throughput}}

    configs = [ServedConfig.parse(text) for text in ("qd=hybrid+goodput", "a=llama-server", "b=llama-server:draft")]
    results = {
        "settings": {"rates": ["seq", "inf"], "configs": [vars(config) for config in configs]},
        "runs": [run("qd", "seq", 2.0, 30), run("a", "seq", 3.0, 20), run("b", "seq", 2.5, 25),
                 run("qd", "inf", 9.0, 60), run("a", "inf", 8.0, 40), run("b", "inf", 12.0, 30)],
    }  # fmt: skip
    lines = against_peers(results)
    assert lines[0] == "With prompt caches off:"
    assert any(line.startswith("| 1 user | 2.00 s | 2.50 s (`b`) | 0.80 |") for line in lines)
    assert any(
        line.startswith("| all at once | 9.00 s | 8.00 s (`a`) | 1.12 | 60.0 | 40.0 (`a`) | 1.50 |") for line in lines
    )
    assert lines[-1] == "Lower mean latency at every rate: NO; higher throughput at saturation (all at once): yes."


def test_the_smartspec_section_says_what_it_measured_or_why_it_could_not() -> None:
    from quickdraft.bench.serve_report import claims

    def run(config: str, rate: str, latency: float) -> dict:
        return {"config": config, "rate": rate, "summary": {"e2e_s": {"mean": latency}, "throughput_tok_s": 10.0}}

    names = ("plain=none", "fixed=hybrid+fixed:3", "goodput=hybrid+goodput")
    configs = [vars(ServedConfig.parse(text)) for text in names]
    results = {
        "settings": {"rates": ["seq", "1"], "configs": configs},
        "runs": [
            run("plain", "seq", 3.0),
            run("fixed", "seq", 2.0),
            run("goodput", "seq", 2.05),
            run("plain", "1", 4.0),
        ],
    }
    lines = claims(results)
    assert any("1 user: mean latency goodput 2.05 s" in line and "1.02: ≤ 1.05 holds" in line for line in lines)
    assert "- 1 req/s: not measured for all three" in lines
    results["settings"]["configs"] = configs[1:]  # no plain decoding: nothing to compare with
    (line,) = claims(results)
    assert line.startswith("Nothing to check")


def test_a_run_with_failed_requests_is_not_compared() -> None:
    """Means leave failed requests out: a configuration that failed on its slowest requests would look faster."""
    from quickdraft.bench.serve_report import against_peers, claims

    def run(config: str, latency: float, errors: int = 0) -> dict:
        summary = {"e2e_s": {"mean": latency}, "throughput_tok_s": 10.0, "errors": ["timeout"] * errors}
        return {"config": config, "rate": "1", "summary": summary}

    names = ("plain=none", "fixed=hybrid+fixed:3", "goodput=hybrid+goodput", "peer=llama-server")
    configs = [vars(ServedConfig.parse(text)) for text in names]
    results = {
        "settings": {"rates": ["1"], "configs": configs},
        "runs": [run("plain", 3.6), run("fixed", 3.0), run("goodput", 2.4, errors=2), run("peer", 3.0)],
    }
    lines = claims(results)
    assert "- 1 req/s: not comparable, requests failed (plain 0, fixed 0, goodput 2)" in lines
    assert not any("holds" in line or "FAILS" in line for line in lines)
    assert any("not comparable: 2 requests failed" in line for line in against_peers(results))


def test_a_server_that_fails_to_start_is_said_with_its_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Its error line from the log, once, and no 'exited on SIGTERM' about a server that had stopped of itself."""
    from quickdraft.cli.bench_serve_run import start_server, stop_server

    failing = "print('quickdraft: note: loading'); print('quickdraft: error: max_running 0'); raise SystemExit(1)"
    servers: list = []
    with pytest.raises(ConfigError, match=r"exited with status 1: max_running 0; see .*server.log"):
        start_server([sys.executable, "-c", failing], 1, tmp_path / "server.log", servers)
    assert servers == []  # said once: not stopped again
    with (tmp_path / "late.log").open("wb") as log:
        late = "print('quickdraft: error: lost'); raise SystemExit(3)"
        stopped = subprocess.Popen([sys.executable, "-c", late], stdout=log, stderr=subprocess.STDOUT)
    stopped.wait()
    stop_server(stopped, tmp_path / "late.log")
    assert "the server had stopped, status 3: lost; see" in capsys.readouterr().err
