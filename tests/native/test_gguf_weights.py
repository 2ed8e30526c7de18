"""The native runtime's weights straight from a GGUF file: the same packed tensors as from the fp32 directory
transformers converts the file into, without that directory."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import GGUF_LAYER_TYPES, write_tiny_gguf

from quickdraft.errors import ModelFilesError
from quickdraft.models import load_hf_model
from quickdraft.models.convert import MARKER, ensure_fp32_weights, has_fp32_weights, write_model_dir
from quickdraft.models.loading import resolve_model
from quickdraft.runtime import LoadOptions, runtime_for
from quickdraft.runtime.names import WEIGHT_FORMATS
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.architecture import POST_NORMS, SANDWICH_NORMS
from quickdraft.runtime.native.config import DecoderConfig
from quickdraft.runtime.native.embedding import TokenEmbedding
from quickdraft.runtime.native.entries import native_cache_dir
from quickdraft.runtime.native.gguf_exact import unpermute_rows
from quickdraft.runtime.native.gguf_weights import READ_TYPES, hf_tensor_name
from quickdraft.runtime.native.weights import load_native_state

pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def gguf_dir(tmp_path: Path, architecture: str = "qwen2", tied: bool = False) -> Path:
    """A tiny GGUF file and the directory quickdraft makes for it (configs, tokenizer, marker; no weights)."""
    gguf_path = write_tiny_gguf(tmp_path / f"{architecture}.gguf", architecture, tied)
    write_model_dir(gguf_path, tmp_path / "hf", "0" * 64)
    return tmp_path / "hf"


def as_old_layout(directory: Path, old: Path) -> Path:
    """A copy of ``directory`` with its fp32 weights as quickdraft converted GGUF files before: a marker without
    ``layout``, read from the safetensors file (and the GGUF's Q4_K tensors where they match)."""
    ensure_fp32_weights(directory, progress=False)
    shutil.copytree(directory, old)
    marker = json.loads((old / MARKER).read_text())
    del marker["layout"]
    (old / MARKER).write_text(json.dumps(marker))
    return old


# The read types GGUF_LAYER_TYPES leaves out, each set in a file's first layer
MORE_TYPES = (
    {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q5_1", "attn_output": "Q5_K", "ffn_gate": "IQ4_NL",
     "ffn_up": "IQ4_XS", "ffn_down": "F32"},
    {"attn_q": "Q2_K", "attn_k": "Q3_K", "attn_v": "IQ2_XXS", "attn_output": "IQ3_S", "ffn_gate": "IQ1_M",
     "ffn_up": "TQ2_0", "ffn_down": "NVFP4"},
    {"attn_q": "IQ2_XS", "attn_k": "IQ2_S", "attn_v": "IQ3_XXS", "attn_output": "IQ1_S", "ffn_gate": "TQ1_0",
     "ffn_up": "MXFP4", "ffn_down": "Q5_0"},
    {"attn_q": "Q4_0", "attn_k": "IQ4_NL", "attn_v": "IQ4_XS", "attn_output": "Q4_K", "ffn_gate": "IQ4_XS",
     "ffn_up": "IQ2_XXS", "ffn_down": "Q4_K"},  # formats of one kind side by side with different tables
)  # fmt: skip


def test_every_read_type_is_in_a_test_file() -> None:
    written = {kind for layers in (*GGUF_LAYER_TYPES, *MORE_TYPES) for kind in layers.values()}
    assert written == set(READ_TYPES)


@pytest.mark.parametrize(("architecture", "tied", "more"), [("qwen2", False, None), ("llama", True, None),
                                                             *(("qwen2", False, i) for i in range(len(MORE_TYPES))),
                                                             ("llama", False, 1)])  # fmt: skip
def test_packed_weights_equal_those_from_the_fp32_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, architecture: str, tied: bool, more: int | None
) -> None:
    """Every packed tensor equal, in every weight format: the file's tensors of the types the format keeps (Q4_K,
    Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS, IQ3_XXS, IQ3_S, the IQ2, IQ1 and ternary types, the 32-weight types Q8_0, Q5_0,
    Q4_0, Q5_1, Q4_1 and IQ4_NL, MXFP4 and NVFP4 for auto, Q4_K for q4) as they are (Llama's q/k rows reordered as
    transformers reorders its floats), the rest (every other type of READ_TYPES) quantized from the float values
    transformers' loader gives them."""
    import conftest

    if more is not None:
        monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[more], conftest.GGUF_LAYER_TYPES[1]))
    directory = gguf_dir(tmp_path, architecture, tied)
    config = DecoderConfig.from_dir(directory)
    assert not has_fp32_weights(directory) and NativeRuntime.supports(directory)
    from_gguf = {fmt: load_native_state(directory, config, fmt) for fmt in WEIGHT_FORMATS}
    keys = {fmt: native_cache_dir(directory, fmt) for fmt in WEIGHT_FORMATS}
    old = as_old_layout(directory, tmp_path / "old")
    assert {fmt: native_cache_dir(directory, fmt) for fmt in WEIGHT_FORMATS} == keys  # the fp32 copy changes no key
    for fmt in WEIGHT_FORMATS:
        from_fp32 = load_native_state(old, config, fmt)
        assert "embedding" in from_fp32 and "embedding.values" in from_gguf[fmt]  # floats / kept as stored (Q8_0, Q6_K)
        embeddings = [TokenEmbedding.from_state("embedding", state).table() for state in (from_fp32, from_gguf[fmt])]
        assert torch.equal(*embeddings), fmt  # the same rows, bit for bit
        linear = [{name: t for name, t in state.items() if not name.startswith("embedding")}
                  for state in (from_fp32, from_gguf[fmt])]  # fmt: skip
        assert linear[0].keys() == linear[1].keys()
        assert all(torch.equal(linear[0][name], linear[1][name]) for name in linear[0]), fmt
    kinds = {name.split(".")[-2] for name in from_gguf["auto"] if name.startswith("layers.") and name.endswith(".rows")}
    written = {kind for layers in conftest.GGUF_LAYER_TYPES for kind in layers.values()}
    kept = {"Q4_K": "q4", "Q5_K": "q5", "Q6_K": "q6", "Q8_0": "q8", "Q5_0": "q8", "Q4_0": "q4t", "Q5_1": "q8m",
            "Q4_1": "q4tm", "IQ4_XS": "iq4", "Q3_K": "q6", "IQ4_NL": "q4t", "Q2_K": "q2", "IQ3_XXS": "q6",
            "IQ3_S": "q6", "IQ2_XXS": "iq4", "IQ2_XS": "iq4h", "IQ2_S": "iq4h", "IQ1_S": "iq4",
            "IQ1_M": "iq4h", "TQ2_0": "q2", "TQ1_0": "q2", "MXFP4": "q4t",
            "NVFP4": "iq4h"}  # the rest: int8  # fmt: skip
    assert kinds == {"int8"} | {kept[kind] for kind in written if kind in kept}
    assert "lm_head.0.q6.rows" in from_gguf["auto"]  # output.weight, or (tied) token_embd.weight, is Q6_K
    if more == 1:  # attn_q Q2_K and attn_k Q3_K, as stored (a Llama file's rows reordered)
        assert {"layers.0.qkv.0.q2.rows", "layers.0.qkv.1.q6.rows"} <= from_gguf["auto"].keys()
    assert not any(".q6." in name for name in from_gguf["q4"])  # a draft's Q6_K: 4 bits


