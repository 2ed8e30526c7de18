"""A GGUF file with every linear weight of its layers requantized to MXFP4 by gguf-py's quantizer (the rest copied as
it is): a real model in MXFP4, for timing and perplexity. llama.cpp's own quantizer writes MXFP4 only for a mixture's
experts (MXFP4_MOE), and these machines hold no dense MXFP4 file.

    .venv/bin/python results/mxfp4-zen4/mxfp4_file.py SOURCE.gguf OUT.gguf
"""

from __future__ import annotations

import re
import sys

import gguf
import numpy as np

LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
FILE_TYPE = 38  # llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE: the closest file type it names
ROWS = 256  # rows quantized at a time (gguf-py's quantizer holds 16 floats per weight)


def mxfp4(tensor: gguf.ReaderTensor) -> np.ndarray:
    """``[rows, width / 32 · 17]`` MXFP4 bytes of the tensor's dequantized values."""
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # [rows, width] float32
    return np.concatenate([gguf.quants.quantize(values[i : i + ROWS], gguf.GGMLQuantizationType.MXFP4)
                           for i in range(0, len(values), ROWS)])  # fmt: skip


def main() -> None:
    source, out = sys.argv[1:3]
    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = FILE_TYPE if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        if LINEAR.fullmatch(tensor.name):
            writer.add_tensor(tensor.name, mxfp4(tensor), raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(out)


if __name__ == "__main__":
    main()
