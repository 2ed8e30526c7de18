"""The CLI contract: JSON output, streaming, and one clear error line for each bad input."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from quickdraft.api import Pipeline
from quickdraft.cli import COMMANDS, build_parser, main
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def model_args(tiny_model_dirs: dict[str, Path]) -> list[str]:
    return ["--target", str(tiny_model_dirs["target"]), "--draft", str(tiny_model_dirs["draft"])]


def test_generate_json(model_args: list[str], tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    status, out, _ = run(["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "6", "--json"], capsys)
    assert status == 0
    result = json.loads(out)
    assert set(result) == {
        "text",
        "token_ids",
        "finish_reason",
        "stop_reason",
        "stats",
        "logprobs",
        "drafter",
        "policy",
        "calibration",
        "target",
        "draft",
        "pairing",
        "runtime",
        "device",
    }
    assert len(result["token_ids"]) == result["stats"]["new_tokens"] == 6
    assert (result["drafter"], result["policy"]) == ("hybrid-suffix", "goodput")  # as the text output's header says
    assert result["logprobs"] is None  # not asked for
    status, out, _ = run(
        ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "6", "--json", "--logprobs", "2"], capsys
    )
    scored = json.loads(out)
    assert status == 0 and scored["token_ids"] == result["token_ids"]  # the same answer, with its log-probabilities
    assert [entry["token_id"] for entry in scored["logprobs"]] == result["token_ids"]
    assert "".join(entry["text"] for entry in scored["logprobs"]) == scored["text"]  # a word keeps its space
    for entry in scored["logprobs"]:
        assert entry["logprob"] <= 0 and len(entry["top"]) == 2 and entry["top"][0]["logprob"] >= entry["logprob"]
        assert entry["text"] and set(entry["top"][0]) == {"token_id", "text", "logprob"}
    status, _, err = run(["generate", "w1", *model_args, "--max-new-tokens", "2", "--logprobs", "21"], capsys)
    assert status == 1 and err.rstrip().endswith("got 21 (--logprobs)"), err
    status, _, err = run(["generate", "w1", *model_args, "--max-new-tokens", "2", "--logprobs", "1"], capsys)
    assert status == 0 and "note: --logprobs is shown in --json's output only: ignored" in err
    assert "target" in result["calibration"] and "ms per drafted token" in result["calibration"]
    assert result["target"] == str(tiny_model_dirs["target"].resolve())
    assert result["draft"] == str(tiny_model_dirs["draft"].resolve())
    assert set(result["stats"]) == {
        "new_tokens",
        "target_forwards",
        "draft_tokens_proposed",
        "draft_tokens_accepted",
        "predicted_tokens_accepted",
        "cached_prompt_tokens",
        "acceptance_rate",
        "mean_accepted_tokens",
        "wall_time_s",
        "tokens_per_s",
        "prefill_s",
        "draft_s",
        "verify_s",
        "other_s",
    }


def test_generate_with_a_predicted_output(model_args: list[str], tmp_path: Path, capsys) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "6", "--json"]
    status, out, _ = run(args, capsys)
    plain = json.loads(out)
    (tmp_path / "expected.txt").write_text(plain["text"], encoding="utf-8")
    predicted = [*args, "--prediction", str(tmp_path / "expected.txt"), "--policy", "fixed:4"]  # goodput may decline
    status, out, _ = run(predicted, capsys)  # copies on a busy machine
    assert status == 0 and json.loads(out)["token_ids"] == plain["token_ids"]
    assert json.loads(out)["stats"]["predicted_tokens_accepted"] > 0
    status, _, err = run([*args, "--prediction", str(tmp_path / "missing.txt")], capsys)
    assert status == 1 and "--prediction" in err and "cannot read it" in err
    (tmp_path / "blank.txt").write_text(" \n", encoding="utf-8")
    status, _, err = run([*args, "--prediction", str(tmp_path / "blank.txt")], capsys)
    assert status == 1 and "--prediction" in err and "holds no text" in err  # not "the prompt is empty"
    status, _, err = run([*args, "--prediction", str(tmp_path / "expected.txt"), "--drafter", "none"], capsys)
    assert status == 1 and "drafter that copies" in err


def test_generate_with_structured_output(model_args: list[str], tmp_path: Path, capsys) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "6", "--json"]
    status, out, _ = run([*args, "--regex", "(w4|w5)+"], capsys)
    text = json.loads(out)["text"]
    assert status == 0 and set(text.split()) <= {"w4", "w5"}  # the tiny tokenizer decodes with spaces between
    (tmp_path / "grammar.ebnf").write_text('root ::= "w7" "w8"', encoding="utf-8")
    status, out, _ = run([*args, "--grammar", str(tmp_path / "grammar.ebnf")], capsys)
    assert status == 0 and json.loads(out)["text"].split()[:2] == ["w7", "w8"]
    status, _, err = run([*args, "--regex", "(w4"], capsys)
    assert status == 1 and "does not compile" in err
    status, _, err = run([*args, "--json-schema", str(tmp_path / "missing.json")], capsys)
    assert status == 1 and "--json-schema" in err and "cannot read it" in err


def test_generate_with_a_logit_bias_and_penalties(model_args: list[str], capsys: pytest.CaptureFixture) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "5", "--json"]
    status, out, _ = run([*args, "--logit-bias", "6=100", "--logit-bias", "7=-100"], capsys)
    assert status == 0 and json.loads(out)["token_ids"] == [6] * 5
    status, out, _ = run([*args, "--logit-bias", "6=100", "--stop-token-id", "6", "--min-tokens", "2"], capsys)
    answer = json.loads(out)
    assert status == 0 and answer["token_ids"][2] == 6 and len(answer["token_ids"]) == 3  # the third may end it
    assert answer["stop_reason"] == 6  # the stop token that ended it
    penalized = [*args, "--presence-penalty", "2", "--frequency-penalty", "2", "--repetition-penalty", "3"]
    status, out, _ = run([*penalized, "--temperature", "0.7", "--seed", "1", "--min-p", "0.05"], capsys)
    assert status == 0 and len(json.loads(out)["token_ids"]) == 5


def test_generate_with_a_chat_template_of_ones_own(model_args: list[str], tmp_path: Path, capsys) -> None:
    (tmp_path / "template.jinja").write_text("{% for m in messages %}w9 {{ m.content }} w8 {% endfor %}w7")
    args = ["generate", "w1 w2", *model_args, "--max-new-tokens", "4", "--json", "--chat"]
    status, out, _ = run([*args, "--chat-template", str(tmp_path / "template.jinja")], capsys)
    pipeline = Pipeline.load(model_args[1], model_args[3], chat_template=(tmp_path / "template.jinja").read_text())
    assert pipeline.encode("w1 w2", chat=True) == [9, 1, 2, 8, 7]
    expected = pipeline.generate([9, 1, 2, 8, 7], GenerationConfig(max_new_tokens=4)).token_ids
    assert status == 0 and json.loads(out)["token_ids"] == expected
    (tmp_path / "broken.jinja").write_text("{% for m in messages %")
    status, _, err = run([*args, "--chat-template", str(tmp_path / "broken.jinja")], capsys)
    assert status == 1 and "the chat template cannot be read" in err and "(--chat-template)" in err
    status, _, err = run([*args[:-1], "--chat-template", str(tmp_path / "template.jinja")], capsys)
    assert status == 0 and "--chat-template is not used without --chat" in err
    status, _, err = run([*args[:-1], "--chat-template", str(tmp_path / "broken.jinja")], capsys)
    assert status == 0 and "--chat-template is not used without --chat" in err  # unused, so not read either
    (tmp_path / "thinking.jinja").write_text("{% for m in messages %}w9 {{ m.content }} w8 {% endfor %}"
                                             "{% if enable_thinking is false %}w6 {% endif %}w7")  # fmt: skip
    thinking = [*args, "--chat-template", str(tmp_path / "thinking.jinja")]
    status, out, _ = run([*thinking, "--chat-template-kwargs", '{"enable_thinking": false}'], capsys)
    quiet = pipeline.generate([9, 1, 2, 8, 6, 7], GenerationConfig(max_new_tokens=4)).token_ids
    assert status == 0 and json.loads(out)["token_ids"] == quiet
    status, _, err = run([*thinking, "--chat-template-kwargs", '{"tokenize": true}'], capsys)
    assert status == 1 and "chat_template_kwargs cannot set tokenize" in err


def test_generate_streams_text_then_statistics(
    model_args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("w4 w5 w6"))
    status, out, err = run(
        ["generate", "-", *model_args, "--drafter", "prompt-lookup", "--max-new-tokens", "5"], capsys
    )
    assert status == 0 and out.strip().startswith("w")
    assert "tokens in" in err and "τ" in err and "note: --draft is not used" in err


@pytest.mark.usefixtures("steady_timings")
def test_goodput_reports_its_calibration(model_args: list[str], capsys: pytest.CaptureFixture) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "5"]  # goodput is the default policy
    status, out, err = run(args, capsys)
    assert status == 0 and out.strip()
    assert re.search(r"\[goodput\] calibrated in [0-9.]+ s, saved to", err) and "prompt tokens costs the draft" in err
    assert "learned from 0 earlier answers" in err
    timing = "[goodput] timing this machine's costs, once for these models ..."  # said before the wait, not after
    assert err.index(timing) < err.index("[goodput] calibrated in")
    status, _, err = run(args, capsys)  # the next run loads what the first one measured and learned
    assert status == 0 and "[goodput] loaded from" in err and "learned from 1 earlier answer" in err
    assert timing not in err
    status, _, err = run([*args, "--recalibrate"], capsys)
    assert (
        status == 0 and "[goodput] calibrated in" in err and "learned from 0 earlier answers" in err and timing in err
    )
    status, _, err = run(args, capsys)  # --recalibrate started the record afresh: its run is the one answer
    assert "learned from 1 earlier answer" in err


@pytest.mark.usefixtures("steady_timings")
def test_a_corrupt_calibration_is_reported_and_measured_anew(
    model_args: list[str], calibrations_in_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "5"]  # goodput, the default, calibrates
    assert run(args, capsys)[0] == 0
    (calibration,) = [path for path in calibrations_in_tmp.glob("*.json") if not path.name.endswith(".learned.json")]
    calibration.write_text("{not json")
    status, _, err = run(args, capsys)
    assert status == 0 and f"[goodput] {calibration} is not a usable calibration" in err
    assert re.search(r"re-calibrated in [0-9.]+ s, saved to", err) and "loaded from" not in err
    status, _, err = run(args, capsys)  # the measurement that replaced it is used
    assert status == 0 and f"[goodput] loaded from {calibration}" in err


def test_a_corrupt_learned_file_is_ignored_and_replaced(
    model_args: list[str], calibrations_in_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "5"]
    assert run(args, capsys)[0] == 0
    (learned,) = calibrations_in_tmp.glob("*.learned.json")
    saved = json.loads(learned.read_text())
    assert saved["answers"] == [[5, True]] and set(saved["acceptance"]) == {"first", "later"}  # cut at 5
    corrupt_files = [
        "{not json",
        json.dumps({"acceptance": {"first": [-1, 0], "later": [0, 0]}, "answers": []}),
        '{"acceptance": {"first": [Infinity, 0], "later": [0, 0]}, "answers": []}',
        '{"acceptance": {"first": [1, 0], "later": [NaN, 0]}, "answers": []}',
        json.dumps({"acceptance": {"first": [1, 0, 2], "later": [0]}, "answers": []}),
        json.dumps({"acceptance": {"first": [1, 0], "later": [0, 0]}, "answers": [[3, "no"]]}),
        json.dumps({"acceptance": {"accepted": 1, "rejected": 0}, "answers": []}),  # an older format
        json.dumps({"acceptance": {"accepted": 1, "rejected": 0}, "answer_lengths": [3]}),  # an even older one
    ]
    for corrupt in corrupt_files:
        learned.write_text(corrupt)
        status, _, err = run(args, capsys)
        assert status == 0 and "learned from 0 earlier answers" in err
        assert json.loads(learned.read_text())["answers"] == [[5, True]]
    assert [path.name for path in learned.parent.iterdir() if path.suffix == ".tmp"] == []  # no temporary files left


def test_prompt_lookup_needs_no_draft(tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    args = ["generate", "w1 w2 w1 w2", "--target", str(tiny_model_dirs["target"]), "--drafter", "prompt-lookup"]
    status, out, _ = run([*args, "--max-new-tokens", "4", "--json"], capsys)
    assert status == 0 and json.loads(out)["draft"] is None


BAD_INPUTS = {
    "empty prompt": (["generate", "  "], "prompt is empty"),
    "no prompt": (["generate"], "no prompt given"),
    "max_new_tokens 0": (["generate", "w1", "--max-new-tokens", "0"], "a positive integer, got 0 (--max-new-tokens)"),
    "no running slot": (["serve", "--max-running", "0"], "max_running must be an integer >= 1, got 0 (--max-running)"),
    "negative temperature": (["generate", "w1", "--temperature", "-0.1"], "temperature must be"),
    "negative top_p": (["generate", "w1", "--top-p", "-0.1"], "top_p must be in"),
    "top_p above 1": (["generate", "w1", "--top-p", "1.5"], "top_p must be in"),
    "negative top_k": (["generate", "w1", "--top-k", "-2"], "top_k must be"),
    "seed beyond 64 bits": (["generate", "w1", "--seed", str(2**64)], "seed must be an integer in [0, 2**64 - 1]"),
    "negative seed": (["generate", "w1", "--seed", "-1"], "seed must be an integer in [0, 2**64 - 1]"),
    "unknown drafter": (["generate", "w1", "--drafter", "magic"], "unknown drafter 'magic'"),
    "serve's unknown drafter": (["serve", "--drafter", "magic"], "unknown drafter 'magic'"),  # 1, as generate's
    "bench-serve's unknown drafter": (["bench-serve", "--drafter", "magic"], "unknown drafter 'magic'"),
    "chat without a template": (
        ["generate", "w1", "--chat"],
        "this model has no chat template: give it one (--chat-template FILE), or send the prompt as text",
    ),
    "unknown runtime": (
        ["generate", "w1", "--runtime", "magic"],
        "unknown runtime 'magic'; choose one of: auto, native, transformers",
    ),
    "bad n-gram sizes": (["generate", "w1", "--prompt-lookup-min-ngram", "4"], "n-gram sizes"),
    "prompt too long": (
        ["generate", " ".join(["w1"] * 600)],
        "context holds 512; shorten the prompt or lower max_new_tokens (--max-new-tokens)",
    ),
    "prompt not UTF-8": (["generate", "w1 \udcff"], "the prompt is not UTF-8 text: character 3"),  # argv's byte 0xff
    "prompt with a lone surrogate": (["generate", "w1 \ud800"], "character 3 is a lone surrogate (U+D800)"),
    "bench without a run": (["bench", "--runs", "0"], "--runs must be >= 1, got 0"),
    "bench with a negative warm-up": (["bench", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    "bench-serve disconnecting all": (["bench-serve", "--disconnect-fraction", "1"], "--disconnect-fraction must be"),
    "train without a held-out share": (
        ["train-acceptance-head", "--holdout", "0"],
        "--holdout must be in (0, 1), got 0",
    ),
    "train with an empty block": (["train-acceptance-head", "--block", "0"], "--block must be >= 1, got 0"),
    "train --out unwritable": (["train-acceptance-head", "--out", "/proc/head.safetensors"], "cannot be written"),
    "bench --out a file": (["bench", "--out", __file__], "is a file; give a directory"),
    "negative draft vocabulary": (["generate", "w1", "--draft-vocabulary", "-1"], "got -1 (--draft-vocabulary)"),
    "draft format off native": (
        ["generate", "w1", "--draft-weights", "q4"],
        "draft_weights 'q4' needs the native runtime: the transformers runtime runs the draft model's own weights over "
        "its whole vocabulary (--draft-weights)",
    ),
    "unknown device": (["generate", "w1", "--device", "tpu"], "unknown device 'tpu': give auto, cpu, cuda or cuda:N"),
    "serve without a body limit": (["serve", "--max-body-mb", "0"], "--max-body-mb must be a number of megabytes > 0"),
    "serve with a negative timeout": (["serve", "--request-timeout", "-5"], "must be a number of seconds >= 0"),
    "an API key with replicas": (["serve", "--replicas", "2", "--api-key", "k3y"], "not supported with --replicas"),
    "serve under no name": (["serve", "--served-model-name", " "], "--served-model-name must not be empty"),
    "train-acceptance-head without tokens": (
        ["train-acceptance-head", "--max-new-tokens", "-5"],
        "max_new_tokens must be >= 1, got -5 (--max-new-tokens)",
    ),
    "train-acceptance-head's missing template": (
        ["train-acceptance-head", "--chat-template", "/nope.jinja"],
        "--chat-template /nope.jinja: cannot read it as text",
    ),
    "train-draft past the seeds": (["train-draft", "--seed", str(2**64)], "seed must be an integer in [0, 2**64 - 1]"),
    "serve with a missing draft head": (["serve", "--draft-head", "/nope.st"], "--draft-head /nope.st: no such file"),
    "bench-serve with a name twice": (["bench-serve", "--configs", "x=none,x=none"], "names a configuration twice"),
    "bench-serve with a rate twice": (["bench-serve", "--rates", "seq,1,1.0"], "names a rate twice"),
    "γ given twice": (["generate", "w1", "--policy", "fixed:3", "--num-draft-tokens", "5"], "give the number once"),
    "missing acceptance head": (["generate", "w1", "--acceptance-head", "/nope.st"], "/nope.st: no such file"),
    "missing draft head": (["generate", "w1", "--draft-head", "/nope.st"], "--draft-head /nope.st: no such file"),
    "seed when greedy": (["generate", "w1", "--seed", "3"], "--seed only applies to sampling: give a --temperature"),
    "top-k when greedy": (
        ["generate", "w1", "--top-k", "5", "--top-p", "0.9"],
        "--top-p, --top-k only apply to sampling",
    ),
    "min-p when greedy": (["generate", "w1", "--min-p", "0.1"], "--min-p only applies to sampling"),
    "logit bias not ID=BIAS": (["generate", "w1", "--logit-bias", "w5=3"], "--logit-bias takes ID=BIAS"),
    "min tokens above the budget": (["generate", "w1", "--min-tokens", "999"], "min_tokens must be an integer in"),
    "logit bias twice": (["generate", "w1", "--logit-bias", "5=3", "--logit-bias", "5=-3"], "gives token 5 twice"),
    "logit bias past the vocabulary": (["generate", "w1", "--logit-bias", "999=3"], "below the vocabulary's size"),
    "presence penalty too large": (["generate", "w1", "--presence-penalty", "3"], "(--presence-penalty)"),
    "negative stop token": (["generate", "w1", "--stop-token-id", "-1"], "got (-1,) (--stop-token-id)"),
    "no n-gram to copy": (["generate", "w1", "--prompt-lookup-max-ngram", "0"], "(--prompt-lookup-max-ngram)"),
    "hybrid n-gram 0": (["generate", "w1", "--hybrid-min-ngram", "0"], "got 0 (--hybrid-min-ngram)"),
    "draft vocabulary beyond the draft's": (
        ["generate", "w1", "--draft-vocabulary", "99999999"],
        "draft_vocabulary 99999999 is larger than the draft model's vocabulary of",
    ),
    "bench-serve's server policy": (["bench-serve", "--policy", "bogus"], "unknown speculation policy 'bogus'"),
    "bench-serve's server batch": (["bench-serve", "--max-running", "0"], "max_running must be an integer >= 1"),
    "bench-serve without a timeout": (["bench-serve", "--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
    "bench-serve with a negative timeout": (["bench-serve", "--timeout", "-5"], "--timeout must be > 0 seconds"),
    "bench-serve --url with a server flag": (
        ["bench-serve", "--url", "http://127.0.0.1:1", "--max-running", "4", "--recalibrate"],
        "--max-running, --recalibrate set up the server bench-serve starts, and --url names one already running",
    ),
    "bench-serve unknown drafter": (["bench-serve", "--configs", "x=nodrafter"], "unknown drafter 'nodrafter'"),
    "bench-serve unknown policy": (["bench-serve", "--configs", "x=none+foo"], "unknown speculation policy 'foo'"),
    "a context cap past the target's": (
        ["generate", "w1", "--max-context", "100000"],
        "max_context 100000 is more than the target's context of 512 positions: give at most that (--max-context)",
    ),
    "kv cache dtype on transformers": (
        ["generate", "w1", "--runtime", "transformers", "--kv-cache-dtype", "float16"],
        "a KV cache of float16 needs the native runtime: the transformers runtime runs a model's own weights, here in "
        "float32, and its cache holds that dtype (--kv-cache-dtype)",
    ),
} | (
    {}
    if torch.cuda.is_available()
    else {
        "generate on a missing GPU": (
            ["generate", "w1", "--device", "cuda"],
            "on a machine with an NVIDIA GPU (--device)",
        ),
        "serve on a missing GPU": (["serve", "--device", "cuda:1"], "sees no CUDA GPU"),
        "bench on a missing GPU": (["bench", "--device", "cuda", "--out", "/tmp/qd-no-gpu-bench"], "sees no CUDA GPU"),
    }
)


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gives_one_clear_line(case: str, model_args: list[str], capsys: pytest.CaptureFixture) -> None:
    args, message = BAD_INPUTS[case]
    status, out, err = run([*args, *model_args], capsys)
    assert status == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("quickdraft: error:") and message in err
    assert "Traceback" not in err


def test_an_empty_model_name_is_refused(capsys: pytest.CaptureFixture) -> None:
    status, _, err = run(["generate", "w1", "--target", ""], capsys)
    assert status == 1 and err == "quickdraft: error: a model is a packaged name or a path, got an empty one\n"


def test_draft_options_without_a_draft_model(tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    """A drafter without a draft model: generate notes the draft options it does not use, serve refuses them."""
    target = ["--target", str(tiny_model_dirs["target"]), "--drafter", "prompt-lookup", "--draft-weights", "q4"]
    status, _, err = run(["generate", "w1 w2", *target, "--max-new-tokens", "2"], capsys)
    assert status == 0 and "note: --draft-weights is not used by the prompt-lookup drafter" in err
    status, _, err = run(["serve", *target], capsys)
    assert status == 1 and "and the prompt-lookup drafter loads none: drop them, or name one with --draft" in err
    with pytest.raises(ConfigError, match="draft=None loads none"):
        Pipeline.load(tiny_model_dirs["target"], None, draft_vocabulary=1024, progress=False)


def test_a_prompt_on_stdin_that_is_not_utf8_is_refused(
    model_args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"w1 w2 \xff w3"))
    monkeypatch.setattr("sys.stdin", stdin)
    status, out, err = run(["generate", "-", *model_args, "--drafter", "none"], capsys)
    assert status == 1 and out == "" and "Traceback" not in err
    assert err.startswith("quickdraft: error: standard input is not UTF-8 text: byte 0xff at offset 6")


def test_output_paths_are_checked_before_any_measuring(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def no_measuring(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured although the result could not be saved")

    monkeypatch.setattr("quickdraft.costs.calibration.measure_cost_curve", no_measuring)
    for out, message in (("/proc/profile.json", "cannot be written"), ("/", "is a directory")):
        status, _, err = run(["profile", "--model", str(tiny_model_dirs["target"]), "--out", out], capsys)
        assert status == 1 and message in err and "Traceback" not in err
    for flag, value, message in (("--repeats", "0", "must be >= 1, got 0"), ("--warmup", "-1", "must be >= 0, got -1")):
        status, _, err = run(["profile", "--model", str(tiny_model_dirs["target"]), flag, value], capsys)
        assert status == 1 and err == f"quickdraft: error: {flag} {message}\n"


def test_the_cache_flags_reach_every_command_that_loads_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """--max-context and --kv-cache-dtype are handed to the loading of every command that takes them (None where
    not given); a context that is no number of positions is a usage error naming the flag, before anything loads."""

    class Loaded(Exception):
        pass

    asked: list[tuple[object, object]] = []

    def stop_at_loading(*args: object, **kwargs: object) -> None:
        asked.append((kwargs.get("max_context"), kwargs.get("kv_cache_dtype")))
        raise Loaded

    monkeypatch.setattr(Pipeline, "load", stop_at_loading)
    commands = (["generate", "w1"], ["serve"], ["train-acceptance-head", "--out", str(tmp_path / "head.safetensors")],
                ["bench", "--out", str(tmp_path / "bench")], ["train-draft", "--collect-only"])  # fmt: skip
    for command in commands:
        for extra, expected in (
            ([], (None, None)),
            (["--max-context", "64", "--kv-cache-dtype", "float32"], (64, "float32")),
        ):
            with pytest.raises(Loaded):
                main([*command, *extra])
            assert asked.pop() == expected, command
    for value, words in (("0", "a number of positions >= 1, got 0"), ("many", "a number of positions, got 'many'")):
        with pytest.raises(SystemExit):
            main(["generate", "w1", "--max-context", value])
        assert f"argument --max-context: {words}" in capsys.readouterr().err


def test_an_interactive_conversation_answers_each_turn_after_those_before(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``generate -i``: each line of standard input a user turn, answered as plain decoding answers the conversation
    so far (the earlier turns read from the prefix cache); blank lines ask nothing, /reset starts anew, /exit ends,
    /help lists the commands and an unknown one is never sent, and a turn that is not text or that the context cannot
    hold is refused and left out."""
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}w9 {{ m['content'] }} w8 {% endfor %}w7")
    target, draft = str(tiny_model_dirs["target"]), str(tiny_model_dirs["draft"])
    args = ["generate", "-i", "w1 w2", "--target", target, "--draft", draft, "--chat-template", str(template)]
    args += ["--drafter", "draft-model", "--policy", "fixed:3", "--max-new-tokens", "6"]
    turns = "w4 \udcff\nw4 w5\n\n/help\n/reste\n/reset\nw6\n/exit\nw7\n"  # a byte not UTF-8, a typo
    monkeypatch.setattr("sys.stdin", io.StringIO(turns))
    status, out, err = run(args, capsys)
    assert status == 0 and "a new conversation" in err and err.count("[draft-model, finish:") == 3
    assert "/reset starts a new conversation, /exit" in err and "unknown command /reste, not sent" in err
    assert "is not UTF-8 text" in err and "(this turn is left out)" in err
    plain = Pipeline.load(target, None, progress=False, chat_template=template.read_text())
    config, expected, messages = GenerationConfig(max_new_tokens=6), [], []
    for turn in ("w1 w2", "w4 w5", None, "w6"):
        if turn is None:
            messages = []
            continue
        messages.append({"role": "user", "content": turn})
        answer = plain.generate(plain.encode_chat(messages), config, drafter="none").text
        messages.append({"role": "assistant", "content": answer})
        expected.append(answer)
    assert out.split("\n")[:-1] == expected
    monkeypatch.setattr("sys.stdin", io.StringIO("w3\n"))
    status, out, err = run([*args[:-1], "510"], capsys)  # no turn fits the tiny model's 512 positions with 510 more
    assert status == 0 and out == "" and err.count("/reset starts a new conversation") == 2
    for extra in (["--compare"], ["--json"], ["--suffix", str(template)]):
        status, _, err = run([*args, *extra], capsys)
        assert (
            status == 1
            and f"--interactive reads its turns from standard input and streams their answers: {extra[0]}" in err
        )


