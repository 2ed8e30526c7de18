"""A GGUF file with every linear weight of its layers requantized to NVFP4 (the rest copied as it is): a real model in
NVFP4, for timing and for how many tensors load as stored. gguf-py writes no NVFP4, so each run of 16 weights takes the
scale byte of gguf-py's fp32_to_ue4m3 for its largest magnitude over 6 (e2m1's largest value) and each weight the
nearest of the scaled values. Prints how many tensors ``gguf_fp4.nvfp4_fits`` keeps as stored.

    .venv/bin/python results/nvfp4-zen4/nvfp4_file.py SOURCE.gguf OUT.gguf
"""

from __future__ import annotations

import re
import sys

import gguf
import numpy as np

from quickdraft.runtime.native.gguf_fp4 import nvfp4_fits

LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
ROWS = 256  # rows quantized at a time
VALUES = np.array(gguf.quants.NVFP4.kvalues, dtype=np.float32)  # e2m1's values doubled


def nvfp4_rows(values: np.ndarray) -> np.ndarray:
    """float32 ``[rows, width]`` -> NVFP4 bytes ``[rows, width / 64 · 36]``."""
    rows, width = values.shape
    runs = values.reshape(rows, width // 64, 4, 16)
    scale_bytes = gguf.quants.NVFP4.fp32_to_ue4m3(np.abs(runs).max(axis=-1) / 6)  # [rows, B, 4]
    scales = gguf.quants.NVFP4.ue4m3_to_fp32(scale_bytes)[..., None, None]  # [rows, B, 4, 1, 1]: halved
    codes = np.abs(scales * VALUES - runs[..., None]).argmin(axis=-1).astype(np.uint8)  # [rows, B, 4, 16]
    packed = codes[..., :8] | (codes[..., 8:] << 4)  # [rows, B, 4, 8]
    return np.concatenate([scale_bytes, packed.reshape(rows, width // 64, 32)], axis=-1).reshape(rows, -1)


def main() -> None:
    source, out = sys.argv[1:3]
    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    kept = total = 0
    for tensor in reader.tensors:
        if LINEAR.fullmatch(tensor.name):
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            data = np.concatenate([nvfp4_rows(values[i : i + ROWS]) for i in range(0, len(values), ROWS)])
            kept, total = kept + nvfp4_fits(data, *values.shape), total + 1
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out}: {kept} of {total} NVFP4 tensors fit iq4h")


if __name__ == "__main__":
    main()
