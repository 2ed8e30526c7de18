"""The OpenVINO GenAI peers through a fake ``openvino_genai`` module (CI installs no OpenVINO): method specs,
the missing-package error, the cached int4 export, what is fed to GenAI and a whole tiny bench run."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from bench_helpers import (
    COUNTING_PROMPT,
    EOS_ID,
    SPEC_ROWS,
    bench_args,
    bench_error_before_loading,
    chat_model_dirs,
    next_word,
    run_to_budget,
    write_jsonl,
)

import quickdraft.bench.openvino as openvino_peer
from quickdraft.api import Pipeline
from quickdraft.bench.methods import make_method, parse_methods
from quickdraft.cli import main
from quickdraft.errors import ConfigError, QuickdraftError

__all__ = ["chat_model_dirs"]  # the fixture, used here by name


def test_openvino_method_specs() -> None:
    methods = parse_methods("openvino,openvino-draft")
    assert [m.name for m in methods] == ["baseline", "openvino", "openvino-draft"]
    assert [m.peer for m in methods] == [False, True, True]
    assert [m.uses_draft_model for m in methods] == [False, False, True]
    assert [m.num_draft_tokens for m in methods] == [None, None, None]  # no theory check for peers
    for bad in ("openvino:3", "openvino@transformers", "openvino-draft+goodput", "openvino-draft:5"):
        with pytest.raises(QuickdraftError):
            parse_methods(bad)


def test_openvino_missing_says_how_to_install_before_loading_models(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino_genai", None)  # as in CI: import openvino_genai raises ImportError
    with pytest.raises(ConfigError, match=r"openvino-genai.*pip install 'quickdraft\[peers\]'"):
        make_method("openvino").check()
    err = bench_error_before_loading(chat_model_dirs, tmp_path, capsys, monkeypatch, "openvino-draft")
    assert "'openvino-draft' needs openvino-genai" in err and "pip install 'quickdraft[peers]'" in err


# --- the export -----------------------------------------------------------------------------------


@pytest.fixture
def fake_exporter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The cache in tmp_path, an exporter environment that is this Python, and an export that writes a
    file where optimum-cli would write the model (or fails when the source says so)."""
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(openvino_peer, "exporter_python", lambda progress=True: Path(sys.executable))
    calls: list[list[str]] = []

    def export(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
        calls.append(command)
        assert env is not None and env["HF_HUB_OFFLINE"] == "1"  # never asks the model hub
        out = Path(command[-1])
        out.mkdir(parents=True)
        (out / "openvino_model.xml").write_text("<net/>")
        if (Path(command[command.index("--model") + 1]) / "fail").exists():
            raise ConfigError(f"{what} failed")

    monkeypatch.setattr(openvino_peer, "run_quietly", export)
    return calls


def test_export_is_made_once_atomically_and_keyed_by_the_source(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, fake_exporter: list[list[str]]
) -> None:
    exported = openvino_peer.exported_model(tiny_model_dirs["target"], progress=False)
    assert exported.parent == tmp_path / "cache" / "openvino" and (exported / "openvino_model.xml").is_file()
    record = json.loads((exported / openvino_peer.EXPORT_MARKER).read_text())
    assert record["source"] == str(tiny_model_dirs["target"]) and record["exporter"] == "optimum-intel==2.2.0"
    (command,) = fake_exporter
    assert command[1:5] == ["-m", "optimum.commands.optimum_cli", "export", "openvino"]
    assert command[command.index("--weight-format") + 1] == "int4"
    assert command[command.index("--task") + 1] == "text-generation-with-past"
    assert openvino_peer.exported_model(tiny_model_dirs["target"], progress=False) == exported  # reused
    assert len(fake_exporter) == 1
    assert openvino_peer.exported_model(tiny_model_dirs["draft"], progress=False) != exported  # other weights

    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "config.json").write_text("{}")
    (failing / "fail").write_text("")
    with pytest.raises(ConfigError, match="failed"):
        openvino_peer.exported_model(failing, progress=False)
    left = sorted(path.name for path in (tmp_path / "cache" / "openvino").iterdir())
    assert len(left) == 2 and not any(name.startswith("failing") or name.startswith(".") for name in left)
    with pytest.raises(ConfigError, match="from a transformers directory"):
        openvino_peer.exported_model(tmp_path / "nowhere", "draft", progress=False)


# --- a fake GenAI -------------------------------------------------------------------------------


def draft_word(context: list[int]) -> int:
    """The fake draft's guess: the target's, except that it never guesses 5 (it says 6)."""
    word = next_word(context)
    return 6 if word == 5 else word