def test_a_system_message_opens_the_chat_and_every_conversation(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``--system TEXT`` is the system message before the user's turn (it implies --chat), and with -i it opens the
    conversation again after /reset; an empty one, or one with --suffix, is refused."""
    template = tmp_path / "chat.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}w3 {% else %}w9 {% endif %}{{ m['content'] }} w8 "
        "{% endfor %}w7"
    )
    target = str(tiny_model_dirs["target"])
    args = ["generate", "--target", target, "--chat-template", str(template), "--drafter", "none"]
    args += ["--max-new-tokens", "6", "--system", "w5 w6"]
    plain = Pipeline.load(target, None, progress=False, chat_template=template.read_text())
    config, system = GenerationConfig(max_new_tokens=6), {"role": "system", "content": "w5 w6"}

    def answer(*turns: str) -> str:
        roles = ["user", "assistant"] * len(turns)
        messages = [system, *({"role": role, "content": turn} for role, turn in zip(roles, turns, strict=False))]
        return plain.generate(plain.encode_chat(messages), config, drafter="none").text

    status, out, _ = run([*args, "w1 w2", "--json"], capsys)
    assert status == 0 and json.loads(out)["text"] == answer("w1 w2")
    monkeypatch.setattr("sys.stdin", io.StringIO("w4\n/reset\nw4\n"))
    status, out, _ = run([*args, "-i", "w1 w2"], capsys)
    first = answer("w1 w2")
    assert status == 0 and out.split("\n")[:-1] == [first, answer("w1 w2", first, "w4"), answer("w4")]
    refused = ((["--system", " "], "--system is empty"), (["--suffix", str(template)], "--system for a chat"))
    for extra, words in refused:
        status, _, err = run([*args, "w1", *extra], capsys)
        assert status == 1 and words in err


def test_a_turn_of_several_lines_opens_and_closes_with_three_quotes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate -i``'s turns: a line each, or the lines from one opening with three double quotes to one closing
    with them (one line may do both), the input's end closing an open block."""
    from quickdraft.cli.conversation import turns

    lines = ["a", '"""', "x = 1", "", "y = 2", '"""', '  """one"""', '"""first', 'last"""', "b", '"""open', "never"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert list(turns("p")) == ["p", "a", "x = 1\n\ny = 2", "one", "first\nlast", "b", "open\nnever"]
    asked, typing = [], iter(["a", '"""x', 'y"""'])

    def typed(prompt: str) -> str:  # on a terminal, input() reads the lines: editing and history
        asked.append(prompt)
        line = next(typing, None)
        if line is None:
            raise EOFError
        return line

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", typed)
    assert list(turns(None)) == ["a", "x\ny"] and asked == [">>> ", ">>> ", "... ", ">>> "]


def test_a_conversation_reads_bytes_that_are_not_utf8_and_keeps_what_it_learned_when_interrupted(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``generate -i`` on standard input decoded strictly (a locale's default): a turn that is not UTF-8 is refused
    alone, the turns around it answered. Ctrl-C at the prompt ends the program and still saves what the policy
    learned, as /exit does. A model with no chat template has no conversation: one error, before any turn."""
    target, draft = str(tiny_model_dirs["target"]), str(tiny_model_dirs["draft"])
    args = ["generate", "-i", "--target", target, "--draft", draft, "--max-new-tokens", "4", "--policy", "fixed:2"]
    monkeypatch.setattr("sys.stdin", io.StringIO("w1\n"))
    status, _, err = run(args, capsys)  # no template, no conversation: said once, before any turn
    assert status == 1 and err.count("this model has no chat template") == 1
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}w9 {{ m['content'] }} w8 {% endfor %}w7")
    args += ["--chat-template", str(template)]
    saved = []
    monkeypatch.setattr(Pipeline, "save_learned", lambda self, *given: saved.append(given))
    strict = io.TextIOWrapper(io.BytesIO(b"w1 w2\nw3 \xff\nw4\n"), encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdin", strict)
    status, _, err = run(args, capsys)
    assert status == 0 and err.count("finish:") == 2 and "is not UTF-8 text" in err and len(saved) == 1

    class Interrupted(io.StringIO):
        def readline(self, *_: Any) -> str:
            raise KeyboardInterrupt

    monkeypatch.setattr("sys.stdin", Interrupted())
    status, _, err = run(args, capsys)
    assert status == 130 and "quickdraft: interrupted" in err and len(saved) == 2


class Interrupting:
    """Standard output that sends this process Ctrl-C (SIGINT) ``times`` times as the first text is written."""

    def __init__(self, out: Any, times: int) -> None:
        self.out, self.times = out, times

    def write(self, text: str) -> int:
        if text.strip():
            while self.times:
                self.times -= 1
                signal.raise_signal(signal.SIGINT)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def test_ctrl_c_stops_an_interactive_answer_and_the_conversation_goes_on(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``generate -i``: Ctrl-C while an answer streams stops it after the text shown (its request cancelled), which
    stays as the assistant's turn: the next turn is answered as plain decoding answers that conversation. A second
    Ctrl-C in the same answer ends the program."""
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}w9 {{ m['content'] }} w8 {% endfor %}w7")
    target, draft = str(tiny_model_dirs["target"]), str(tiny_model_dirs["draft"])
    args = ["generate", "-i", "w1 w2", "--target", target, "--draft", draft, "--chat-template", str(template)]
    args += ["--drafter", "draft-model", "--policy", "fixed:3", "--max-new-tokens", "12"]
    monkeypatch.setattr("sys.stdin", io.StringIO("w4 w5\n"))
    monkeypatch.setattr("sys.stdout", Interrupting(sys.stdout, 1))
    status, out, err = run(args, capsys)
    assert status == 0 and err.count("interrupted: the text shown stays") == 1 and err.count("finish:") == 1
    shown, second = out.split("\n")[:2]
    plain = Pipeline.load(target, None, progress=False, chat_template=template.read_text())
    config = GenerationConfig(max_new_tokens=12)
    messages = [{"role": "user", "content": "w1 w2"}]
    whole = plain.generate(plain.encode_chat(messages), config, drafter="none").text
    assert shown and whole.startswith(shown) and shown != whole
    messages += [{"role": "assistant", "content": shown}, {"role": "user", "content": "w4 w5"}]
    assert second == plain.generate(plain.encode_chat(messages), config, drafter="none").text
    monkeypatch.setattr("sys.stdin", io.StringIO("w4 w5\n"))
    monkeypatch.setattr("sys.stdout", Interrupting(sys.stdout.out, 2))
    status, out, err = run(args, capsys)
    assert status == 130 and "quickdraft: interrupted" in err and "finish:" not in err


def test_missing_and_corrupt_models(tmp_path: Path, tiny_model_dirs: dict[str, Path], capsys) -> None:
    status, _, err = run(["generate", "w1", "--target", str(tmp_path / "nope")], capsys)
    assert status == 1 and "not found" in err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    status, _, err = run(["generate", "w1", "--target", str(broken), "--drafter", "none"], capsys)
    assert status == 1 and err.startswith("quickdraft: error: cannot load the model") and "Traceback" not in err


def test_a_draft_of_another_vocabulary_drafts_across_vocabularies(
    tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    """The user is told which pairing they got and why; the answer is the target's own."""
    args = ["generate", "w1 w2", "--target", str(tiny_model_dirs["target"]), "--max-new-tokens", "8", "--json"]
    plain = run([*args, "--drafter", "none"], capsys)
    status, out, err = run([*args, "--draft", str(tiny_model_dirs["other"]), "--drafter", "draft-model"], capsys)
    assert status == 0 and "drafts across vocabularies" in err and "token ids mean different text" in err
    assert json.loads(out)["token_ids"] == json.loads(plain[1])["token_ids"]
    assert "across vocabularies" in json.loads(out)["pairing"]


def test_help_explains_the_commands(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ["--drafter", "--num-draft-tokens", "--json", "--chat", "--target", "--draft", "--seed"]:
        assert option in out


@pytest.mark.parametrize("command", ["generate", "serve", "bench-serve"])
def test_the_policy_option_names_every_policy(command: str, capsys: pytest.CaptureFixture) -> None:
    from quickdraft.policies import POLICIES

    with pytest.raises(SystemExit):
        main([command, "--help"])
    policy_help = capsys.readouterr().out.split("\n  --policy NAME", 1)[1].split("\n  --", 1)[0]
    assert all(name in policy_help for name in POLICIES.names()), policy_help


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_explains_itself(command: str, capsys: pytest.CaptureFixture) -> None:
    """Each command's help, built from the command's own module alone, and the same command in the full parser."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    alone = capsys.readouterr().out
    assert exit_info.value.code == 0 and alone.startswith(f"usage: quickdraft {command} ")
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    assert capsys.readouterr().out == alone


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_unknown_option_shows_the_commands_usage(command: str, capsys: pytest.CaptureFixture) -> None:
    """``quickdraft cache --bogus`` names ``quickdraft cache`` and shows its usage, not the top-level one."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--bogus-option"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"usage: quickdraft {command} ")
    assert f"quickdraft {command}: error: unrecognized arguments: --bogus-option\n" in err  # nothing close to it


def test_a_mistyped_option_is_named_with_the_one_meant(capsys: pytest.CaptureFixture) -> None:
    for argv, meant in (
        (["generate", "--temprature", "0.5", "hi"], "--temperature"),
        (["serve", "--prot=8000"], "--port"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and f"(did you mean {meant}?)" in capsys.readouterr().err


def test_the_command_list_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    """``quickdraft --help``, ``--version``, a mistyped command, ``cache`` and every command's help answer without
    importing the models' libraries: a command's module is imported only for that command, and
    what it needs to run (the engine, the runtimes, the server) only when it runs."""
    helps = [[command, "--help"] for command in COMMANDS]
    code = (
        "import sys\nfrom quickdraft.cli import main\n"
        f"for argv in (['--help'], ['--version'], ['generat'], ['cache', '--json'], ['generate', '--bad'], *{helps}):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))"
    )
    environment = {**os.environ, "QUICKDRAFT_CACHE": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=environment
    )
    assert done.stdout.splitlines()[-1] == "[]" and "invalid choice: 'generat'" in done.stderr


def test_compare_reports_speedup_and_identity(model_args: list[str], capsys: pytest.CaptureFixture) -> None:
    args = ["generate", "w1 w2 w3", *model_args, "--max-new-tokens", "6", "--compare"]
    status, _, err = run(args, capsys)
    assert status == 0 and "speedup over plain decoding" in err and "identical tokens: yes" in err
    status, out, _ = run([*args, "--json"], capsys)
    compare = json.loads(out)["compare"]
    assert compare["identical_tokens"] is True and compare["speedup"] > 0
    assert compare["plain_stats"]["draft_tokens_proposed"] == 0
    status, _, err = run([*args, "--temperature", "0.7", "--seed", "3"], capsys)  # seeded: the same tokens, no caveat
    assert status == 0 and err.rstrip().endswith("identical tokens: yes")
    status, _, err = run([*args, "--temperature", "0.7"], capsys)
    assert status == 0 and "sampled without --seed: equal distributions" in err


def test_auto_runtime_picks_native_for_llama_family(native_model_dirs, capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(native_model_dirs["target"].parent / "cache"))
    args = ["generate", "w1 w2 w3", "--target", str(native_model_dirs["target"]), "--drafter", "early-exit"]
    assert main([*args, "--runtime", "auto", "--max-new-tokens", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "native"
    assert main([*args, "--runtime", "transformers", "--max-new-tokens", "6"]) == 1
    assert "cannot exit early: use the native runtime (--runtime)" in capsys.readouterr().err


def test_profile_command_prints_json(tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    args = ["profile", "--model", str(tiny_model_dirs["target"]), "--max-k", "3", "--context", "8", "--json"]
    assert main([*args, "--repeats", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "transformers" and report["context"] == 8
    assert sorted(report["t_ms"]) == ["1", "2", "3"] and report["placeholder_context"] is False
    assert main([*args[:-2], "400", "--placeholder-context", "--json", "--repeats", "1"]) == 0  # not read: filled
    report = json.loads(capsys.readouterr().out)
    assert (report["context"], report["placeholder_context"], sorted(report["t_ms"])) == (400, True, ["1", "2", "3"])
    model = ["profile", "--model", str(tiny_model_dirs["target"]), "--runtime", "transformers"]
    for flags, words in (  # the model's own options, named by profile's flags (not generate's draft options)
        (["--weights", "q4"], "weights 'q4' needs the native runtime: the transformers runtime runs the model's own "),
        (["--vocabulary", "99999"], "vocabulary 99999 is larger than the model's vocabulary of 32 tokens"),
        (["--context", "0"], "--context must be >= 1, got 0"),
    ):
        assert main([*model, *flags]) == 1
        err = capsys.readouterr().err
        assert words in err and "draft_" not in err, err
        assert flags[0] in words or err.rstrip().endswith(f"({flags[0]})"), err  # the flag, named once


def test_profile_command_on_the_native_runtime(native_model_dirs: dict[str, Path], capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(Path(str(native_model_dirs["target"])).parent / "cache"))
    args = ["profile", "--model", str(native_model_dirs["target"]), "--runtime", "auto", "--max-k", "3", "--json"]
    assert main([*args, "--context", "8", "--repeats", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runtime"] == "native" and sorted(report["t_ms"]) == ["1", "2", "3"]


def test_profile_times_reading_a_prompt(native_model_dirs: dict[str, Path], capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(Path(str(native_model_dirs["target"])).parent / "cache"))
    args = ["profile", "--model", str(native_model_dirs["target"]), "--runtime", "auto", "--repeats", "1"]
    assert main([*args, "--prefill", "12", "--json", "--context", "64"]) == 0
    captured = capsys.readouterr()
    prefill = json.loads(captured.out)["prefill"]
    assert prefill["tokens"] == 12 and prefill["quickdraft"]["tokens_per_s"] > 0 and "llama_cpp" not in prefill
    assert "note: not used with --prefill (it times a prompt, not the k-token curve): --context" in captured.err
    for bad, message in [
        (["--prefill", "0"], "--prefill must be >= 1"),
        (["--against", "llama-cpp"], "give --prefill N too"),
        (["--prefill", "100000"], "exceeds the model's"),
    ]:
        assert main([*args, *bad]) == 1
        assert message in capsys.readouterr().err


def test_cache_shows_its_entries_and_the_fp32_copies(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "my cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "no-builds"))  # the kernels' builds: listed after these
    assert run(["cache"], capsys) == (0, f"{tmp_path / 'my cache'}: 0 B\n", "")
    files = {"models/m/m.gguf": 5_000_000, "models/m/hf/config.json": 1000, "native/k/weights.safetensors": 3_000_000}
    files["models/m/hf/model.safetensors"] = 200_000_000
    files["converted/0123/hf.lock"] = 0  # what a file that was not a model leaves: not listed
    files["converted/4567/hf/config.json"] = 100
    for name, size in files.items():
        (tmp_path / "my cache" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "my cache" / name).write_bytes(b"\0" * size)
    marker = {"sha256": "4567", "source": "/models/tiny.gguf"}  # what the conversion wrote: named in the listing
    (tmp_path / "my cache/converted/4567/hf/quickdraft-source.json").write_text(json.dumps(marker))
    status, out, _ = run(["cache", "--json"], capsys)
    converted = str(tmp_path / "my cache/converted/4567")
    assert status == 0 and json.loads(out) == [
        {"path": converted, "bytes": 100 + len(json.dumps(marker)), "fp32_bytes": 0, "source": "/models/tiny.gguf"},
        {"path": str(tmp_path / "my cache/models/m"), "bytes": 205_001_000, "fp32_bytes": 200_000_000},
        {"path": str(tmp_path / "my cache/native"), "bytes": 3_000_000, "fp32_bytes": 0},
    ]
    status, out, _ = run(["cache"], capsys)
    assert "0.21 GB  models/m (fp32 copy for transformers 0.20 GB)" in out and "3.0 MB  native" in out
    assert "converted/4567 (from /models/tiny.gguf)\n" in out
    assert f"delete them with rm '{tmp_path / 'my cache'}'/*/*/hf/model.safetensors" in out  # a shell's words


def test_damaged_gguf_files_give_one_error_line(tmp_path: Path, capsys, monkeypatch) -> None:
    from conftest import write_tiny_gguf

    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])  # its metadata whole, its tensors cut short
    for name in ("junk.gguf", "cut.gguf"):
        args = ["generate", "abc", "--target", str(tmp_path / name), "--drafter", "none", "--json"]
        status, _, err = run(args, capsys)
        message = err.rstrip("\n").split("\n")[-1]  # after the progress bar of the digest
        assert status == 1 and message.startswith("quickdraft: error: ") and name in message, err
        assert "is not a GGUF file quickdraft can read" in message, err
        assert "Traceback" not in err


def test_models_lists_a_model_whose_parts_are_not_installed(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import dataclasses

    import quickdraft.cli.models as models_command
    from quickdraft.models import KNOWN_MODELS

    absent = dataclasses.replace(
        KNOWN_MODELS["gemma-3-270m"], name="absent", distribution="absent-part", module="absent_part"
    )
    monkeypatch.setattr(models_command, "KNOWN_MODELS", {"absent": absent})
    status, out, _ = run(["models", "--json"], capsys)
    (row,) = json.loads(out)
    assert status == 0 and row["path"] is None and "pip install absent-part1==1.0.0" in row["problem"]


UNUSED_OPTIONS = {
    "γ of an adaptive policy": (["--policy", "goodput", "--num-draft-tokens", "3"], "--num-draft-tokens", "goodput"),
    "largest γ of a fixed one": (["--policy", "fixed:3", "--max-draft-tokens", "8"], "--max-draft-tokens", "fixed"),
    "recalibrating what measures nothing": (["--policy", "fixed", "--recalibrate"], "--recalibrate", "fixed policy"),
    "an acceptance head without specdec++": (["--acceptance-head", __file__], "--acceptance-head", "goodput"),
    "a draft head without eagle": (["--drafter", "suffix", "--draft-head", __file__], "--draft-head", "suffix"),
    "n-grams of a drafter that copies none": (
        ["--drafter", "draft-model", "--prompt-lookup-max-ngram", "4"],
        "--prompt-lookup-max-ngram",
        "draft-model drafter",
    ),
    "n-grams of the suffix drafter's copies": (
        ["--prompt-lookup-max-ngram", "4"],  # the default drafter: they apply to a --prediction only
        "--prompt-lookup-max-ngram",
        "hybrid-suffix drafter",
    ),
    "the hybrid's n-gram off the hybrid": (
        ["--drafter", "prompt-lookup", "--hybrid-min-ngram", "3"],
        "--hybrid-min-ngram",
        "prompt-lookup drafter",
    ),
    "a policy of plain decoding": (["--drafter", "none", "--policy", "goodput"], "--policy", "none drafter"),
}


@pytest.mark.parametrize("case", UNUSED_OPTIONS)
def test_options_the_drafter_and_policy_do_not_use_get_a_note(case: str, capsys: pytest.CaptureFixture) -> None:
    from quickdraft.cli import build_parser
    from quickdraft.cli.generate_options import check_options
    from quickdraft.config import GenerationConfig

    options, option, user = UNUSED_OPTIONS[case]
    args = build_parser().parse_args(["generate", "w1", *options])
    check_options(args, GenerationConfig(num_draft_tokens=args.num_draft_tokens, policy=args.policy))
    notes = capsys.readouterr().err.splitlines()
    assert any(note.startswith(f"quickdraft: note: {option} is not used by") and user in note for note in notes)


def test_options_that_are_used_get_no_note(capsys: pytest.CaptureFixture) -> None:
    from quickdraft.cli import build_parser
    from quickdraft.cli.generate_options import check_options
    from quickdraft.config import GenerationConfig

    for options in (
        ["--num-draft-tokens", "3"],
        ["--policy", "heuristic", "--num-draft-tokens", "3", "--max-draft-tokens", "8"],
        ["--drafter", "hybrid", "--recalibrate", "--prompt-lookup-max-ngram", "4", "--hybrid-min-ngram", "3"],
        ["--prediction", __file__, "--prompt-lookup-max-ngram", "4", "--hybrid-min-ngram", "3"],  # its n-grams
        ["--drafter", "eagle", "--draft-head", __file__],
        ["--drafter", "draft-model", "--policy", "specdec++", "--acceptance-head", __file__],
        ["--temperature", "0.7", "--seed", "3", "--top-k", "5"],
    ):
        args = build_parser().parse_args(["generate", "w1", *options])
        check_options(args, GenerationConfig(num_draft_tokens=args.num_draft_tokens, policy=args.policy))
        assert capsys.readouterr().err == "", options


def test_unused_options_are_noted_and_the_answer_is_the_same(
    tiny_model_dirs: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    args = ["generate", "w1 w2 w1 w2", "--target", str(tiny_model_dirs["target"]), "--max-new-tokens", "4", "--json"]
    plain = run([*args, "--drafter", "none"], capsys)
    status, out, err = run([*args, "--drafter", "none", "--draft-weights", "int8", "--num-draft-tokens", "2"], capsys)
    assert status == 0 and json.loads(out)["token_ids"] == json.loads(plain[1])["token_ids"]
    assert "quickdraft: note: --draft-weights is not used by the none drafter" in err
    assert "quickdraft: note: --num-draft-tokens is not used by the none drafter (plain decoding)" in err
    status, _, err = run([*args, "--drafter", "none", "--compare", "--max-new-tokens", "2"], capsys)
    assert status == 0 and "note: the none drafter is plain decoding: --compare times it against itself" in err


def test_bench_serve_says_when_its_server_cannot_be_reached(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["w1 w2"]}), encoding="utf-8")
    args = ["bench-serve", "--url", "http://127.0.0.1:1", "--configs", "plain=none", "--no-reference"]
    status, out, err = run([*args, "--questions", str(questions), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and out == "" and "Traceback" not in err
    assert err.startswith("quickdraft: error: cannot reach the server at http://127.0.0.1:1 (")


def test_a_cache_that_is_a_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "afile").write_text("not a directory")
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "afile"))
    for args in (["cache"], ["generate", "w1", "--target", "hf:someone/repo/model.gguf"]):  # before any download
        status, out, err = run(args, capsys)
        assert status == 1 and out == "" and "Traceback" not in err
        assert (
            err == f"quickdraft: error: the cache {tmp_path / 'afile'} ($QUICKDRAFT_CACHE) is not a directory; "
            "set QUICKDRAFT_CACHE to one\n"
        )


def test_an_empty_cache_variable_is_the_default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quickdraft.files import cache_root

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QUICKDRAFT_CACHE", "")  # not the current directory
    assert cache_root() == tmp_path / ".cache" / "quickdraft"
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "nowhere").symlink_to(tmp_path / "gone")
    for odd in ("loop", "nowhere"):
        monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / odd))
        with pytest.raises(ConfigError, match="is not a directory"):
            cache_root()
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "afile" / "cache"))
    with pytest.raises(ConfigError, match="cannot be made under the file"):
        cache_root()


def test_the_version_is_the_packages(capsys: pytest.CaptureFixture) -> None:
    from quickdraft.version import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"quickdraft {__version__}\n"


def test_a_failed_command_leaves_no_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_exit: list[tuple] = []
    monkeypatch.setattr("atexit.register", lambda function, *args: at_exit.append((function, args)))
    out = tmp_path / "new" / "results"
    status, _, err = run(["bench", "--out", str(out), "--questions", str(tmp_path / "none.jsonl")], capsys)
    assert status == 1 and "none.jsonl" in err
    for function, args in at_exit:  # what the process does as it exits
        function(*args)
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept"  # one that holds something stays
    status, _, _ = run(["bench", "--out", str(kept), "--questions", str(tmp_path / "none.jsonl")], capsys)
    (kept / "notes.txt").write_text("mine")
    for function, args in at_exit[1:]:
        function(*args)
    assert (kept / "notes.txt").is_file()


def test_a_suffix_needs_fill_in_the_middle_tokens_and_no_chat(
    model_args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    suffix = tmp_path / "suffix.txt"
    suffix.write_text("w3")
    status, _, err = run(["generate", "w1 w2", *model_args, "--suffix", str(suffix)], capsys)
    assert status == 1 and "no fill-in-the-middle tokens" in err  # a word tokenizer has none
    status, _, err = run(["generate", "", *model_args, "--suffix", str(suffix)], capsys)  # at the start: no prompt
    assert status == 1 and "no fill-in-the-middle tokens" in err
    status, _, err = run(["generate", "w1 w2", *model_args, "--suffix", str(suffix), "--chat"], capsys)
    assert status == 1 and "--suffix asks for the text between the prompt and a suffix" in err


@pytest.mark.parametrize(("command", "says"), [("generate", "(default {})"), ("bench", "drafters default to γ={}")])
def test_help_states_the_default_number_of_draft_tokens(
    command: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The help, built without importing the config, says the config's default γ."""
    from quickdraft.config import DEFAULT_NUM_DRAFT_TOKENS

    monkeypatch.setenv("COLUMNS", "10000")  # one line per option: no phrase broken across lines
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert says.format(DEFAULT_NUM_DRAFT_TOKENS) in capsys.readouterr().out


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    ("args", "redirect", "words"),
    [
        (["--version"], "> /dev/full", "cannot write the output: No space left on device"),
        (["cache", "--help"], "> /dev/full", "cannot write the output: No space left on device"),
        (["cache", "--json"], "> /dev/full", "cannot write the output: No space left on device"),
        (["cache"], ">&-", "standard output is closed"),
        (["generate", "--max-new-tokens", "2", "-"], "<&-", "standard input is closed"),
    ],
)
def test_output_that_cannot_be_written_and_closed_streams_are_one_line_errors(
    tmp_path: Path, args: list[str], redirect: str, words: str
) -> None:
    """A full disk or a closed stream is said in one line with status 1, never a traceback nor a silent 0."""
    command = " ".join([sys.executable, "-m", "quickdraft", *args, redirect])
    environment = {**os.environ, "QUICKDRAFT_CACHE": str(tmp_path)}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120, env=environment)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"quickdraft: error: {words}"), done.stderr


def test_an_ipv6_host_is_bracketed_in_the_url_and_errors() -> None:
    from quickdraft.cli.serve import endpoint, url_of

    assert url_of("::1", 8000) == "http://[::1]:8000/v1" and url_of("127.0.0.1", 80) == "http://127.0.0.1:80/v1"
    assert endpoint("fe80::1", 9) == "[fe80::1]:9"


def test_serve_notes_that_metrics_public_changes_nothing_without_a_key(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--metrics-public", "--max-replicas", "2"]) == 1  # refused after the note, before loading
    assert "--metrics-public changes nothing without an API key" in capsys.readouterr().err


def test_a_file_the_command_cannot_use_is_named_not_taken_for_the_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A cache or model file that cannot be read or written is an error naming it ('cannot write the output' was
    said of it)."""
    from quickdraft.cli import models

    def denied(_: object) -> None:
        raise PermissionError(13, "Permission denied", "/cache/models/x")

    monkeypatch.setattr(models, "run", denied)
    assert main(["models"]) == 1
    assert capsys.readouterr().err == "quickdraft: error: /cache/models/x: Permission denied\n"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_file_error_after_output_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    script = (
        "import sys\nfrom quickdraft.cli import main, models\n"
        "def denied(_):\n    print('listed' * 100)\n    raise PermissionError(13, 'Permission denied', '/c/x')\n"
        "models.run = denied\nsys.exit(main(['models']))\n"
    )
    command = f"{sys.executable} -c {shlex.quote(script)} > /dev/full"
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 1 and done.stderr == "quickdraft: error: /c/x: Permission denied\n", done.stderr


def test_bench_serve_of_peers_alone_checks_no_quickdraft_server_setting(capsys: pytest.CaptureFixture) -> None:
    """--draft-weights without a draft model is a quickdraft server's error: no such server is started here."""
    assert main(["bench-serve", "--configs", "peer=llama-server", "--drafter", "none", "--draft-weights", "q4",
                 "--questions", "/nonexistent.jsonl"]) == 1  # fmt: skip
    assert "--draft-weights" not in capsys.readouterr().err


def test_a_file_name_that_is_not_utf8_is_printed_escaped(tmp_path: Path) -> None:
    """``PYTHONIOENCODING=utf-8`` (Docker's, CI's) makes printing such a name raise: it is escaped instead."""
    os.makedirs(os.fsencode(tmp_path / "models") + b"/bad\xff/hf")
    (Path(os.fsdecode(os.fsencode(tmp_path / "models") + b"/bad\xff/hf")) / "config.json").write_text("{}")
    environment = {**os.environ, "QUICKDRAFT_CACHE": str(tmp_path), "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-m", "quickdraft", "cache"], capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0 and "models/bad\\udcff" in done.stdout, done.stderr