def compiled_against_reference(runtime: NativeRuntime, token_ids: torch.Tensor) -> torch.Tensor:
    """The layers in one native call give the logits of the PyTorch reference path, up to float rounding (its
    attention sums in another order, which now and then moves an activation across an 8-bit rounding edge: one
    quantization step in a position's logits); a part of one kind computed as another would be far off. Returns
    the compiled logits."""
    compiled = runtime.forward(token_ids, runtime.new_cache())
    runtime.decoder.use_kernel = False
    reference = runtime.forward(token_ids, runtime.new_cache())
    difference, largest = (compiled - reference).abs().amax(-1)[0], float(reference.abs().max())  # [positions]
    assert (difference <= 1e-5 * largest).float().mean() >= 0.75 and float(difference.max()) <= 2e-2 * largest
    return compiled


def some_token_ids() -> torch.Tensor:
    return torch.randint(0, 60, (1, 12), generator=torch.Generator().manual_seed(0))


def test_every_kept_format_runs_through_the_compiled_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_1, IQ4_NL and IQ4_XS tensors beside a requantized one: the layers
    in one native call (layers.h's parts of every kind) give the logits of the PyTorch reference path."""
    import conftest

    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[0], conftest.GGUF_LAYER_TYPES[1]))
    runtime = NativeRuntime.load(gguf_dir(tmp_path))
    kinds = [[type(part).kind for part in layer.out.parts] for layer in runtime.decoder.layers]
    assert kinds == [["q5"], ["q4"]]  # attn_output: Q5_K in layer 0, Q4_K in layer 1
    qkv = [type(part).kind for part in runtime.decoder.layers[0].qkv.parts]
    assert qkv == ["q4t", "q4tm", "q8m"]  # attn_q Q4_0, attn_k Q4_1, attn_v Q5_1
    assert [type(part).kind for part in runtime.decoder.layers[0].gate_up.parts] == ["q4t", "iq4"]  # IQ4_NL, IQ4_XS
    compiled_against_reference(runtime, some_token_ids())


