"""Collect → train → file → the eagle drafter, on a tiny native target: lossless, and its drafts get accepted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import (
    CHAT_TEMPLATE,
    chat_pipeline,
    native_from_hf,
    save_tiny_llama_dir,
    save_tiny_model_dir,
    tiny_model,
    word_tokenizer,
)
from conftest import CHAT_VOCAB as VOCAB

from quickdraft.api import Pipeline
from quickdraft.cli import main
from quickdraft.config import GenerationConfig, SamplingParams
from quickdraft.costs import CostModel
from quickdraft.draft_head.collect import Collector, CollectSettings, read_manifest, shard_path
from quickdraft.draft_head.data import FeatureData
from quickdraft.draft_head.file import load_head, save_head
from quickdraft.draft_head.train import TrainSettings, build_head, choose_vocabulary, evaluate, train_head
from quickdraft.drafters import DrafterOptions
from quickdraft.drafters.eagle import EagleDrafter
from quickdraft.errors import ConfigError, ModelFilesError
from quickdraft.files import model_key
from quickdraft.policies import GoodputPolicy, StepState
from quickdraft.runtime import HFRuntime
from quickdraft.runtime.base import BatchRow

SETTINGS = CollectSettings(sequences_per_shard=6, batch_size=4, max_user_tokens=12, max_answer_tokens=24)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pipeline, Path]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny operations: a second thread only waits
    try:
        yield train_tiny_head(tmp_path_factory)
    finally:
        torch.set_num_threads(threads)


def train_tiny_head(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pipeline, Path]:
    pipeline = chat_pipeline()
    directory = tmp_path_factory.mktemp("data")
    collector = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", SETTINGS)
    reports = collector.collect(directory, 4, progress=False, on_shard=lambda report: None)
    assert [report.index for report in reports] == [0, 1, 2, 3]
    data = FeatureData(directory)
    train, held_out = data.split(1)
    settings = TrainSettings(epochs=6, steps=2, tokens_per_batch=64, learning_rate=3e-3, warmup_batches=2,
                             intermediate_size=32, vocabulary_size=48, bf16=False)  # fmt: skip
    vocabulary, coverage = choose_vocabulary(data, sorted({c.shard for c in train}), 48, VOCAB)
    assert 0.5 < coverage <= 1.0
    embedding = pipeline.target.embed_tokens(torch.arange(VOCAB))
    head = build_head(data, pipeline.target.decoder.config, pipeline.target.lm_head_rows, vocabulary, settings)
    before = evaluate(head, data, held_out, embedding, settings)
    history = train_head(head, data, train, held_out, embedding, settings, progress=False, on_eval=lambda r: None)
    assert len(history) >= 5  # an evaluation after each pass (batches per pass vary with the shuffle, so a
    # pass may reach the batch budget of 6 epochs early)
    after = history[-1]["eval"]
    assert after["loss"] < before.loss and after["agreement_all"] > before.agreement_all + 0.05
    path = tmp_path_factory.mktemp("head") / "head.safetensors"
    sha256 = save_head(head, path, collector.layers, "tiny", {"history": history})
    assert len(sha256) == 64
    return pipeline, path


def test_collection_holds_features_and_labels_of_every_position(trained: tuple[Pipeline, Path], tmp_path: Path) -> None:
    pipeline, _ = trained
    collector = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", SETTINGS)
    collector.collect(tmp_path, 1, progress=False, on_shard=lambda report: None)
    shard = torch.load(shard_path(tmp_path, 0))
    tokens, lengths = shard["tokens"], shard["lengths"]
    assert int(lengths.sum()) == len(tokens) == len(shard["features"]) == len(shard["label_ids"])
    assert shard["features"].shape[1] == len(collector.layers) * pipeline.target.hidden_size
    first = tokens[: int(lengths[0])].tolist()
    assert first[0] == 60 and first[int(shard["answer_start"][0]) - 2 :][:2] == [61, 62]  # opening, closing
    # each position's top label is the target's greedy choice there (the same forward, read alone)
    logits = pipeline.target.forward(torch.tensor([first]), pipeline.target.new_cache(1))[0]  # [T, V]
    assert torch.equal(shard["label_ids"][: len(first), 0].long(), logits.argmax(-1))
    # resuming keeps finished shards and refuses other settings
    assert collector.collect(tmp_path, 1, progress=False) == []
    other = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", replace(SETTINGS, seed=1))
    with pytest.raises(ConfigError, match="other settings"):
        other.collect(tmp_path, 2, progress=False)
    longest = pipeline.target.max_context - SETTINGS.max_user_tokens  # less the answer: the template's tokens too
    with pytest.raises(ConfigError, match=r"may run to \d+ positions .*, and the target holds") as error:
        Collector(pipeline.target, pipeline.tokenizer, [], "tiny", replace(SETTINGS, max_answer_tokens=longest))
    assert error.value.setting == "max_context"  # the cap (--max-context) or the model: never a cache's ValueError
    assert read_manifest(tmp_path)["next_conversation"] >= 6


@pytest.mark.parametrize("drafter", ["eagle", "hybrid-eagle"])
def test_eagle_drafting_is_lossless(trained: tuple[Pipeline, Path], drafter: str) -> None:
    pipeline, path = trained
    options = DrafterOptions(draft_head=str(path))
    prompt = pipeline.encode("5 9 17 3", chat=True)
    plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=40), drafter="none")
    for gamma in (1, 4):
        config = GenerationConfig(max_new_tokens=40, num_draft_tokens=gamma, policy=f"fixed:{gamma}")
        result = pipeline.generate(prompt, config, drafter=drafter, options=options)
        assert result.token_ids == plain.token_ids, gamma
        assert result.stats.draft_tokens_proposed > 0
    seeded = GenerationConfig(
        max_new_tokens=30, num_draft_tokens=3, policy="fixed:3", sampling=SamplingParams(0.8, seed=5)
    )
    assert (
        pipeline.generate(prompt, seeded, drafter=drafter, options=options).token_ids
        == pipeline.generate(prompt, seeded, drafter="none").token_ids
    )


def test_the_drafter_reads_the_features_of_the_positions_it_drafts_after(
    trained: tuple[Pipeline, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each first draft is the head's training-forward prediction at the last committed position but one, from
    the target's features of the whole sequence read at once: the engine hands the drafter the right rows."""
    pipeline, path = trained
    drafter = pipeline.drafter("eagle", DrafterOptions(draft_head=str(path)))
    assert isinstance(drafter, EagleDrafter)
    drafter.head = load_head(path, pipeline.target)[0]  # float weights: the training forward's arithmetic
    drafted: list[tuple[int, int]] = []  # (context length, first draft)
    propose = drafter.propose

    def spy(tasks, max_read_tokens=None):  # type: ignore[no-untyped-def]
        proposals = propose(tasks, max_read_tokens)
        drafted.extend((len(t.context), int(p.token_ids[0, 0])) for t, p in zip(tasks, proposals, strict=True))
        return proposals

    monkeypatch.setattr(drafter, "propose", spy)
    prompt = pipeline.encode("7 7 21", chat=True)
    config = GenerationConfig(max_new_tokens=30, num_draft_tokens=2, policy="fixed:2")
    result = pipeline.generate(prompt, config, "eagle", options=DrafterOptions(draft_head=str(path)))
    sequence = [*prompt, *result.token_ids]
    _, features = pipeline.target.forward_batch_with_features(
        [BatchRow(pipeline.target.new_cache(1), sequence)], drafter.feature_layers
    )
    head = drafter.head
    next_embeds = pipeline.target.embed_tokens(torch.tensor([*sequence[1:], 0]))
    with torch.no_grad():
        logits = head.train_forward(
            features[0][None], next_embeds[None], torch.ones(1, len(sequence), dtype=torch.bool), 1
        )[0]
    predicted = head.vocabulary[logits[0].argmax(-1)]  # [T]: the token at p + 2
    assert len(drafted) > 5
    for length, token in drafted:
        assert token == int(predicted[length - 2]), length


