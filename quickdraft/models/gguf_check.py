"""A GGUF file's layout checked before anything reads it: gguf-py's reader trusts the counts a file states (an array
said to hold 2**40 items took 20 GB before it failed), and tensors whose bytes lie outside the data, overlap or are
misaligned were read as weights, giving wrong answers without a word.

Rules (:func:`check_gguf`, a ``ModelFilesError`` saying what is wrong):
- The header: the magic ``GGUF``, version 2 or 3, and counts of metadata and tensors the file's size can hold.
- Every metadata value lies within the file: a string's length, an array's count times its items' least size.
- Every tensor has 1 to 4 dimensions of at least 1, a known type whose blocks divide its rows, an offset aligned to
  ``general.alignment`` (32 by default), and bytes inside the data section that no other tensor's overlap.
- The model's sizes (``<architecture>.block_count``, ``embedding_length`` and ``attention.head_count`` present; the
  other head counts and widths where given) are whole numbers of at least 1, its norm epsilon and RoPE base finite
  and above 0, ``block_count`` is the number of ``blk.N`` layers the file holds, and the usual tensors (embedding,
  attention, feed-forward, norms) are as wide and have as many rows as those sizes make them (a layer's ``ffn_up``
  without an ``ffn_gate`` beside it may hold both, twice the rows, as Phi-3's does); the embedding and the output
  layer have a row per token of the vocabulary, as llama.cpp requires.
"""

from __future__ import annotations

import itertools
import math
import mmap
import re
import struct
from pathlib import Path
from typing import Any

from quickdraft.errors import ModelFilesError

VERSIONS = (2, 3)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF types
STRING, ARRAY = 8, 9
SIZES = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
         "attention.key_length", "attention.value_length", "context_length")  # fmt: skip
REQUIRED = ("block_count", "embedding_length", "attention.head_count")  # every architecture llama.cpp runs has them
POSITIVE = ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.freq_base")
LAYER = re.compile(r"blk\.(\d+)\.")


class Corrupt(Exception):
    """What is wrong with the file (the message says it)."""


class Long(int):
    """A long array's length, where its items are not kept."""