def test_low_bit_formats_run_through_the_compiled_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's Q2_K, Q3_K, IQ2_XXS and IQ3_S tensors (q2, q6 and iq4 parts with IQ2_XXS's table), IQ1_M and TQ2_0
    (iq4h, q2) and NVFP4 (iq4h with e2m1's values), in one native call."""
    import conftest

    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[1], conftest.GGUF_LAYER_TYPES[1]))
    runtime = NativeRuntime.load(gguf_dir(tmp_path))
    qkv = [type(part).kind for part in runtime.decoder.layers[0].qkv.parts]
    assert qkv == ["q2", "q6", "iq4"]  # attn_q Q2_K, attn_k Q3_K, attn_v IQ2_XXS
    assert [type(part).kind for part in runtime.decoder.layers[0].out.parts] == ["q6"]  # attn_output IQ3_S
    assert [type(part).kind for part in runtime.decoder.layers[0].gate_up.parts] == ["iq4h", "q2"]  # IQ1_M, TQ2_0
    assert [type(part).kind for part in runtime.decoder.layers[0].down.parts] == ["iq4h"]  # ffn_down NVFP4
    compiled_against_reference(runtime, some_token_ids())


def test_iq2_and_iq1_formats_run_through_the_compiled_layers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file's IQ2_XS and IQ2_S tensors (iq4h parts: a sub-scale per 16 weights) beside IQ3_XXS (q6), IQ1_S (iq4 with
    IQ1's table), and MXFP4 (q4t with e2m1's values) beside TQ1_0 (q2), in one native call."""
    import conftest

    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[2], conftest.GGUF_LAYER_TYPES[1]))
    runtime = NativeRuntime.load(gguf_dir(tmp_path))
    qkv = [type(part).kind for part in runtime.decoder.layers[0].qkv.parts]
    assert qkv == ["iq4h", "q6"]  # attn_q IQ2_XS and attn_k IQ2_S side by side in one part, attn_v IQ3_XXS
    assert [type(part).kind for part in runtime.decoder.layers[0].out.parts] == ["iq4"]  # attn_output IQ1_S
    assert [type(part).kind for part in runtime.decoder.layers[0].gate_up.parts] == ["q2", "q4t"]  # TQ1_0, MXFP4
    compiled_against_reference(runtime, some_token_ids())


@pytest.mark.parametrize(
    ("more", "narrowed", "layer", "kinds", "note"),
    [(2, ("MXFP4_EXPONENTS", (200, 201)), "gate_up", ["q2", "int8"], "1 MXFP4"),  # TQ1_0, MXFP4
     (1, ("SUB_SCALE_LIMIT", 0), "down", ["int8"], "1 NVFP4")],
)  # fmt: skip
def test_a_4_bit_float_tensor_whose_scales_a_part_cannot_hold_is_read_as_floats(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    more: int,
    narrowed: tuple[str, Any],
    layer: str,
    kinds: list[str],
    note: str,
) -> None:
    """An MXFP4 tensor with a block scale outside float16's values, or an NVFP4 one whose superblock's scales share no
    power of two within int8 (here: every block, by narrowing the range), is stored in 7 bits like a type without a
    decoder, and packing says so, rather than failing or rounding its scales."""
    import conftest

    from quickdraft.runtime.native import gguf_fp4

    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[more], conftest.GGUF_LAYER_TYPES[1]))
    monkeypatch.setattr(gguf_fp4, *narrowed)
    runtime = NativeRuntime.load(gguf_dir(tmp_path), LoadOptions(progress=True))
    assert [type(part).kind for part in getattr(runtime.decoder.layers[0], layer).parts] == kinds
    assert f"stored in 7 bits per output channel ({note}, 1 F16, 1 BF16)" in capsys.readouterr().err


def test_one_kind_with_different_tables_stays_in_parts_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q4_0 beside IQ4_NL (q4t parts with the tables −8..7 and kvalues_iq4nl) and IQ4_XS beside IQ2_XXS (iq4 parts with
    IQ4's and IQ2's tables): a part holds one table for all its rows, so each becomes a part of its own."""
    import conftest

    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", (MORE_TYPES[3], conftest.GGUF_LAYER_TYPES[1]))
    runtime = NativeRuntime.load(gguf_dir(tmp_path))
    layer = runtime.decoder.layers[0]
    assert [type(part).kind for part in layer.qkv.parts] == ["q4t", "q4t", "iq4"]
    assert [type(part).kind for part in layer.gate_up.parts] == ["iq4", "iq4"]
    compiled_against_reference(runtime, some_token_ids())


