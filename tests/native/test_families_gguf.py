"""Families from the GGUF files llama.cpp's own converter writes (``convert_hf_to_gguf.py`` from the pinned
llama-cpp-python sdist): a tiny random model of each, saved by transformers with the default pair's tokenizer (one
the converter knows), converted to F32 GGUF, then loaded natively from that file. Its logits are transformers' own
model's to the int8 weights' error: the tensor names, q/k norms, head width, Llama 3.1's ``rope_freqs`` and Phi-3's
fused tensors, LongRoPE factors, sliding window and partial rotary all made it.
Gemma 3's converter needs a SentencePiece model, so Gemma is checked on a real file (test_gemma_real.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from test_families import build

from quickdraft.bench.llama_tools import llama_converter
from quickdraft.models import DEFAULT_DRAFT
from quickdraft.models.loading import resolve_model
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.config import DecoderConfig

pytestmark = pytest.mark.real_model  # the default pair's tokenizer, and the sdist from the package index

QWEN_VOCAB = 151936


PHI3_WINDOW = 8


@pytest.mark.parametrize("family", ["llama3", "qwen3", "phi3", "phi4"])
def test_a_gguf_file_from_llama_cpps_converter_runs_natively(family: str, tmp_path) -> None:
    model = build(family, vocab=QWEN_VOCAB)
    if family == "phi3":
        model.config.sliding_window = PHI3_WINDOW  # read at every forward: transformers' model slides too
    model.save_pretrained(tmp_path / "hf")
    tokenizer_dir = resolve_model(DEFAULT_DRAFT, progress=False)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, tmp_path / "hf" / name)
    if family.startswith("phi"):  # the Phi-3 converter reads a BPE vocabulary when the tokenizer class says GPT-2's
        tokenizer_config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
        tokenizer_config["tokenizer_class"] = "GPT2Tokenizer"
        (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    gguf_path = tmp_path / f"{family}.gguf"
    converter = llama_converter()
    command = [sys.executable, str(converter), str(tmp_path / "hf"), "--outfile", str(gguf_path), "--outtype", "f32"]
    subprocess.run(command, check=True, capture_output=True, cwd=converter.parent)
    directory = resolve_model(gguf_path, progress=False)
    config = DecoderConfig.from_dir(directory)
    assert config.head_dim == (8 if family.startswith("phi") else 16)
    if family == "phi3":
        rope = config.layer_ropes[0]
        assert config.fused_projections and config.layer_windows == (PHI3_WINDOW,) * config.num_layers
        assert rope.scaling == "longrope" and rope.attention_factor == pytest.approx(1.5)
        assert rope.long_factor == (1.0, 2.0, 4.0, 8.0) and rope.original_max_position_embeddings == 16
    if family == "phi4":
        assert config.layer_ropes[0].rotary_dims(config.head_dim) == 6
    if family == "llama3":  # llama.cpp stores Llama 3.1's scaling as per-frequency factors
        expected = model.model.rotary_emb.inv_freq.double()
        assert torch.allclose(config.layer_ropes[0].inverse_frequencies(16), expected, rtol=1e-5)
    runtime = NativeRuntime.load(directory)
    token_ids = torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(1))
    logits = runtime.forward(token_ids, runtime.new_cache())
    with torch.no_grad():
        reference = model(token_ids).logits
    assert (logits - reference).abs().max() < 0.03 * reference.abs().max(), family