class Reader:
    """Little-endian values from a memory map, every read checked against the file's end."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def need(self, size: int, what: str) -> None:
        if size < 0 or self.at + size > len(self.data):
            end = len(self.data)
            raise Corrupt(f"{what} at byte {self.at} runs past the file's end ({end} bytes): cut short or corrupt")

    def scalar(self, code: str, what: str) -> Any:
        size = struct.calcsize("<" + code)
        self.need(size, what)
        (value,) = struct.unpack_from("<" + code, self.data, self.at)
        self.at += size
        return value

    def string(self, what: str) -> str:
        length = self.scalar("Q", what)
        self.need(length, what)
        text = bytes(self.data[self.at : self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        """A metadata value of GGUF type ``kind`` (an array's items are skipped, unless few: the sizes read them)."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY or depth > 1:
            raise Corrupt(f"{what} has an unknown value type {kind}")
        item_kind, count = self.scalar("I", what), self.scalar("Q", what)
        least = struct.calcsize("<" + SCALARS[item_kind]) if item_kind in SCALARS else 8  # a string: its length
        if item_kind not in SCALARS and item_kind not in (STRING, ARRAY):
            raise Corrupt(f"{what} is an array of an unknown value type {item_kind}")
        self.need(count * least, f"{what} (an array said to hold {count} items)")
        if item_kind in SCALARS and count > 64:  # skipped whole: nothing here reads long numeric arrays
            self.at += count * least
            return Long(count)
        items = [self.value(item_kind, what, depth + 1) for _ in range(count)]  # each string's length checked
        return items if count <= 64 else Long(count)  # a vocabulary's tokens: walked, not kept


def check_gguf(path: Path) -> None:
    """Raise ``ModelFilesError`` for a GGUF file whose layout or sizes are wrong (the rules above)."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _check(Reader(data))
    except Corrupt as error:
        raise ModelFilesError(f"{path} is not a GGUF file quickdraft can read: {error}") from None
    except (OSError, ValueError) as error:  # unreadable, or empty (an empty file cannot be mapped)
        raise ModelFilesError(f"cannot read {path} as a GGUF file: {error}") from None


def _check(reader: Reader) -> None:
    reader.need(4, "the magic")
    if bytes(reader.data[:4]) != b"GGUF":
        raise Corrupt("it does not start with GGUF")
    reader.at = 4
    if (version := reader.scalar("I", "the version")) not in VERSIONS:
        raise Corrupt(f"GGUF version {version} (this reader takes {' and '.join(map(str, VERSIONS))})")
    tensors, keys = reader.scalar("Q", "the tensor count"), reader.scalar("Q", "the metadata count")
    for count, least, what in ((tensors, 32, "tensors"), (keys, 13, "metadata entries")):
        if count * least > len(reader.data):
            raise Corrupt(f"it says it holds {count} {what}, more than its {len(reader.data)} bytes can")
    metadata = {}
    for _ in range(keys):
        key = reader.string("a metadata key")
        metadata[key] = reader.value(reader.scalar("I", f"the type of {key}"), key)
    infos = []
    for _ in range(tensors):
        name = reader.string("a tensor's name")
        dims = reader.scalar("I", f"{name}'s dimension count")
        if not 1 <= dims <= 4:
            raise Corrupt(f"tensor {name} has {dims} dimensions (1 to 4)")
        shape = [reader.scalar("Q", f"{name}'s shape") for _ in range(dims)]
        infos.append((name, shape, reader.scalar("I", f"{name}'s type"), reader.scalar("Q", f"{name}'s offset")))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise Corrupt(f"general.alignment {alignment!r} is not a power of two")
    _check_tensors(infos, -(-reader.at // alignment) * alignment, len(reader.data), alignment)
    _check_sizes(metadata, infos)


def _check_tensors(infos: list[tuple[str, list[int], int, int]], start: int, end: int, alignment: int) -> None:
    """Each tensor's bytes lie in the data section, aligned, overlapping no other's."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    spans, names = [], set()
    for name, shape, kind, offset in infos:
        if name in names:
            raise Corrupt(f"it holds two tensors named {name}")
        names.add(name)
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise Corrupt(f"tensor {name} has an unknown type {kind}") from None
        if min(shape) < 1 or shape[0] % block:
            raise Corrupt(f"tensor {name} has the shape {shape}, which {GGMLQuantizationType(kind).name} cannot hold")
        size = math.prod(shape) // block * block_bytes
        if offset % alignment:
            raise Corrupt(f"tensor {name}'s data at offset {offset} is not aligned to {alignment} bytes")
        if start + offset + size > end:
            raise Corrupt(f"tensor {name}'s {size} bytes at offset {offset} run past the file's end: it is cut short "
                          "or corrupt")  # fmt: skip
        spans.append((offset, offset + size, name))
    spans.sort()
    for (_, first_end, first), (second_start, _, second) in itertools.pairwise(spans):
        if second_start < first_end:
            raise Corrupt(f"tensors {first} and {second} share bytes")
        if second_start - first_end >= alignment:  # a writer pads to the alignment, no more
            gap = second_start - first_end
            raise Corrupt(f"{gap} bytes after tensor {first} belong to no tensor: a type or shape is not the one its "
                          "bytes were written with")  # fmt: skip


def _check_sizes(metadata: dict[str, Any], infos: list[tuple[str, list[int], int, int]]) -> None:
    """The model's sizes are whole numbers >= 1 (per layer too), its epsilon and RoPE base > 0, and its layer count
    the file's."""
    architecture = metadata.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise Corrupt("general.architecture is missing or not a name")
    for key in REQUIRED:
        if f"{architecture}.{key}" not in metadata:
            raise Corrupt(f"{architecture}.{key} is missing")
    for key in SIZES:
        value = metadata.get(f"{architecture}.{key}")
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise Corrupt(f"{architecture}.{key} is {value!r}: a whole number of at least 1")
    for key in POSITIVE:
        value = metadata.get(f"{architecture}.{key}")
        if value is not None and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise Corrupt(f"{architecture}.{key} is {value!r}: a finite number above 0")
    layers = {int(match.group(1)) for name, *_ in infos if (match := LAYER.match(name))}
    stated = metadata.get(f"{architecture}.block_count")
    if layers and isinstance(stated, int) and (len(layers) != stated or max(layers) != stated - 1):
        held = f"layers {min(layers)} to {max(layers)}" if len(layers) > 1 else f"layer {min(layers)}"
        raise Corrupt(f"{architecture}.block_count says {stated} layers, but it holds {held}")
    _check_widths(metadata, architecture, infos)
    tokens = metadata.get("tokenizer.ggml.tokens")
    count = tokens if isinstance(tokens, Long) else len(tokens) if isinstance(tokens, list) else None
    for name, shape, _, _ in infos:
        if name in ("token_embd.weight", "output.weight") and count is not None and shape[-1] != count:
            raise Corrupt(f"tensor {name} has {shape[-1]} rows, but the vocabulary has {count} tokens")


def _check_widths(metadata: dict[str, Any], architecture: str, infos: list[tuple[str, list[int], int, int]]) -> None:
    """The usual tensors' widths (GGUF's first dimension: what a row multiplies) are the model's sizes: hidden
    ``embedding_length`` in, or the heads' output for ``attn_output`` and ``feed_forward_length`` for ``ffn_down``;
    and the query, key and value rows the heads' (where the file says how many, of one count for every layer)."""
    hidden, heads = (
        metadata.get(f"{architecture}.embedding_length"),
        metadata.get(f"{architecture}.attention.head_count"),
    )
    kv_heads, ffn = metadata.get(f"{architecture}.attention.head_count_kv", heads), metadata.get(
        f"{architecture}.feed_forward_length")  # fmt: skip
    if not isinstance(hidden, int):
        return
    key = metadata.get(f"{architecture}.attention.key_length") or (hidden // heads if isinstance(heads, int) else None)
    value = metadata.get(f"{architecture}.attention.value_length") or key
    widths = {"token_embd": hidden, "output": hidden, "output_norm": hidden, "attn_norm": hidden,
              "ffn_norm": hidden, "attn_q": hidden, "attn_k": hidden, "attn_v": hidden, "ffn_gate": hidden,
              "ffn_up": hidden}  # fmt: skip
    if isinstance(heads, int) and isinstance(value, int):
        widths["attn_output"] = heads * value
    if isinstance(ffn, int):
        widths["ffn_down"] = ffn
    rows = {"attn_output": hidden, "ffn_down": hidden} | (
        {"ffn_gate": ffn, "ffn_up": ffn} if isinstance(ffn, int) else {}
    )
    if isinstance(heads, int) and isinstance(key, int):
        rows["attn_q"] = heads * key
        if isinstance(kv_heads, int) and isinstance(value, int):
            rows |= {"attn_k": kv_heads * key, "attn_v": kv_heads * value}
    names = {name for name, *_ in infos}
    for name, shape, _, _ in infos:
        if not name.endswith(".weight"):
            continue
        part = name.removesuffix(".weight").rsplit(".", 1)[-1]
        if part in widths and shape[0] != widths[part]:
            raise Corrupt(f"tensor {name} is {shape[0]} wide, but the model's sizes make it {widths[part]}")
        expected = rows.get(part)
        fused = part == "ffn_up" and name.replace(".ffn_up.", ".ffn_gate.") not in names  # Phi-3's gate and up
        if fused and expected is not None and len(shape) > 1 and shape[1] == 2 * expected:
            expected = 2 * expected
        if expected is not None and len(shape) > 1 and shape[1] != expected:
            raise Corrupt(f"tensor {name} has {shape[1]} rows, but the model's sizes make it {expected}")