def test_names_map_to_transformers_tensors() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert hf_tensor_name("blk.0.attn_k.bias") == "model.layers.0.self_attn.k_proj.bias"
    assert hf_tensor_name("blk.0.attn_norm.bias") is None
    assert hf_tensor_name("rope_freqs.weight") is None
    assert hf_tensor_name("blk.2.attn_qkv.weight", fused=True) == "model.layers.2.self_attn.qkv_proj.weight"
    assert hf_tensor_name("blk.2.ffn_up.weight", fused=True) == "model.layers.2.mlp.gate_up_proj.weight"
    assert hf_tensor_name("blk.2.ffn_up.weight") == "model.layers.2.mlp.up_proj.weight"
    assert hf_tensor_name("blk.1.ffn_norm.weight", SANDWICH_NORMS) == "model.layers.1.pre_feedforward_layernorm.weight"
    olmo_mlp_out = hf_tensor_name("blk.1.post_ffw_norm.weight", POST_NORMS)
    assert olmo_mlp_out == "model.layers.1.post_feedforward_layernorm.weight"
    assert hf_tensor_name("blk.1.attn_norm.weight", POST_NORMS) is None  # OLMo 2 has no input norms: none is read
    assert hf_tensor_name("blk.1.post_attention_norm.weight") is None  # nor does Llama have output norms


def test_llama_rows_are_reordered_as_transformers_does() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    values = np.arange(8 * 64 * 3, dtype=np.float32).reshape(8 * 64, 3)  # 8 heads of 64 rows
    expected = LlamaTensorProcessor()._reverse_permute_weights(values, 8, 2)  # k: 2 key-value heads
    assert np.array_equal(unpermute_rows(values, 2), expected)
    assert not np.array_equal(unpermute_rows(values, 8), values)


