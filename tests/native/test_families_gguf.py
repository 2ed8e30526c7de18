"""Families from the GGUF files llama.cpp's own converter writes (``convert_hf_to_gguf.py`` from the pinned
llama-cpp-python sdist): a tiny random model of each, saved by transformers with the default pair's tokenizer (one
the converter knows), converted to F32 GGUF, then loaded natively from that file. Its logits are transformers' own
model's to the int8 weights' error: the tensor names, q/k norms, head width, YaRN, Llama 3.1's ``rope_freqs`` and
Phi-3's fused tensors, LongRoPE factors, sliding window and partial rotary all made it.
SmolLM3 and Gemma 1 are families transformers' GGUF reader does not read: their config comes from the file's keys
(``convert.own_config``). Gemma's converter needs a SentencePiece model: the test trains a tiny one. Gemma 2 and 3
files say neither their attention scale nor (with no key) their softcaps: llama.cpp's rules give them. Gemma 3 is
also checked on a real file (test_gemma_real.py)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_families import OUTPUT_NORMED, build, native

from quickdraft.bench.llama_tools import llama_converter
from quickdraft.errors import ModelFilesError
from quickdraft.models import DEFAULT_DRAFT
from quickdraft.models.loading import load_hf_model, resolve_model
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.config import DecoderConfig

pytestmark = pytest.mark.real_model  # the default pair's tokenizer, and the sdist from the package index

QWEN_VOCAB = 151936
GEMMA_VOCAB = 512


PHI3_WINDOW = 8
SPARSE_GGUF = ("qwen3-moe", "mixtral", "qwen2-moe", "olmoe")  # mixtures of experts
SCALED_BY_SIZE = ("gemma2", "gemma3")  # llama.cpp's attention scale by the model's size, no key in the file


def write_sentencepiece_model(path: Path) -> None:
    """A SentencePiece BPE model of GEMMA_VOCAB pieces, as Gemma's (byte fallback, no dummy prefix)."""
    import sentencepiece

    model = io.BytesIO()
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=GEMMA_VOCAB, model_type="bpe",
        byte_fallback=True, add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3, minloglevel=2,
    )  # fmt: skip
    path.write_bytes(model.getvalue())


@pytest.mark.parametrize(
    "family",
    ["llama3", "qwen3", "qwen3-yarn", "phi3", "phi4", "smollm3", "gemma", "gemma2", "gemma3", "granite", "olmo2",
     "olmo3", *SPARSE_GGUF],
)  # fmt: skip
def test_a_gguf_file_from_llama_cpps_converter_runs_natively(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab = GEMMA_VOCAB if family.startswith("gemma") else QWEN_VOCAB
    model = build(family, vocab=vocab)
    if family in SCALED_BY_SIZE:  # no file says the attention scale: llama.cpp's, 1/sqrt(head width) but at 27B
        model.config.query_pre_attn_scalar = model.config.head_dim
        for layer in model.model.layers:
            layer.self_attn.scaling = model.config.head_dim**-0.5
    if family == "phi3":
        model.config.sliding_window = PHI3_WINDOW  # read at every forward: transformers' model slides too
    model.save_pretrained(tmp_path / "hf")
    if family.startswith("gemma"):
        write_sentencepiece_model(tmp_path / "hf" / "tokenizer.model")
    else:
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
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))  # the file's packed weights: not the user's cache
    directory = resolve_model(gguf_path, progress=False)
    config = DecoderConfig.from_dir(directory)
    narrow_heads = ("phi3", "phi4", "smollm3", "granite", "mixtral", "qwen2-moe", "olmo2", "olmo3", "olmoe")
    assert config.head_dim == (8 if family in narrow_heads else 16)
    if family == "smollm3":  # llama.cpp's rule by architecture (no key says it): every 4th layer without RoPE
        assert [rope is None for rope in config.layer_ropes] == [False, False, False, True]
    if family == "phi3":
        rope = config.layer_ropes[0]
        assert config.fused_projections and config.layer_windows == (PHI3_WINDOW,) * config.num_layers
        assert rope.scaling == "longrope" and rope.attention_factor == pytest.approx(1.5)
        assert rope.long_factor == (1.0, 2.0, 4.0, 8.0) and rope.original_max_position_embeddings == 16
    if family == "phi4":
        assert config.layer_ropes[0].rotary_dims(config.head_dim) == 6
    if family == "qwen3-yarn":  # the converter's rope.scaling.* keys, the original context among them
        rope = config.layer_ropes[0]
        assert (rope.scaling, rope.factor, rope.original_max_position_embeddings) == ("yarn", 4.0, 16)
    if family == "olmo3":  # OLMo 3 is written as olmo2 with a window and a pattern of sliding layers
        assert config.model_type == "olmo3" and config.layer_windows == (5, 5, 5, 0)
        assert [rope.scaling for rope in config.layer_ropes] == ["default", "default", "default", "yarn"]
    if family == "llama3":  # llama.cpp stores Llama 3.1's scaling as per-frequency factors
        expected = model.model.rotary_emb.inv_freq.double()
        assert torch.allclose(config.layer_ropes[0].inverse_frequencies(16), expected, rtol=1e-5)
    runtime = NativeRuntime.load(directory)
    token_ids = torch.randint(0, vocab, (1, 24), generator=torch.Generator().manual_seed(1))
    logits = runtime.forward(token_ids, runtime.new_cache())
    with torch.no_grad():
        reference = model(token_ids).logits
    tolerance = 0.08 if family in OUTPUT_NORMED else 0.03
    if family in SCALED_BY_SIZE:  # the bits of the runtime made from transformers' model: every setting made it (Gemma
        made = native(model)  # 3's six layers over 512 tokens are past the tolerance of int8 weights, from either)
        assert torch.equal(logits, made.forward(token_ids, made.new_cache())), family
    else:
        assert (logits - reference).abs().max() < tolerance * reference.abs().max(), family
    if family == "granite":  # its scalars, from the file's keys
        assert (config.embedding_scale, config.residual_scale, config.attention_scale, config.logits_divisor) == (
            12.0, pytest.approx(0.22), 0.0625, 8.0)  # fmt: skip
    if family in ("smollm3", "gemma", "granite", "mixtral", "olmo2", "olmo3", "olmoe"):
        return  # transformers' GGUF reader does not read these families: only the native runtime runs them
    if family == "qwen2-moe":  # transformers' reader gives the shared expert's gate the shape [1, 1, H]
        with pytest.raises(ModelFilesError, match="cannot convert"):
            load_hf_model(directory, progress=False)
        return
    hf_model = load_hf_model(directory, progress=False)  # every tensor read (the count checked), none left out
    if family == "llama3":  # the transformers runtime's model gets the factors too (its GGUF reader drops them)
        frequencies = hf_model.model.rotary_emb.inv_freq
        assert torch.allclose(frequencies, model.model.rotary_emb.inv_freq, rtol=1e-6)
        assert not torch.allclose(frequencies, hf_model.model.rotary_emb.compute_default_rope_parameters(
            hf_model.config)[0], rtol=1e-3)  # fmt: skip
    with torch.no_grad():
        assert torch.allclose(hf_model(token_ids).logits, reference, atol=1e-4 * reference.abs().max().item()), family
