"""Reading a GGUF file's K-quant, 32-weight (Q8_0, Q5_0, Q4_0, Q5_1, Q4_1, IQ4_NL), 4-bit float (MXFP4, NVFP4),
i-quant and ternary tensors as q4, q5, q6, q2, q8, q8m, q4t, q4tm, iq4 and iq4h parts: the same weights as gguf's own
dequantization, bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import gguf_tensor

from quickdraft.runtime.native import parts
from quickdraft.runtime.native.formats import PART_KINDS
from quickdraft.runtime.native.gguf_blocks import decode_q4_k, transformers_name
from quickdraft.runtime.native.gguf_exact import EXACT_DECODERS, exact_weights
from quickdraft.runtime.native.gguf_fp4 import MXFP4_EXPONENTS, mxfp4_fits, nvfp4_fits, ue4m3_parts
from quickdraft.runtime.native.gguf_iquants import SIGNS
from quickdraft.runtime.native.iquants import IQ1_VALUES, IQ2_VALUES, IQ4_VALUES
from quickdraft.runtime.native.kquants import Q4Part, Q5Part, Q6Part

gguf = pytest.importorskip("gguf")


def random_blocks(
    rows: int, width: int, block_bytes: int, scales: slice, seed: int = 0, weights: int = 256
) -> np.ndarray:
    """Raw bytes of a tensor of blocks of ``weights`` weights (a K-quant's 256 or a Q8_0-like type's 32) with every
    field random but its float16 scales at ``scales`` of each block, kept small and positive."""
    generator = np.random.default_rng(seed)
    blocks = generator.integers(0, 256, size=(rows, width // weights, block_bytes), dtype=np.uint8)
    count = (scales.stop - scales.start) // 2
    values = generator.uniform(1e-4, 1e-2, size=(rows, width // weights, count)).astype(np.float16)
    blocks[..., scales] = values.view(np.uint8).reshape(rows, width // weights, 2 * count)
    return blocks.reshape(rows, -1)


def random_q4_k(rows: int, width: int) -> np.ndarray:
    return random_blocks(rows, width, 144, slice(0, 4))  # d and dmin first


def random_q5_k(rows: int, width: int) -> np.ndarray:
    return random_blocks(rows, width, 176, slice(0, 4))  # d and dmin first


def random_q6_k(rows: int, width: int) -> np.ndarray:
    return random_blocks(rows, width, 210, slice(208, 210))  # d last; sub-scales of both signs


def decoded_as_gguf_reads_it(raw: np.ndarray, name: str, rows: int, width: int) -> tuple[str, tuple[torch.Tensor, ...]]:
    """A tensor of type ``name`` decoded (EXACT_DECODERS): its part's weights are gguf-py's dequantization bit for
    bit, and the part gives back the decoded fields. Returns the part kind and the fields."""
    expected = gguf.quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, name)).astype(np.float32)
    kind, fields = EXACT_DECODERS[name](raw, rows, width)
    part = PART_KINDS[kind].from_blocks(*fields)
    assert torch.equal(part.dequantize(), torch.from_numpy(expected)), name
    assert all(torch.equal(a, b) for a, b in zip(part.blocks(), fields, strict=True)), name
    return kind, fields


def test_decoded_blocks_are_ggufs_own_dequantization() -> None:
    raw = random_q4_k(32, 512)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).astype(np.float32))
    codes, sub_scale, sub_min, d, dmin = decode_q4_k(raw, 32, 512)
    assert int(codes.max()) <= 15 and int(sub_scale.max()) <= 63 and int(sub_min.max()) <= 63
    part = Q4Part.from_blocks(codes, sub_scale, sub_min, d, -dmin)  # q4 parts add dmin·m
    assert torch.equal(part.dequantize(), expected)


def test_decoded_q5_k_blocks_are_ggufs_own_dequantization() -> None:
    kind, fields = decoded_as_gguf_reads_it(random_q5_k(32, 768), "Q5_K", 32, 768)
    assert kind == "q5" and int(fields[0].max()) == 31 and int(fields[0].min()) == 0


@pytest.mark.parametrize(("name", "block_bytes", "kind", "low", "high"), [
    ("Q8_0", 34, "q8", -128, 127), ("Q5_0", 22, "q8", -16, 15), ("Q4_0", 18, "q4t", 0, 15), ("Q5_1", 24, "q8m", 0, 31),
    ("Q4_1", 20, "q4tm", 0, 15), ("IQ4_NL", 18, "q4t", 0, 15),
])  # fmt: skip
def test_decoded_legacy_blocks_are_ggufs_own_dequantization(
    name: str, block_bytes: int, kind: str, low: int, high: int
) -> None:
    scales = slice(0, 4 if name.endswith("_1") else 2)  # d, and Q4_1's and Q5_1's min
    raw = random_blocks(32, 256, block_bytes, scales, weights=32)
    decoded, (codes, *_) = decoded_as_gguf_reads_it(raw, name, 32, 256)
    assert decoded == kind and (int(codes.min()), int(codes.max())) == (low, high)


def test_decoded_mxfp4_blocks_are_ggufs_own_dequantization() -> None:
    """Every code and every exponent that float16 holds (2^(e − 128), e in 104..143), blocks of zeros under the
    exponents float16 does not hold (0, as llama.cpp's quantizer writes them, and 255), and gguf-py's own quantization
    of random floats: q4t with e2m1's values doubled; d 0 in the zero blocks."""
    generator = np.random.default_rng(3)
    blocks = generator.integers(0, 256, size=(32, 24, 17), dtype=np.uint8)
    blocks[..., 0] = np.resize(np.arange(MXFP4_EXPONENTS[0], MXFP4_EXPONENTS[1] + 1, dtype=np.uint8), (32, 24))
    blocks[0, :2, 1:] = [[0x00], [0x88]]  # codes 0 and 8: both name zero
    blocks[0, :2, 0] = [0, 255]
    raw = blocks.reshape(32, -1)
    assert mxfp4_fits(raw, 32, 768)
    kind, (codes, table, d) = decoded_as_gguf_reads_it(raw, "MXFP4", 32, 768)
    assert kind == "q4t" and (int(codes.min()), int(codes.max())) == (0, 15) and table[0].tolist()[6:9] == [8, 12, 0]
    assert float(d[0, 0]) == float(d[0, 1]) == 0.0 and float(d.max()) == 2.0**15
    floats = generator.normal(0, 0.05, size=(32, 768)).astype(np.float32)
    quantized = gguf.quants.quantize(floats, gguf.GGMLQuantizationType.MXFP4)
    assert mxfp4_fits(quantized, 32, 768)
    decoded_as_gguf_reads_it(quantized, "MXFP4", 32, 768)


def unfit_fp4(kind: str) -> np.ndarray:
    """Random blocks no part holds: MXFP4 exponents float16 lacks (denormal 2^−128 and 2^−127, 2^−25, 2^16, 2^72)
    under nonzero codes; NVFP4 superblocks whose scales span 2^−10 to 2^4."""
    generator = np.random.default_rng(5)
    if kind == "MXFP4":
        blocks = generator.integers(0, 256, size=(4, 8, 17), dtype=np.uint8)
        blocks[..., 0] = np.resize(np.array([0, 1, 103, 144, 200, 120], dtype=np.uint8), (4, 8))
        return blocks.reshape(4, -1)
    return nvfp4_blocks(4, 256, (0x01, 0x7F))


@pytest.mark.parametrize(("kind", "fits"), [("MXFP4", mxfp4_fits), ("NVFP4", nvfp4_fits)])
def test_an_unfit_4_bit_float_tensor_reads_as_ggufs_floats(kind: str, fits: Any) -> None:
    """A tensor whose blocks no part holds reads as gguf-py's floats, bit for bit (``float_values``, the 7-bit path's
    input), not as a part's decoding of them."""
    from quickdraft.runtime.native.gguf_weights import ExpertSlice, float_values

    raw, qtype = unfit_fp4(kind), gguf.GGMLQuantizationType[kind]
    assert not fits(raw, 4, 256)
    tensor = ExpertSlice("blk.0.ffn_up.weight", qtype, raw, (256, 4))
    expected = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    assert np.array_equal(float_values(tensor).view(np.uint32), expected.view(np.uint32))
    if kind == "NVFP4":
        with pytest.raises(ValueError, match="read it as floats"):
            EXACT_DECODERS[kind](raw, 4, 256)


@pytest.mark.parametrize("exponent", [MXFP4_EXPONENTS[0] - 1, MXFP4_EXPONENTS[1] + 1, 0, 255])
def test_an_mxfp4_block_with_a_value_under_a_scale_float16_lacks_does_not_fit(exponent: int) -> None:
    blocks = np.full((4, 8, 17), 0x11, dtype=np.uint8)  # every weight 1 · 2^(e − 128)
    blocks[..., 0] = 120
    blocks[3, 5, 0] = exponent
    assert not mxfp4_fits(blocks.reshape(4, -1), 4, 256)
    blocks[3, 5, 1:] = 0x80  # the block's values all zero: its exponent does not matter
    assert mxfp4_fits(blocks.reshape(4, -1), 4, 256)


def test_ue4m3_scales_are_ggufs() -> None:
    """Every scale byte's odd c · 2^k is gguf-py's ue4m3_to_fp32 (0x7F zero, 0xFF not)."""
    odd, power = ue4m3_parts()
    values = np.where(odd == 0, 0.0, np.ldexp(odd.astype(np.float64), np.minimum(power, 64)))
    assert np.array_equal(values, gguf.quants.NVFP4.ue4m3_to_fp32(np.arange(256, dtype=np.uint8)).astype(np.float64))
    assert bool((odd[odd > 0] % 2 == 1).all()) and int(odd.max()) <= 15


def nvfp4_blocks(rows: int, width: int, scale_bytes: tuple[int, int], seed: int = 4) -> np.ndarray:
    """Random NVFP4 bytes: every code random, scale bytes drawn from ``[scale_bytes[0], scale_bytes[1])``."""
    generator = np.random.default_rng(seed)
    blocks = generator.integers(0, 256, size=(rows, width // 64, 36), dtype=np.uint8)
    blocks[..., :4] = generator.integers(*scale_bytes, size=(rows, width // 64, 4), dtype=np.uint8)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize(("width", "scale_bytes"), [(768, (0x20, 0x30)), (832, (0x00, 0x20)), (768, (0x78, 0x80))])
def test_decoded_nvfp4_blocks_are_ggufs_own_dequantization(width: int, scale_bytes: tuple[int, int]) -> None:
    """Every code random under scales whose powers lie close (normal bytes of exponents 4 and 5, subnormal and small
    ones, the largest with 0x7F's zero), a width whose last superblock is partial: iq4h with e2m1's values doubled,
    sub-scales c · 2^(k − k0) up to 127 under d = 2^k0."""
    raw = nvfp4_blocks(32, width, scale_bytes)
    assert nvfp4_fits(raw, 32, width)
    kind, (codes, table, sub_scale, d) = decoded_as_gguf_reads_it(raw, "NVFP4", 32, width)
    assert kind == "iq4h" and (int(codes.min()), int(codes.max())) == (0, 15) and table[0].tolist()[6:9] == [8, 12, 0]
    assert sub_scale.shape == (32, width // 16) and d.shape == (32, -(-width // 256)) and int(sub_scale.min()) >= 0


def test_an_nvfp4_superblock_whose_scales_share_no_power_does_not_fit() -> None:
    blocks = nvfp4_blocks(4, 512, (0x21, 0x22)).reshape(4, 8, 36)  # every scale 9 · 2^(4 − 11)
    blocks[2, 5, 0] = 0x70  # 8 · 2^(14 − 11) = 2^6 beside them: a sub-scale of 2^13
    assert not nvfp4_fits(blocks.reshape(4, -1), 4, 512)
    blocks[2, 5, 0] = 0x40  # 8 · 2^(8 − 11) = 2^0: 2^7 = 128, one past int8
    assert not nvfp4_fits(blocks.reshape(4, -1), 4, 512)
    blocks[2, 5, 0] = 0x38  # 2^−1: 64
    assert nvfp4_fits(blocks.reshape(4, -1), 4, 512)
    blocks[2, 5, 0] = 0x7F  # a zero scale: nothing to hold
    assert nvfp4_fits(blocks.reshape(4, -1), 4, 512)


def test_decoded_q2_k_blocks_are_ggufs_own_dequantization() -> None:
    raw = random_blocks(32, 768, 84, slice(80, 84))  # d and dmin last
    kind, (codes, sub_scale, sub_min, d, dmin) = decoded_as_gguf_reads_it(raw, "Q2_K", 32, 768)
    assert kind == "q2" and int(codes.max()) == 3 and int(sub_scale.max()) == 15 and int(sub_min.max()) == 15
    assert bool((d > 0).all()) and bool((dmin < 0).all())  # q2 parts add dmin · m: the file's dmin negated


def test_decoded_q6_k_blocks_are_ggufs_own_dequantization() -> None:
    kind, (codes, sub_scale, _) = decoded_as_gguf_reads_it(random_q6_k(32, 768), "Q6_K", 32, 768)
    assert kind == "q6" and int(codes.max()) == 63 and int(sub_scale.min()) == -128


@pytest.mark.parametrize(
    "name", ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
)
def test_decoding_a_few_rows_at_a_time_gives_the_fields_of_decoding_all_at_once(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The K-quant, 5-bit and grid decoders work CODE_ROWS rows at a time: with 16 at a time, 37 rows decode as all 37
    at once (and as gguf-py dequantizes them)."""
    raw = {
        "Q4_K": random_q4_k,
        "Q5_K": random_q5_k,
        "Q6_K": random_q6_k,
        "Q5_0": lambda rows, width: random_blocks(rows, width, 22, slice(0, 2), weights=32),
        "Q5_1": lambda rows, width: random_blocks(rows, width, 24, slice(0, 4), weights=32),
        "IQ3_XXS": lambda rows, width: random_blocks(rows, width, 98, slice(0, 2)),
        "IQ3_S": lambda rows, width: random_blocks(rows, width, 110, slice(0, 2)),
        "IQ2_XXS": lambda rows, width: random_blocks(rows, width, 66, slice(0, 2)),
        "IQ2_XS": lambda rows, width: random_blocks(rows, width, 74, slice(0, 2)),
        "IQ2_S": lambda rows, width: random_blocks(rows, width, 82, slice(0, 2)),
        "IQ1_S": lambda rows, width: random_blocks(rows, width, 50, slice(0, 2)),
        "IQ1_M": lambda rows, width: gguf_tensor(np.random.default_rng(0), "IQ1_M", rows, width)[0],
    }[name](37, 512)
    kind, whole = decoded_as_gguf_reads_it(raw, name, 37, 512)
    monkeypatch.setattr(parts, "CODE_ROWS", 16)
    chunked_kind, chunked = EXACT_DECODERS[name](raw, 37, 512)
    assert chunked_kind == kind
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(chunked, whole, strict=True))


def test_decoded_q3_k_blocks_are_ggufs_own_dequantization() -> None:
    raw = random_blocks(32, 768, 110, slice(108, 110))  # d last; every code, third bit and sub-scale random
    kind, (codes, sub_scale, _) = decoded_as_gguf_reads_it(raw, "Q3_K", 32, 768)
    assert kind == "q6" and (int(codes.min()), int(codes.max())) == (28, 35)  # values −4 to 3 as q6 codes
    assert (int(sub_scale.min()), int(sub_scale.max())) == (-32, 31)


def test_decoded_iq4_xs_blocks_are_ggufs_own_dequantization() -> None:
    raw = random_blocks(32, 768, 136, slice(0, 2))  # d first; every sub-scale and index random
    kind, (codes, table, sub_scale, _) = decoded_as_gguf_reads_it(raw, "IQ4_XS", 32, 768)
    assert kind == "iq4" and (int(codes.min()), int(codes.max())) == (0, 15)
    assert (int(sub_scale.min()), int(sub_scale.max())) == (-32, 31) and torch.equal(table[0], IQ4_VALUES)


@pytest.mark.parametrize(("name", "block_bytes", "kind", "largest"), [
    ("IQ2_XXS", 66, "iq4", 31), ("IQ2_XS", 74, "iq4h", 31), ("IQ2_S", 82, "iq4h", 31), ("IQ1_S", 50, "iq4", 15),
    ("IQ1_M", 56, "iq4h", 15)])  # fmt: skip
def test_decoded_iq2_and_iq1_blocks_are_ggufs_own_dequantization(
    name: str, block_bytes: int, kind: str, largest: int
) -> None:
    """Every grid index, sign (IQ1: δ's sign) and sub-scale random: codes into six values (IQ2: ±8, ±25, ±43; IQ1:
    ±1, ±7, ±9, eight times value ± 1/8) under d/8, the sub-scales 2·ls + 1 (per 32 weights for IQ2_XXS and IQ1_S, per
    16 for the others) cover 1..31 (IQ1: 1..15)."""
    if name == "IQ1_M":  # its float16 d lies in the top nibbles of its scale words
        raw = gguf_tensor(np.random.default_rng(1), name, 32, 768)[0]
    else:
        raw = random_blocks(32, 768, block_bytes, slice(0, 2))  # d first
    decoded_kind, (codes, table, sub_scale, _) = decoded_as_gguf_reads_it(raw, name, 32, 768)
    assert decoded_kind == kind and (int(codes.min()), int(codes.max())) == (0, 5)
    assert (int(sub_scale.min()), int(sub_scale.max())) == (1, largest)
    assert sub_scale.shape == (32, 768 // (32 if kind == "iq4" else 16))
    assert torch.equal(table[0], IQ1_VALUES if name.startswith("IQ1") else IQ2_VALUES)


@pytest.mark.parametrize(("name", "block_bytes", "code_range"), [("IQ3_XXS", 98, (1, 63)), ("IQ3_S", 110, (17, 47))])
def test_decoded_iq3_blocks_are_ggufs_own_dequantization(name: str, block_bytes: int, code_range: tuple) -> None:
    """Every grid index, sign and sub-scale random: the q6 codes reach the grid's extremes (IQ3_XXS's ±62 as ±31
    under d/2, IQ3_S's ±15), the sub-scales 2·ls + 1 cover 1..31."""
    raw = random_blocks(32, 768, block_bytes, slice(0, 2))  # d first
    kind, (codes, sub_scale, _) = decoded_as_gguf_reads_it(raw, name, 32, 768)
    assert kind == "q6" and (int(codes.min()), int(codes.max())) == code_range
    assert (int(sub_scale.min()), int(sub_scale.max())) == (1, 31)


@pytest.mark.parametrize(("name", "block_bytes", "d_at"), [("TQ2_0", 66, slice(64, 66)), ("TQ1_0", 54, slice(52, 54))])
def test_decoded_ternary_blocks_are_ggufs_own_dequantization(name: str, block_bytes: int, d_at: slice) -> None:
    """Every trit byte random (TQ2_0's fourth code 3 too, which gguf-py reads as 2·d), and gguf-py's own quantization of
    random floats: q2 parts with codes 0..3, sub-scales and sub-mins 1 and dmin = −d."""
    raw = random_blocks(32, 768, block_bytes, d_at)
    kind, (codes, sub_scale, sub_min, d, dmin) = decoded_as_gguf_reads_it(raw, name, 32, 768)
    assert kind == "q2" and int(codes.max()) == (3 if name == "TQ2_0" else 2) and int(codes.min()) == 0
    assert bool((sub_scale == 1).all()) and bool((sub_min == 1).all()) and torch.equal(dmin, -d)
    floats = np.random.default_rng(2).normal(0, 0.05, size=(32, 768)).astype(np.float32)
    quantized = gguf.quants.quantize(floats, getattr(gguf.GGMLQuantizationType, name))
    decoded_as_gguf_reads_it(quantized, name, 32, 768)


def test_iq3_xxs_signs_are_llama_cpps() -> None:
    assert bytes(SIGNS) == gguf.quants.IQ2_XXS.ksigns  # ksigns_iq2xs: the eighth sign keeps the count of minus even


def test_only_tensors_that_match_the_converted_weights_are_taken(tmp_path: Path) -> None:
    q4, q5, q6 = random_q4_k(32, 512), random_q5_k(32, 512), random_q6_k(32, 512)
    types = gguf.GGMLQuantizationType
    q4_values = torch.from_numpy(gguf.quants.dequantize(q4, types.Q4_K).astype(np.float32))
    q5_values = torch.from_numpy(gguf.quants.dequantize(q5, types.Q5_K).astype(np.float32))
    q6_values = torch.from_numpy(gguf.quants.dequantize(q6, types.Q6_K).astype(np.float32))
    writer = gguf.GGUFWriter(tmp_path / "model.gguf", "qwen2")
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_norm.weight"):
        writer.add_tensor(name, q4, raw_dtype=types.Q4_K)  # [32, 512] from its bytes
    writer.add_tensor("blk.0.attn_v.weight", q6, raw_dtype=types.Q6_K)
    writer.add_tensor("blk.0.attn_output.weight", q5, raw_dtype=types.Q5_K)
    q8 = random_blocks(32, 512, 34, slice(0, 2), weights=32)
    q8_values = torch.from_numpy(gguf.quants.dequantize(q8, types.Q8_0).astype(np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=types.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    converted = {
        "model.layers.0.self_attn.q_proj.weight": q4_values,
        "model.layers.0.self_attn.k_proj.weight": q4_values.flip(0),  # rows reordered by a converter: not taken
        "model.layers.0.self_attn.v_proj.weight": q6_values,
        "model.layers.0.self_attn.o_proj.weight": q5_values,
        "model.layers.0.mlp.up_proj.weight": q8_values,
    }
    found = exact_weights(tmp_path / "model.gguf", converted, types=("Q4_K", "Q5_K", "Q6_K", "Q8_0"))
    assert sorted(found) == [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
    ]
    for name, part in (("self_attn.q_proj", Q4Part), ("self_attn.v_proj", Q6Part), ("self_attn.o_proj", Q5Part),
                       ("mlp.up_proj", PART_KINDS["q8"])):  # fmt: skip
        kind, fields = found[f"model.layers.0.{name}.weight"]
        assert kind == part.kind
        assert torch.equal(part.from_blocks(*fields).dequantize(), converted[f"model.layers.0.{name}.weight"])
    assert list(exact_weights(tmp_path / "model.gguf", converted)) == ["model.layers.0.self_attn.q_proj.weight"]


def test_names_map_to_transformers_weights() -> None:
    assert transformers_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj.weight"
    assert transformers_name("output.weight") == "lm_head.weight"
    assert transformers_name("blk.0.attn_q.bias") is None
    assert transformers_name("token_embd.weight") is None
    assert transformers_name("blk.1.ffn_up.weight", fused=True) == "model.layers.1.mlp.gate_up_proj.weight"
    assert transformers_name("blk.1.attn_qkv.weight") is None


def test_a_nan_scale_is_no_error(tmp_path: Path) -> None:
    """A Q8_0 tensor with a NaN scale loads without an error, and its rows fail the match (NaN equals nothing),
    so the tensor is left to the float path."""
    raw = random_blocks(32, 256, 34, slice(0, 2), weights=32)
    raw.reshape(32, 8, 34)[0, 0, 0:2] = np.array([np.nan], dtype=np.float16).view(np.uint8)
    writer = gguf.GGUFWriter(tmp_path / "model.gguf", "qwen2")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).astype(np.float32))
    assert exact_weights(tmp_path / "model.gguf", {"model.layers.0.mlp.up_proj.weight": values}, types=("Q8_0",)) == {}