def test_a_missing_or_damaged_gguf_file_gives_clear_errors(tmp_path: Path) -> None:
    directory = gguf_dir(tmp_path)
    gguf_path = tmp_path / "qwen2.gguf"
    gguf_path.write_bytes(gguf_path.read_bytes()[:5000])  # cut short: its tensors are not all there
    with pytest.raises(ModelFilesError, match=r"qwen2\.gguf is not a GGUF file quickdraft can read: .* cut short"):
        NativeRuntime.load(directory)
    gguf_path.unlink()
    assert not NativeRuntime.supports(directory)
    assert runtime_for("auto", directory).name == "transformers"
    with pytest.raises(ModelFilesError, match=r"reads its weights from .*qwen2\.gguf, which is missing"):
        NativeRuntime.load(directory, LoadOptions(weights="q4"))
    with pytest.raises(ModelFilesError, match=r"reads its weights from .*qwen2\.gguf, which is missing"):
        load_hf_model(directory)  # no fp32 copy to make either


def test_a_loaded_gguf_model_runs(tmp_path: Path) -> None:
    """The runtime built from the file computes the logits of the one built from the fp32 copy, bit for bit."""
    directory = gguf_dir(tmp_path)
    runtime = NativeRuntime.load(directory)
    reference = NativeRuntime.load(as_old_layout(directory, tmp_path / "old"))
    tokens = torch.tensor([[1, 5, 9, 13]])
    logits = runtime.forward(tokens, runtime.new_cache())
    assert logits.shape == (1, 4, 64) and torch.equal(logits, reference.forward(tokens, reference.new_cache()))


def test_a_tensor_type_the_runtime_does_not_read_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conftest

    layers = [dict(types) for types in conftest.GGUF_LAYER_TYPES]
    layers[1]["ffn_up"] = "Q8_K"  # llama.cpp's type for activations, which gguf-py does not read
    monkeypatch.setattr(conftest, "GGUF_LAYER_TYPES", tuple(layers))
    gguf_path = write_tiny_gguf(tmp_path / "q8k.gguf")
    directory = resolve_model(gguf_path, progress=False)
    with pytest.raises(ModelFilesError, match=r"blk\.1\.ffn_up\.weight is stored as Q8_K, which the native runtime"):
        NativeRuntime.load(directory)


def test_a_tensor_no_layer_reads_is_refused(tmp_path: Path) -> None:
    """A misnamed ``output.weight`` made the model tied and answered from the embedding, without a word; llama.cpp
    refuses such a file, and so does the native runtime."""
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes().replace(b"output.weight", b"outpux.weight", 1)
    (tmp_path / "misnamed.gguf").write_bytes(data)
    directory = resolve_model(tmp_path / "misnamed.gguf", progress=False)
    with pytest.raises(ModelFilesError, match=r"tensors that no layer of its architecture reads: outpux\.weight"):
        NativeRuntime.load(directory)


@pytest.mark.parametrize(
    ("tensor", "value"),
    [("blk.0.attn_norm.weight", np.float32("nan")), ("blk.0.attn_q.weight", np.float16("inf"))],
    ids=["a norm's weight", "a Q4_K block's scale"],
)
def test_nan_or_infinite_weights_are_refused(tmp_path: Path, tensor: str, value: np.generic) -> None:
    """A damaged file whose weights hold NaN or inf ran and answered nonsense; it is refused, naming the tensor, by
    the native runtime and by the fp32 copy the transformers runtime loads."""
    from gguf import GGUFReader

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    offset = next(found.data_offset for found in GGUFReader(path).tensors if found.name == tensor)
    data = bytearray(path.read_bytes())
    data[offset : offset + value.nbytes] = value.tobytes()  # the first weight, or the first block's scale d
    (tmp_path / "damaged.gguf").write_bytes(bytes(data))
    directory = resolve_model(tmp_path / "damaged.gguf", progress=False)
    with pytest.raises(ModelFilesError, match=rf"tensor {re.escape(tensor)} holds NaN or infinite values"):
        NativeRuntime.load(directory)
    with pytest.raises(ModelFilesError, match="holds NaN or infinite values: the file is damaged"):
        ensure_fp32_weights(directory, progress=False)  # the transformers runtime's copy
    assert not has_fp32_weights(directory)