def test_head_files_are_checked(trained: tuple[Pipeline, Path], tmp_path: Path) -> None:
    pipeline, path = trained
    with pytest.raises(ModelFilesError, match="no draft head"):
        load_head(tmp_path / "missing.safetensors", pipeline.target)
    (tmp_path / "bad.safetensors").write_bytes(b"not a head")
    with pytest.raises(ModelFilesError, match="cannot read"):
        load_head(tmp_path / "bad.safetensors", pipeline.target)
    other = native_from_hf(tiny_model(VOCAB + 8, seed=3))
    with pytest.raises(ConfigError, match="trained for a target"):
        load_head(path, other)
    with pytest.raises(ConfigError, match="needs a trained draft head"):
        pipeline.generate([1, 2], GenerationConfig(max_new_tokens=2), "eagle")


def test_hybrid_eagle_plans_with_the_heads_measured_step(trained: tuple[Pipeline, Path]) -> None:
    """Goodput prices a hybrid's model drafts at its model's cost: for hybrid-eagle, the head's measured step
    (not the free drafts of a drafter without a draft model)."""
    pipeline, path = trained
    options = DrafterOptions(draft_head=str(path))
    hybrid = pipeline.drafter("hybrid-eagle", options)
    assert isinstance(hybrid.model, EagleDrafter) and hybrid.model.token_ms > 0
    state = hybrid.start([1, 2, 3], pipeline.target.new_cache(1))
    copies, model = hybrid.offers(state, [1, 2, 3])
    assert copies.free and model.token_ms == hybrid.model.token_ms and not model.batched
    policy = GoodputPolicy(CostModel({1: 100.0, 2: 101.0}, draft_ms=0.0), 4)
    bid = policy.bid(StepState(offers=(copies, model)))
    assert bid.costs is not None and bid.costs.draft_ms == hybrid.model.token_ms  # not the calibration's 0 ms


