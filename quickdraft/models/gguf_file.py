"""A GGUF file read once: its metadata as Python values and its tensors as numpy views of the file, every length
checked against the file's end before anything is read or allocated.

quickdraft reads files with this, not gguf-py's ``GGUFReader``, which makes numpy views of every string of a
vocabulary (two for each of a Qwen file's 150,000 tokens and as many merges); the values here are those of its
``ReaderField.contents()`` and the tensors' ``data`` have its dtypes and shapes (tests hold the two readers equal).

Layout rules (:func:`read_gguf`, a ``ModelFilesError`` saying what is wrong):
- The header: the magic ``GGUF``, version 2 or 3, and counts of metadata and tensors the file's size can hold.
- Every metadata value lies within the file: a string's length, an array's count times its items' least size.
- Every tensor has 1 to 4 dimensions of at least 1, a known type whose blocks divide its rows, an offset aligned to
  ``general.alignment`` (32 by default), and bytes inside the data section that no other tensor's overlap, with no
  gap of an alignment or more after them.
"""

from __future__ import annotations

import itertools
import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quickdraft.errors import ModelFilesError

VERSIONS = (2, 3)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUF types
STRING, ARRAY = 8, 9
ITEM_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
               "I32": np.int32, "I64": np.int64}  # fmt: skip  # tensor types held as numbers; the others as bytes


class Corrupt(Exception):
    """What is wrong with the file (the message says it)."""


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
        return self.strings(1, what)[0]

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings one after another (a vocabulary's tokens), each a length and its UTF-8 bytes, in one
        loop."""
        data, at, end, texts = self.data, self.at, len(self.data), []
        for _ in range(count):
            if at + 8 > end or at + 8 + (length := struct.unpack_from("<Q", data, at)[0]) > end:
                raise Corrupt(f"{what} at byte {at} runs past the file's end ({end} bytes): cut short or corrupt")
            texts.append(data[at + 8 : at + 8 + length].decode("utf-8", errors="replace"))
            at += 8 + length
        self.at = at
        return texts

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        """A metadata value of GGUF type ``kind``: a number, a bool, a string or a list of them."""
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
        if item_kind in SCALARS:
            items = np.frombuffer(self.data, "<" + SCALARS[item_kind], count, self.at).tolist()
            self.at += count * least
            return items
        if item_kind == STRING:
            return self.strings(count, what)
        return [self.value(item_kind, what, depth + 1) for _ in range(count)]


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as the file stores it. ``shape``: GGUF's order, the fastest dimension first. ``data``: a view of
    the file, ``[*reversed(shape)]`` numbers for the types of :data:`ITEM_DTYPES`, else bytes ``[*reversed(shape)[:-1],
    bytes a row]``."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # in the data section
    data: np.ndarray = field(repr=False, compare=False)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's metadata (key -> value) and tensors, in the file's order."""

    path: Path
    fields: dict[str, Any]
    tensors: tuple[GGUFTensor, ...]

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))


def read_gguf(path: Path) -> GGUFFile:
    """The GGUF file at ``path``; ``ModelFilesError`` for one whose layout breaks the rules above."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            fields, infos, data_start = _read_layout(Reader(data))
        weights = np.memmap(path, dtype=np.uint8, mode="r") if infos else np.zeros(0, np.uint8)
    except Corrupt as error:
        raise ModelFilesError(f"{path} is not a GGUF file quickdraft can read: {error}") from None
    except (OSError, ValueError) as error:  # unreadable, or empty (an empty file cannot be mapped)
        raise ModelFilesError(f"cannot read {path} as a GGUF file: {error}") from None
    return GGUFFile(path, fields, tuple(_tensor(weights, data_start, *info) for info in infos))


def _read_layout(reader: Reader) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], Any, int]], int]:
    from gguf.constants import GGMLQuantizationType

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
    fields = {}
    for _ in range(keys):
        key = reader.string("a metadata key")
        fields[key] = reader.value(reader.scalar("I", f"the type of {key}"), key)
    infos = []
    for _ in range(tensors):
        name = reader.string("a tensor's name")
        dims = reader.scalar("I", f"{name}'s dimension count")
        if not 1 <= dims <= 4:
            raise Corrupt(f"tensor {name} has {dims} dimensions (1 to 4)")
        shape = tuple(reader.scalar("Q", f"{name}'s shape") for _ in range(dims))
        kind = reader.scalar("I", f"{name}'s type")
        try:
            kind = GGMLQuantizationType(kind)
        except ValueError:
            raise Corrupt(f"tensor {name} has an unknown type {kind}") from None
        infos.append((name, shape, kind, reader.scalar("Q", f"{name}'s offset")))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise Corrupt(f"general.alignment {alignment!r} is not a power of two")
    data_start = -(-reader.at // alignment) * alignment
    _check_tensors(infos, data_start, len(reader.data), alignment)
    return fields, infos, data_start


def _check_tensors(infos: list[tuple[str, tuple[int, ...], Any, int]], start: int, end: int, alignment: int) -> None:
    """Each tensor's bytes lie in the data section, aligned, overlapping no other's."""
    from gguf.constants import GGML_QUANT_SIZES

    spans, names = [], set()
    for name, shape, kind, offset in infos:
        if name in names:
            raise Corrupt(f"it holds two tensors named {name}")
        names.add(name)
        if kind not in GGML_QUANT_SIZES:
            raise Corrupt(f"tensor {name} has an unknown type {int(kind)}")
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if min(shape) < 1 or shape[0] % block:
            raise Corrupt(f"tensor {name} has the shape {list(shape)}, which {kind.name} cannot hold")
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


def _tensor(
    weights: np.ndarray, data_start: int, name: str, shape: tuple[int, ...], kind: Any, offset: int
) -> GGUFTensor:
    from gguf.constants import GGML_QUANT_SIZES

    start, dims = data_start + offset, tuple(reversed(shape))  # numpy's order: the slowest dimension first
    if (dtype := ITEM_DTYPES.get(kind.name)) is not None:
        count = math.prod(shape)
        data = weights[start : start + count * np.dtype(dtype).itemsize].view(dtype).reshape(dims)
    else:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        row_bytes = dims[-1] // block * block_bytes
        data = weights[start : start + math.prod(dims[:-1]) * row_bytes].reshape(*dims[:-1], row_bytes)
    return GGUFTensor(name, kind, shape, offset, data)