def test_every_familys_gguf_config_is_read_by_transformers_or_by_quickdraft() -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from quickdraft.models.convert import OWN_CONFIG_VARIANTS, OWN_CONFIGS
    from quickdraft.runtime.native.architecture import ARCHITECTURES

    variants = {model_type: architecture for (architecture, _), model_type in OWN_CONFIG_VARIANTS.items()}
    for family in ARCHITECTURES.values():
        architecture = family.gguf_architecture
        if family.model_type in variants:  # another family's files holding a key of its own (experts, windows)
            assert variants[family.model_type] == architecture
            continue
        # a family with experts whose architecture's files with experts are read as another family's: not read
        assert family.sparse_mlp is None or (architecture, "expert_count") not in OWN_CONFIG_VARIANTS, architecture
        transformers_name = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}.get(
            architecture, architecture
        )  # its renaming
        readers = (transformers_name in GGUF_CONFIG_MAPPING) + (architecture in OWN_CONFIGS)
        assert readers == 1, architecture
        assert OWN_CONFIGS.get(architecture, family.model_type) == family.model_type


@pytest.mark.parametrize(
    "expert_types", [None, dict.fromkeys(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), "MXFP4")]
)
def test_a_mixture_of_experts_is_read_from_its_files_tensors_of_every_expert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expert_types: dict[str, str] | None
) -> None:
    """A Qwen3-MoE file (experts of K-quants and Q8_0, or all MXFP4 as llama.cpp's MXFP4_MOE writes them): each
    expert's slice of ``ffn_*_exps`` kept as stored (its weights gguf-py's dequantization of that slice), the router as
    float32; the compiled layers give the PyTorch path's logits, and both are transformers' own reading of the file to
    the 8-bit activations' error."""
    import conftest
    from gguf import GGUFReader
    from gguf.quants import dequantize

    if expert_types is not None:
        monkeypatch.setattr(conftest, "GGUF_EXPERT_TYPES", expert_types)
    types = conftest.GGUF_EXPERT_TYPES
    gguf_path = write_tiny_gguf(tmp_path / "moe.gguf", "qwen3moe", experts=4)
    write_model_dir(gguf_path, tmp_path / "hf", "0" * 64)
    config = DecoderConfig.from_dir(tmp_path / "hf")
    assert (config.layer_experts, config.num_experts, config.experts_per_token) == ((True, True), 4, 2)
    assert (config.expert_intermediate_size, config.normalize_expert_weights) == (256, True)  # llama.cpp's rule
    runtime = NativeRuntime.load(tmp_path / "hf")
    experts = runtime.decoder.layers[1].experts
    kinds = {"Q4_K": "q4", "Q6_K": "q6", "Q8_0": "q8", "MXFP4": "q4t"}
    expected = [kinds[types[name]] for name in ("ffn_gate_exps", "ffn_up_exps")]
    assert [type(part).kind for part in experts.gate_up[3].parts] == expected[: 1 + (expected[0] != expected[1])]
    stored = {tensor.name: tensor for tensor in GGUFReader(gguf_path).tensors}
    down = stored["blk.1.ffn_down_exps.weight"]
    assert torch.equal(experts.down[3].dequantize(), torch.from_numpy(dequantize(down.data[3], down.tensor_type)))
    assert torch.equal(experts.router, torch.from_numpy(np.copy(stored["blk.1.ffn_gate_inp.weight"].data)))
    token_ids = some_token_ids()
    compiled = compiled_against_reference(runtime, token_ids)
    with torch.no_grad():
        transformers_logits = load_hf_model(tmp_path / "hf", progress=False)(token_ids).logits
    assert float((compiled - transformers_logits).abs().max()) <= 0.03 * float(transformers_logits.abs().max())