class FakeLLMPipeline:
    """``openvino_genai.LLMPipeline`` as the bench uses it: greedy from ids, one streamer call per step; with
    a draft model, up to ``num_assistant_tokens`` drafts a step and the target's correction."""

    instances: ClassVar[list[FakeLLMPipeline]] = []

    def __init__(self, path: str, device: str, **properties) -> None:
        self.path, self.device, self.properties = path, device, properties
        self.draft = properties.get("draft_model")
        self.inputs: list[list[int]] = []
        FakeLLMPipeline.instances.append(self)

    def get_generation_config(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(do_sample=True, max_new_tokens=20, stop_token_ids=set(), repetition_penalty=1.1)

    def generate(self, ids, config, streamer):
        assert not config.do_sample and config.repetition_penalty == 1.0
        context = [int(token) for token in ids.array[0]]
        self.inputs.append(list(context))
        new: list[int] = []
        proposed = accepted = 0
        while not new or (new[-1] not in config.stop_token_ids and len(new) < config.max_new_tokens):
            step = []
            if self.draft is not None:
                assert config.num_assistant_tokens == 5
                drafts = []
                for _ in range(config.num_assistant_tokens):
                    drafts.append(draft_word(context + new + drafts))
                proposed += len(drafts)
                for draft in drafts:
                    if draft != next_word(context + new + step):
                        break
                    step.append(draft)
                accepted += len(step)
            step.append(next_word(context + new + step))
            stop = next((i for i, token in enumerate(step) if token in config.stop_token_ids), len(step) - 1)
            step = step[: min(stop + 1, config.max_new_tokens - len(new))]
            new += step
            streamer.write(step)
        streamer.end()
        metrics = types.SimpleNamespace(get_num_draft_tokens=lambda: proposed, get_num_accepted_tokens=lambda: accepted)
        return types.SimpleNamespace(tokens=[new], extended_perf_metrics=metrics)


def fake_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    """``openvino_genai`` and ``openvino`` modules with what the peers use."""
    genai, openvino = types.ModuleType("openvino_genai"), types.ModuleType("openvino")

    class Tensor:
        def __init__(self, array) -> None:
            self.array = array

    class StreamerBase:
        pass

    genai.LLMPipeline, genai.StreamerBase = FakeLLMPipeline, StreamerBase
    genai.StreamingStatus = types.SimpleNamespace(RUNNING=0)
    genai.SchedulerConfig = lambda: types.SimpleNamespace(enable_prefix_caching=True)
    genai.draft_model = lambda path, device, **properties: types.SimpleNamespace(path=path, properties=properties)
    openvino.Tensor = Tensor
    monkeypatch.setitem(sys.modules, "openvino_genai", genai)
    monkeypatch.setitem(sys.modules, "openvino", openvino)
    FakeLLMPipeline.instances = []


def test_openvino_turn_results_with_a_fake_genai(
    pipeline: Pipeline, tiny_model_dirs: dict[str, Path], fake_exporter: list[list[str]], monkeypatch
) -> None:
    import torch

    fake_openvino(monkeypatch)
    pipeline = dataclasses.replace(pipeline, target_path=tiny_model_dirs["target"], draft_path=tiny_model_dirs["draft"])
    plain, draft = make_method("openvino"), make_method("openvino-draft")
    for method in (plain, draft):
        method.load(pipeline, {})
    plain_pipe, draft_pipe = FakeLLMPipeline.instances
    target_export = openvino_peer.exported_model(tiny_model_dirs["target"], progress=False)
    assert plain_pipe.path == draft_pipe.path == str(target_export) and plain_pipe.device == "CPU"
    assert plain_pipe.properties["INFERENCE_NUM_THREADS"] == torch.get_num_threads()
    assert not plain_pipe.properties["scheduler_config"].enable_prefix_caching  # every prompt read whole
    assert plain_pipe.draft is None and draft_pipe.draft.properties["INFERENCE_NUM_THREADS"] == torch.get_num_threads()
    assert draft_pipe.draft.path == str(openvino_peer.exported_model(tiny_model_dirs["draft"], progress=False))

    results = run_to_budget(pipeline, plain, draft)
    assert plain_pipe.inputs == [COUNTING_PROMPT]  # our ids, not text
    assert results[0].step_sizes == [1] * 20 and results[0].draft_tokens_proposed is None
    assert max(results[1].step_sizes) == 6 and results[1].draft_tokens_proposed == 5 * len(results[1].step_sizes)
    assert 20 - len(results[1].step_sizes) <= results[1].draft_tokens_accepted <= results[1].draft_tokens_proposed
    # An end-of-sequence token ends the turn and is kept.
    for method in (plain, draft):
        assert method.run(pipeline, [5] * 30, max_new_tokens=50).token_ids == [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, EOS_ID]


def test_bench_runs_the_openvino_peers_through_a_fake_genai(
    chat_model_dirs: dict[str, Path], tmp_path: Path, capsys, fake_exporter: list[list[str]], monkeypatch
) -> None:
    fake_openvino(monkeypatch)
    questions = write_jsonl(tmp_path / "question.jsonl", SPEC_ROWS)
    out = tmp_path / "out"
    assert main(bench_args(chat_model_dirs, questions, out, "--methods", "openvino,openvino-draft", "--json")) == 0
    results = json.loads(capsys.readouterr().out)
    assert list(results["methods"]) == ["baseline", "openvino", "openvino-draft"]
    for name in ("openvino", "openvino-draft"):
        overall = results["methods"][name]["overall"]
        assert overall["agreement"] is not None and overall["lossless_fraction"] is None  # a peer
        assert overall["tokens_per_s"] > 0
    assert results["methods"]["openvino-draft"]["overall"]["acceptance_rate"] is not None
    assert "openvino_genai" in results["machine"]
    assert len(fake_exporter) == 2  # target and draft, once each
    assert "| agreement |" in (out / "report.md").read_text()
