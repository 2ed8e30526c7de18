"""``quickdraft serve`` and ``bench-serve`` from the command line, on tiny native model directories."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from quickdraft.bench.serve_load import RequestRecord, ServedConfig, arrival_times, parse_rate, summarize_run
from quickdraft.cli import main
from quickdraft.errors import ConfigError


def test_rates_configs_and_arrivals() -> None:
    assert (parse_rate("seq"), parse_rate("inf"), parse_rate("0.5")) == (0.0, math.inf, 0.5)
    for bad in ("0", "-1", "fast"):
        with pytest.raises(ConfigError, match="rate"):
            parse_rate(bad)
    assert ServedConfig.parse("g=draft-model+goodput") == ServedConfig("g", "draft-model", "goodput")
    assert ServedConfig.parse("plain=none").extra_body() == {"drafter": "none", "return_token_ids": True}
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
    args = ["bench-serve", "--questions", str(questions), "--num-prompts", "4", "--max-tokens", "6"]
    args += ["--rates", "seq,inf", "--configs", "plain=none,goodput=draft-model+goodput,fixed=draft-model+fixed:2"]
    args += ["--target", str(native_model_dirs["target"]), "--draft", str(native_model_dirs["draft"])]
    args += ["--out", str(out), "--max-running", "4", "--prefill-tokens-per-step", "16", "--disconnect-fraction", "0.5"]
    args += ["--single-request"]
    assert main(args) == 0, capsys.readouterr().err
    assert "SIGTERM" not in capsys.readouterr().err  # the server it started stopped cleanly when told to
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
