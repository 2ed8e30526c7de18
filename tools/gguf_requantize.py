"""A copy of a GGUF file with every linear weight of its layers in another tensor type (the rest copied as it is), for
timing and perplexity on types no model on these machines holds:

- MXFP4: gguf-py's quantizer on the weights' values (llama.cpp's writes MXFP4 only for a mixture's experts).
- NVFP4: per 16 weights the scale byte gguf-py's ``fp32_to_ue4m3`` gives for the largest magnitude over 6 (e2m1's
  largest value), each weight the nearest scaled value (gguf-py writes no NVFP4).
- IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S: random valid blocks under d in [1e-4, 5e-4], for timing only (the text is noise):
  llama.cpp's quantizer makes these types only with an importance matrix.

For MXFP4 and NVFP4 it prints how many tensors the native runtime keeps as stored (``gguf_exact.decodes_exactly``).

    .venv/bin/python tools/gguf_requantize.py SOURCE.gguf OUT.gguf TYPE
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

import gguf
import numpy as np

from quickdraft.runtime.native.gguf_exact import DECODES_WHEN

LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
ROWS = 256  # rows quantized at a time (gguf-py's MXFP4 quantizer holds 16 floats per weight)
FILE_TYPES = {"MXFP4": 38, "IQ2_XXS": 19, "IQ2_XS": 20, "IQ2_S": 28, "IQ1_S": 24}  # llama.cpp's file type for each
E2M1 = np.array(gguf.quants.NVFP4.kvalues, dtype=np.float32)  # e2m1's values doubled


def mxfp4(tensor: gguf.ReaderTensor, generator: np.random.Generator) -> np.ndarray:
    """A tensor -> MXFP4 bytes of its values ``[rows, width / 32 · 17]``."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # [rows, width] float32
    return np.concatenate([gguf.quants.quantize(values[i : i + ROWS], gguf.GGMLQuantizationType.MXFP4)
                           for i in range(0, len(values), ROWS)])  # fmt: skip


def nvfp4(tensor: gguf.ReaderTensor, generator: np.random.Generator) -> np.ndarray:
    """A tensor -> NVFP4 bytes of its values ``[rows, width / 64 · 36]``."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # [rows, width] float32
    return np.concatenate([nvfp4_rows(values[i : i + ROWS]) for i in range(0, len(values), ROWS)])


def nvfp4_rows(values: np.ndarray) -> np.ndarray:
    """float32 ``[rows, width]`` -> NVFP4 bytes ``[rows, width / 64 · 36]``."""
    rows, width = values.shape
    runs = values.reshape(rows, width // 64, 4, 16)
    scale_bytes = gguf.quants.NVFP4.fp32_to_ue4m3(np.abs(runs).max(axis=-1) / 6)  # [rows, B, 4]
    scales = gguf.quants.NVFP4.ue4m3_to_fp32(scale_bytes)[..., None, None]  # [rows, B, 4, 1, 1]: halved
    codes = np.abs(scales * E2M1 - runs[..., None]).argmin(axis=-1).astype(np.uint8)  # [rows, B, 4, 16]
    packed = codes[..., :8] | (codes[..., 8:] << 4)  # [rows, B, 4, 8]
    return np.concatenate([scale_bytes, packed.reshape(rows, width // 64, 32)], axis=-1).reshape(rows, -1)


def random_grid_blocks(kind: str) -> Callable[[gguf.ReaderTensor, np.random.Generator], np.ndarray]:
    """Random grid indices, signs and sub-scales of the IQ type ``kind`` under a float16 d in [1e-4, 5e-4]."""
    weights, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]

    def blocks(tensor: gguf.ReaderTensor, generator: np.random.Generator) -> np.ndarray:
        width, rows = (int(size) for size in tensor.shape[:2])
        data = generator.integers(0, 256, size=(rows, width // weights, block_bytes), dtype=np.uint8)
        d = generator.uniform(1e-4, 5e-4, size=(rows, width // weights, 1)).astype(np.float16)
        data[..., :2] = d.view(np.uint8)
        return data.reshape(rows, -1)

    return blocks


QUANTIZERS = {"MXFP4": mxfp4, "NVFP4": nvfp4} | {kind: random_grid_blocks(kind)
                                                  for kind in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S")}  # fmt: skip


def main() -> None:
    source, out, kind = sys.argv[1:4]
    quantize, qtype, check = QUANTIZERS[kind], gguf.GGMLQuantizationType[kind], DECODES_WHEN.get(kind)
    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE and kind in FILE_TYPES:
            value = FILE_TYPES[kind]
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    generator = np.random.default_rng(0)
    kept = total = 0
    for tensor in reader.tensors:
        if LINEAR.fullmatch(tensor.name):
            width, rows = (int(size) for size in tensor.shape[:2])
            data = quantize(tensor, generator)
            kept, total = kept + (check is not None and check(data, rows, width)), total + 1
            writer.add_tensor(tensor.name, data, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(out if check is None else f"{out}: {kept} of {total} {kind} tensors kept as stored")


if __name__ == "__main__":
    main()
