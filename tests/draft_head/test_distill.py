"""Distilling the draft model on collected data: adapters merge exactly, it learns the target's choices, the
written directory is a draft model like any other (lossless)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import CHAT_VOCAB, chat_pipeline, native_from_hf, tiny_model

from quickdraft.api import Pipeline
from quickdraft.config import GenerationConfig
from quickdraft.draft_head.collect import Collector, CollectSettings
from quickdraft.draft_head.data import FeatureData
from quickdraft.draft_head.distill import (
    DistillSettings,
    LoraLinear,
    add_adapters,
    check_output,
    distill,
    evaluate_draft,
    merge_adapters,
    save_distilled,
)
from quickdraft.errors import ConfigError
from quickdraft.models.loading import load_hf_model

SETTINGS = CollectSettings(sequences_per_shard=6, batch_size=4, max_user_tokens=12, max_answer_tokens=24)


@pytest.fixture(autouse=True)
def one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny operations: a second thread only waits
    yield
    torch.set_num_threads(threads)


def test_merged_adapters_compute_what_the_adapted_model_did() -> None:
    model = tiny_model(CHAT_VOCAB, seed=4, num_layers=1)
    parameters = add_adapters(model, rank=2, alpha=4.0)
    assert sum(isinstance(m, LoraLinear) for m in model.modules()) == 7
    assert all(p.requires_grad for p in parameters)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora" not in n)
    with torch.no_grad():
        for parameter in parameters:
            parameter.normal_(0, 0.1)
    ids = torch.tensor([[3, 9, 27, 5, 11]])
    with torch.no_grad():
        adapted = model(ids).logits
        merge_adapters(model)
        assert not any(isinstance(m, LoraLinear) for m in model.modules())
        assert torch.allclose(model(ids).logits, adapted, atol=1e-5)


def noisy_copy_of_the_target() -> torch.nn.Module:
    """The chat target's weights with noise on every projection: a draft that agrees with it now and then."""
    model = tiny_model(CHAT_VOCAB, seed=3, logit_scale=8.0, num_layers=4)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("proj.weight"):
                parameter += 0.8 * parameter.std() * torch.randn(parameter.shape, generator=generator)
    return model


def test_distilling_raises_agreement_and_writes_a_lossless_draft(tmp_path: Path) -> None:
    pipeline = chat_pipeline()
    directory = tmp_path / "data"
    collector = Collector(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, "tiny", SETTINGS)
    collector.collect(directory, 4, progress=False, on_shard=lambda report: None)
    data = FeatureData(directory)
    train, held_out = data.split(1)
    model = noisy_copy_of_the_target()
    settings = DistillSettings(epochs=10, rank=8, tokens_per_batch=64, learning_rate=1e-2, bf16=False)
    history = distill(model, data, train, held_out, settings, progress=False, on_eval=lambda record: None)
    assert history[-1]["eval"]["loss"] < history[0]["eval"]["loss"]  # held out
    fitted, untouched = (evaluate_draft(m, data, train, settings) for m in (model, noisy_copy_of_the_target()))
    assert fitted.agreement > untouched.agreement + 0.1  # the training conversations (too few to generalize much)

    out = tmp_path / "distilled"
    sha256 = save_distilled(model, pipeline.tokenizer, out, {"history": history})
    assert len(sha256) == 64 and (out / "distill.json").is_file()
    assert save_distilled(model, pipeline.tokenizer, out, {}) == sha256  # replaces its own earlier output

    distilled = native_from_hf(load_hf_model(out, progress=False))
    paired = Pipeline(pipeline.target, pipeline.tokenizer, pipeline.eos_token_ids, draft=distilled)
    prompt = pipeline.encode("5 9 17 3", chat=True)
    plain = pipeline.generate(prompt, GenerationConfig(max_new_tokens=40), drafter="none")
    config = GenerationConfig(max_new_tokens=40, num_draft_tokens=3, policy="fixed:3")
    result = paired.generate(prompt, config, drafter="draft-model")
    assert result.token_ids == plain.token_ids and result.stats.draft_tokens_proposed > 0


def test_distilling_refuses_to_replace_other_directories(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a distilled draft model"):
        check_output(tmp_path / "mine")
    check_output(tmp_path / "new")  # absent: fine
    with pytest.raises(ConfigError, match="rank"):
        DistillSettings(rank=0)