def test_training_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A finished run's checkpoint holds its state: training again with the same settings trains no further and
    keeps the history; other settings start afresh."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pipeline = chat_pipeline()
        collector = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", SETTINGS)
        collector.collect(tmp_path / "data", 2, progress=False, on_shard=lambda report: None)
        data = FeatureData(tmp_path / "data")
        conversations, held_out = data.split(1)
        settings = TrainSettings(epochs=1, steps=1, tokens_per_batch=64, intermediate_size=16, vocabulary_size=48)
        vocabulary, _ = choose_vocabulary(data, [0], 48, VOCAB)
        embedding = pipeline.target.embed_tokens(torch.arange(VOCAB))

        def run(run_settings: TrainSettings) -> list[dict]:
            head = build_head(data, pipeline.target.decoder.config, pipeline.target.lm_head_rows, vocabulary, settings)
            return train_head(head, data, conversations, held_out, embedding, run_settings, tmp_path / "checkpoint",
                              progress=False, on_eval=lambda record: None)  # fmt: skip

        first = run(settings)
        assert (tmp_path / "checkpoint").is_file() and not list(tmp_path.glob(".checkpoint.*"))
        assert run(settings) == first  # resumed at its end
        assert len(run(replace(settings, epochs=2))) > len(first)  # other settings: trained afresh
    finally:
        torch.set_num_threads(threads)


