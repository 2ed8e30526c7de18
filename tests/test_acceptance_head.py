"""SpecDec++: the acceptance head, its training command and the specdec++ policy."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quickdraft.api import Pipeline
from quickdraft.cli import main
from quickdraft.config import GenerationConfig
from quickdraft.errors import ConfigError, ModelFilesError
from quickdraft.policies import DraftStep, PolicyContext, StepOutcome, make_policy
from quickdraft.policies.acceptance_head import AcceptanceHead, calibration, fit_head, head_features
from quickdraft.policies.train_acceptance import RecordingPolicy


def synthetic(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features whose first coordinate decides acceptance (noisily)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 6, generator=generator)
    labels = (features[:, 0] + 0.3 * torch.randn(n, generator=generator) > 0).long()
    return features, labels


def test_fit_learns_and_is_calibrated_on_held_out_data(tmp_path: Path) -> None:
    head = fit_head(*synthetic(600, seed=0))
    report = calibration(head, *synthetic(400, seed=1))
    assert report["accuracy"] > 0.85 and report["ece"] < 0.08 and report["brier"] < 0.12
    assert sum(row["n"] for row in report["reliability"]) == 400
    head.metadata = {"note": "test"}
    head.save(tmp_path / "head.safetensors")
    loaded = AcceptanceHead.load(tmp_path / "head.safetensors")
    features = synthetic(5, seed=2)[0]
    assert torch.equal(loaded.probability(features), head.probability(features))
    assert loaded.metadata == {"note": "test"}


def test_fit_chooses_a_strong_penalty_when_features_outnumber_the_signal() -> None:
    """300 noise features beside one informative one and 240 rows: a weak penalty would fit noise."""
    generator = torch.Generator().manual_seed(0)
    signal = torch.randn(400, 1, generator=generator)
    features = torch.cat([signal, torch.randn(400, 300, generator=generator)], dim=1)
    labels = (signal[:, 0] + 0.5 * torch.randn(400, generator=generator) > 0).long()
    head = fit_head(features[:240], labels[:240])
    assert head.metadata["weight_decay"] > 1e-3
    held_out = calibration(head, features[240:], labels[240:])
    assert held_out["accuracy"] > 0.7


def test_fit_and_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both accepted and rejected"):
        fit_head(torch.randn(10, 3), torch.ones(10))
    with pytest.raises(ModelFilesError, match="train-acceptance-head"):
        AcceptanceHead.load(tmp_path / "absent.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"nonsense")
    with pytest.raises(ModelFilesError):
        AcceptanceHead.load(tmp_path / "bad.safetensors")
    with pytest.raises(ConfigError, match="vectors"):
        AcceptanceHead(torch.zeros(6), torch.tensor(0.0), torch.zeros(5), torch.ones(6))
    mismatched = {"weight": torch.zeros(6), "bias": torch.zeros(1), "mean": torch.zeros(5), "scale": torch.ones(6)}
    save_file(mismatched, tmp_path / "mismatched.safetensors")
    with pytest.raises(ModelFilesError, match=r"mismatched\.safetensors is not a quickdraft acceptance head"):
        AcceptanceHead.load(tmp_path / "mismatched.safetensors")
    save_file({"fc.weight": torch.zeros(2, 2)}, tmp_path / "draft_head.safetensors")  # another model's file
    with pytest.raises(ModelFilesError, match="holds no weight, bias, mean, scale tensor \\(a draft head from"):
        AcceptanceHead.load(tmp_path / "draft_head.safetensors")


def constant_head(probability: float, width: int) -> AcceptanceHead:
    logit = torch.logit(torch.tensor(probability))
    return AcceptanceHead(torch.zeros(width + 2), logit, torch.zeros(width + 2), torch.ones(width + 2))


def test_runtimes_report_the_width_of_their_hidden_states(pipeline: Pipeline) -> None:
    token_ids = torch.tensor([[1, 2, 3]])
    for runtime in (pipeline.target, pipeline.draft):
        hidden = runtime.forward_with_hidden(token_ids, runtime.new_cache())[1]  # [1, 3, H]
        assert runtime.hidden_size == hidden.shape[-1] == 32


def test_a_head_for_another_draft_model_is_refused_when_loaded(pipeline: Pipeline, tmp_path: Path) -> None:
    """A head of another feature width used to load, then crash at the first draft."""
    fitting, other = tmp_path / "fitting.safetensors", tmp_path / "other.safetensors"
    constant_head(0.9, width=32).save(fitting)
    constant_head(0.9, width=896).save(other)
    fresh = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=pipeline.draft)
    loaded = fresh.load_acceptance_head("draft-model", fitting)
    assert loaded.weight.shape == (34,) and fresh.drafter_records("draft-model").acceptance_head is loaded
    with pytest.raises(ModelFilesError) as error:
        fresh.load_acceptance_head("draft-model", other)
    message = str(error.value)
    assert str(other) in message and "898 features" in message and "34" in message and "\n" not in message
    assert fresh.drafter_records("draft-model").acceptance_head is loaded  # the refused head replaced nothing


def test_specdec_stops_when_a_rejection_becomes_likely() -> None:
    head = constant_head(0.9, width=4)
    policy = make_policy("specdec++:0.3", PolicyContext(max_draft_tokens=16, acceptance_head=head))
    bid = policy.bid()
    assert bid.num_draft_tokens == 16
    step = DraftStep(torch.zeros(1, 10), torch.zeros(1, 4), 1)
    decisions = [bid.keep_drafting(step) for _ in range(5)]
    # P(no rejection) = 0.9, 0.81, 0.729, 0.656: stop once 1 - that > 0.3
    assert decisions == [True, True, True, False, False]
    assert policy.bid().keep_drafting(step)  # a new block starts afresh
    with pytest.raises(ConfigError, match="acceptance head"):
        make_policy("specdec++", PolicyContext())
    GenerationConfig(policy="specdec++:0.5")
    with pytest.raises(ConfigError):
        GenerationConfig(policy="specdec++:3")


def test_recording_policy_labels_up_to_the_first_rejection() -> None:
    recorder = RecordingPolicy(block=5)
    assert recorder.choose() == 5
    for i in range(5):
        recorder.keep_drafting(DraftStep(torch.zeros(1, 10), torch.full((1, 4), float(i)), i + 1))
    recorder.observe(StepOutcome(recorder.bid(), 5, 5, 2))
    assert recorder.labels == [1, 1, 0] and len(recorder.features) == 3
    assert torch.equal(recorder.features[2], head_features(torch.full((1, 4), 2.0), torch.zeros(1, 10))[0])
    for i in range(3):
        recorder.keep_drafting(DraftStep(torch.zeros(1, 10), torch.zeros(1, 4), i + 1))
    recorder.observe(StepOutcome(recorder.bid(), 3, 3, 3))  # all accepted: no rejection label
    assert recorder.labels == [1, 1, 0, 1, 1, 1]


def test_train_command_and_specdec_policy_on_tiny_models(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    questions = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(questions, "wt", encoding="utf-8") as file:
        for i in range(8):
            words = " ".join(f"w{(i * 7 + j * 3) % 30}" for j in range(6))
            file.write(json.dumps({"task_id": f"t{i}", "prompt": words}) + "\n")
    out = tmp_path / "head.safetensors"
    args = ["train-acceptance-head", "--questions", str(questions), "--out", str(out), "--per-category", "8"]
    args += ["--target", str(tiny_model_dirs["target"]), "--draft", str(tiny_model_dirs["draft"])]
    args += ["--max-new-tokens", "24", "--block", "4", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n_questions"] == {"train": 6, "holdout": 2}
    assert report["holdout"]["n"] > 0 and 0 <= report["holdout"]["brier"] <= 1
    head = AcceptanceHead.load(out)
    assert head.metadata["holdout"]["n"] == report["holdout"]["n"]

    pipeline = Pipeline.load(target=tiny_model_dirs["target"], draft=tiny_model_dirs["draft"], progress=False)
    pipeline.load_acceptance_head("draft-model", out)
    prompt_ids = pipeline.encode("w1 w2 w3 w4")
    plain = pipeline.generate(prompt_ids, GenerationConfig(max_new_tokens=24), drafter="none")
    config = GenerationConfig(max_new_tokens=24, policy="specdec++:0.5", max_draft_tokens=6)
    assert pipeline.generate(prompt_ids, config, drafter="draft-model").token_ids == plain.token_ids


def test_the_default_head_of_a_local_draft_is_named_by_its_files(tmp_path: Path) -> None:
    """Another draft model in a directory of the same name must not find a head trained for this one."""
    from conftest import save_tiny_model_dir

    from quickdraft.policies.acceptance_head import default_head_path

    first = save_tiny_model_dir(tmp_path / "a" / "draft", 32, seed=0)
    second = save_tiny_model_dir(tmp_path / "b" / "draft", 32, seed=1)
    assert default_head_path(first) != default_head_path(second)
    assert default_head_path(first).name.startswith("draft-") and default_head_path(first) == default_head_path(first)


def test_specdec_needs_drafts_with_the_draft_models_hidden_states(pipeline: Pipeline) -> None:
    """A drafter whose drafts carry none would be drafted to the maximum unjudged: refused, before any head loads."""
    config = GenerationConfig(max_new_tokens=4, policy="specdec++")
    for drafter in ("prompt-lookup", "suffix"):
        with pytest.raises(
            ConfigError, match=r"hidden states: use a drafter that has them \(draft-model, hybrid,"
        ) as bad:
            pipeline.generate([1, 2, 3], config, drafter=drafter)
        assert bad.value.setting == "drafter"  # what the message asks to change
    assert pipeline.generate([1, 2, 3], GenerationConfig(max_new_tokens=4), drafter="none").token_ids  # no drafts
