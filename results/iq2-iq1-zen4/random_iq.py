"""A GGUF file with every linear weight of its layers replaced by random blocks of an IQ2 or IQ1 type (IQ2_XXS by
default, IQ2_XS, IQ2_S or IQ1_S; the rest copied as it is): a file of that type's size and speed, for timing only
(its text is noise). llama.cpp's quantizer makes these types only with an importance matrix, which these machines
cannot compute without a model of their own.

    .venv/bin/python results/iq2-iq1-zen4/random_iq.py SOURCE.gguf OUT.gguf [IQ2_XXS|IQ2_XS|IQ2_S|IQ1_S]
"""

from __future__ import annotations

import re
import sys

import gguf
import numpy as np

LINEAR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
BLOCK_WEIGHTS = 256
TYPES = {"IQ2_XXS": (66, 19), "IQ2_XS": (74, 20), "IQ2_S": (82, 28), "IQ1_S": (50, 24)}  # block bytes, file type


def random_blocks(rows: int, width: int, block_bytes: int, generator: np.random.Generator) -> np.ndarray:
    """``[rows, width / 256 · block_bytes]`` bytes: random grid indices, signs and sub-scales under d in
    [1e-4, 5e-4]."""
    blocks = generator.integers(0, 256, size=(rows, width // BLOCK_WEIGHTS, block_bytes), dtype=np.uint8)
    d = generator.uniform(1e-4, 5e-4, size=(rows, width // BLOCK_WEIGHTS, 1)).astype(np.float16)
    blocks[..., :2] = d.view(np.uint8)
    return blocks.reshape(rows, -1)


def main() -> None:
    source, out = sys.argv[1:3]
    kind = sys.argv[3] if len(sys.argv) > 3 else "IQ2_XXS"
    block_bytes, file_type = TYPES[kind]
    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(out, architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = file_type if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    generator = np.random.default_rng(0)
    for tensor in reader.tensors:
        if LINEAR.fullmatch(tensor.name):
            width, rows = (int(size) for size in tensor.shape[:2])
            data = random_blocks(rows, width, block_bytes, generator)
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType[kind])
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(out)


if __name__ == "__main__":
    main()