def test_collection_refuses_what_it_cannot_synthesize_from() -> None:
    pipeline = chat_pipeline()
    no_template = word_tokenizer(VOCAB, prefix="")
    with pytest.raises(ConfigError, match="chat template"):
        Collector(pipeline.target, no_template, pipeline.eos_token_ids, "tiny", SETTINGS)
    transformers = HFRuntime(tiny_model(VOCAB, seed=3))
    with pytest.raises(ConfigError, match=r"hidden states: use the native runtime$"):
        Collector(transformers, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", SETTINGS)
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        CollectSettings(batch_size=0)


def test_train_draft_rejects_bad_counts(capsys: pytest.CaptureFixture) -> None:
    assert main(["train-draft", "--shards", "0"]) == 1
    assert "--shards must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--held-out-shards", "8", "--shards", "8"],
            "--held-out-shards must be >= 0 and fewer than --shards 8, got 8",
        ),
        (["--held-out-shards", "-1"], "--held-out-shards must be >= 0"),
        (["--data", __file__], f"--data {__file__} is a file; give a directory"),
        (["--learning-rate", "inf"], "--learning-rate must be a finite number > 0, got inf"),
        (["--epochs", "nan"], "--epochs must be a finite number > 0, got nan"),
        (["--out", "/"], "--out / is a directory; give a file path"),
        (["--out", f"{__file__}/h.st"], f"--out {__file__}/h.st: {__file__} is a file, not a directory"),
        (["--out", "/absent-dir/h.st"], "--out /absent-dir/h.st: /absent-dir does not exist"),
        (["--model", "draft", "--out", __file__], f"--out {__file__} is a file; give a directory"),
        (["--unroll", "0"], "steps must be >= 1, got 0 (--unroll)"),
        (["--vocabulary", "0"], "vocabulary_size must be >= 1, got 0 (--vocabulary)"),
        (["--tokens-per-batch", "0"], "tokens_per_batch must be >= 1, got 0 (--tokens-per-batch)"),
        (["--model", "draft", "--rank", "0"], "rank must be >= 1, got 0 (--rank)"),
        (["--sequences-per-shard", "0"], "sequences_per_shard must be >= 1, got 0 (--sequences-per-shard)"),
    ],
)
def test_train_draft_checks_its_arguments_before_loading_the_target(
    args: list[str], message: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("loaded the target although the arguments were bad")

    monkeypatch.setattr(Pipeline, "load", no_loading)
    assert main(["train-draft", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"quickdraft: error: {message}") and err.count("\n") == 1


def test_the_draft_to_distill_is_checked_before_collecting(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collecting takes hours with a real target: a missing draft must not wait for it."""

    def no_collecting(*args: object, **kwargs: object) -> None:
        raise AssertionError("collected although the draft to distill is missing")

    monkeypatch.setattr(Collector, "collect", no_collecting)
    target = save_tiny_llama_dir(tmp_path / "chat", VOCAB, seed=0)
    tokenizer = word_tokenizer(VOCAB, prefix="")
    tokenizer.chat_template = CHAT_TEMPLATE  # turns the collector can open
    tokenizer.save_pretrained(target)
    args = ["train-draft", "--target", str(target), "--model", "draft", "--draft", str(tmp_path / "nowhere")]
    args += ["--max-answer-tokens", "64"]  # conversations that fit the tiny target's 512 positions
    assert main(args) == 1
    assert "nowhere" in capsys.readouterr().err


def test_the_rank_without_distilling_gets_a_note(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Loaded(Exception):
        pass

    def stop_at_loading(*args: object, **kwargs: object) -> None:
        raise Loaded

    monkeypatch.setattr(Pipeline, "load", stop_at_loading)
    with pytest.raises(Loaded):
        main(["train-draft", "--rank", "4", "--collect-only", "--shards", "1", "--epochs", "2", "--unroll", "3",
              "--held-out-shards", "3", "--model", "draft"])  # fmt: skip
    err = capsys.readouterr().err
    assert "quickdraft: note: --epochs, --held-out-shards, --rank, --unroll not used: --collect-only trains" in err
    with pytest.raises(Loaded):
        main(["train-draft", "--rank", "4", "--shards", "2"])
    assert (
        "quickdraft: note: --rank applies to the draft model's distillation (--model draft)" in capsys.readouterr().err
    )
    with pytest.raises(Loaded):
        main(["train-draft", "--model", "draft", "--vocabulary", "100"])
    assert "note: --vocabulary not used: --model draft trains no head" in capsys.readouterr().err
    with pytest.raises(Loaded):
        main(["train-draft", "--draft", "other"])  # a head: no draft model is trained
    assert "note: --draft applies to the draft model's distillation (--model draft)" in capsys.readouterr().err
    with pytest.raises(Loaded):
        main(["train-draft"])
    assert "note" not in capsys.readouterr().err


def test_a_local_models_name_tells_it_from_another_of_the_same_name(tmp_path: Path) -> None:
    """Its data, head and checkpoints are found by this name: another model in a directory of the same name, or
    new weights in place, must not find them."""
    first = save_tiny_model_dir(tmp_path / "a" / "chat", VOCAB, seed=0)
    second = save_tiny_model_dir(tmp_path / "b" / "chat", VOCAB, seed=1)
    name = model_key(first)
    assert name.startswith("chat-") and name == model_key(first) and name != model_key(second)
    (first / "model.safetensors").write_bytes((first / "model.safetensors").read_bytes())  # the same bytes, rewritten
    os.utime(first / "model.safetensors", ns=(1, 1))
    assert model_key(first) != name
    assert model_key(tmp_path / "models" / "qwen" / "hf") == "qwen"  # a packaged model: its catalog name


def test_damaged_collections_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "collection.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"collection\.json is damaged"):
        read_manifest(tmp_path)
    (tmp_path / "collection.json").write_text('{"shards": 3}')
    with pytest.raises(ConfigError, match=r"collection\.json is damaged"):
        FeatureData(tmp_path)
    (tmp_path / "collection.json").unlink()
    shard_path(tmp_path, 0).write_bytes(b"cut short")
    with pytest.raises(ConfigError, match=r"holds shards but no collection\.json"):
        read_manifest(tmp_path)
    (tmp_path / "collection.json").write_text('{"key": {}, "shards": {"0": {}}}')
    with pytest.raises(ConfigError, match=r"shard-00000\.pt is damaged"):
        FeatureData(tmp_path)


def test_an_evaluation_is_a_line_of_numbers() -> None:
    from quickdraft.cli.train_draft import eval_text

    evaluation = {"tokens": 204, "loss": 3.07251, "agreement": (0.0196, 0.0784), "agreement_all": 0.0245}
    assert eval_text(evaluation) == "tokens 204, loss 3.073, agreement 0.020 / 0.078, agreement all 0.025"
    assert eval_text(None) == "not measured (--held-out-shards 0)"  # it raised on None


def test_a_vocabulary_past_the_targets_is_noted_before_collecting(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    from quickdraft.draft_head import collect

    class Collecting(Exception):
        pass

    def loaded(*args: object, **kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(target=SimpleNamespace(vocab_size=64), target_path="/m/tiny/hf", tokenizer=None,
                               eos_token_ids=[])  # fmt: skip

    def collecting(*args: object) -> None:
        raise Collecting

    monkeypatch.setattr(Pipeline, "load", loaded)
    monkeypatch.setattr(collect, "Collector", collecting)
    with pytest.raises(Collecting):
        main(["train-draft", "--vocabulary", "100", "--shards", "2"])
    assert "note: --vocabulary 100 is more than the target's 64 tokens: the head predicts them all" in (
        capsys.readouterr().err
    )
    with pytest.raises(Collecting):
        main(["train-draft", "--shards", "2"])  # the default, not asked for: nothing to say
    assert "--vocabulary" not in capsys.readouterr().err