def test_expert_slices_take_their_names_and_rows() -> None:
    from quickdraft.runtime.native.architecture import ARCHITECTURES
    from quickdraft.runtime.native.gguf_weights import expert_slices

    sparse = ARCHITECTURES["qwen3_moe"].sparse_mlp
    assert hf_tensor_name("blk.2.ffn_up_exps.5.weight", sparse=sparse) == "model.layers.2.mlp.experts.5.up_proj.weight"
    assert hf_tensor_name("blk.2.ffn_gate_inp.weight", sparse=sparse) == "model.layers.2.mlp.gate.weight"
    assert hf_tensor_name("blk.2.ffn_up_exps.5.weight") is None  # a family without experts reads none
    mixtral = ARCHITECTURES["mixtral"].sparse_mlp
    assert hf_tensor_name("blk.0.ffn_down_exps.1.weight", sparse=mixtral) == (
        "model.layers.0.block_sparse_moe.experts.1.w2.weight")  # fmt: skip
    qwen2_moe = ARCHITECTURES["qwen2_moe"].sparse_mlp
    assert (
        hf_tensor_name("blk.1.ffn_up_shexp.weight", sparse=qwen2_moe)
        == "model.layers.1.mlp.shared_expert.up_proj.weight"
    )
    assert hf_tensor_name("blk.1.ffn_gate_inp_shexp.weight", sparse=qwen2_moe) == (
        "model.layers.1.mlp.shared_expert_gate.weight")  # fmt: skip
    assert hf_tensor_name("blk.1.ffn_up_shexp.weight", sparse=sparse) is None  # Qwen3-MoE has no shared expert

    class Tensor:  # a gguf ReaderTensor's fields
        name, tensor_type, shape = "blk.0.ffn_up_exps.weight", "F32", (8, 3, 2)  # GGUF's order: width, rows, experts
        data = np.arange(48, dtype=np.float32).reshape(2, 3, 8)

    first, second = expert_slices([Tensor()])
    assert (first.name, second.name) == ("blk.0.ffn_up_exps.0.weight", "blk.0.ffn_up_exps.1.weight")
    assert second.shape == (8, 3)
    assert np.array_equal(second.data, Tensor.data[1])


@pytest.mark.parametrize("tied", [False, True])
def test_each_tensor_is_decoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tied: bool) -> None:
    """Packing reads each kept tensor's blocks once: asking whether a weight is kept does not decode it, and a tied
    LM head takes the blocks its embedding just decoded."""
    from quickdraft.runtime.native import gguf_exact

    decoded: list[int] = []
    for name, decode in list(gguf_exact.EXACT_DECODERS.items()):

        def counted(raw: np.ndarray, rows: int, width: int, decode=decode):
            decoded.append(raw.__array_interface__["data"][0])
            return decode(raw, rows, width)

        monkeypatch.setitem(gguf_exact.EXACT_DECODERS, name, counted)
    NativeRuntime.load(gguf_dir(tmp_path, tied=tied))
    assert decoded and len(decoded) == len(set(decoded))


def test_packing_shows_a_bar_only_when_it_packs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = gguf_dir(tmp_path)
    NativeRuntime.load(directory, LoadOptions(progress=True))
    shown = capsys.readouterr().err
    assert "pack qwen2.gguf" in shown
    assert "qwen2.gguf: linear weights stored in 7 bits per output channel (1 F16, 1 BF16)" in shown  # layer 1's q, k
    NativeRuntime.load(directory, LoadOptions(progress=True))  # from the cache
    assert "pack" not in capsys.readouterr().err
    (tmp_path / "quiet").mkdir()
    NativeRuntime.load(gguf_dir(tmp_path / "quiet"), LoadOptions())
    assert "pack" not in capsys.readouterr().err
