"""Every weight part format of the native runtime, by name: ``parts.py``'s (int8, q8, q8m), ``kquants.py``'s (q4,
q5, q6), ``q2k.py``'s (q2), ``iquants.py``'s (iq4, iq4h) and ``q4tables.py``'s (q4t, q4tm)."""

from __future__ import annotations

from quickdraft.runtime.native.iquants import IQ4HalfPart, IQ4Part
from quickdraft.runtime.native.kquants import Q4Part, Q5Part, Q6Part
from quickdraft.runtime.native.parts import BlockPart, Int8Part, Q8MinPart, Q8Part, WeightPart
from quickdraft.runtime.native.q2k import Q2Part
from quickdraft.runtime.native.q4tables import Q4TableMinPart, Q4TablePart

FORMATS: tuple[type[WeightPart], ...] = (
    Int8Part,
    Q8Part,
    Q8MinPart,
    Q4Part,
    Q5Part,
    Q6Part,
    IQ4Part,
    IQ4HalfPart,
    Q4TablePart,
    Q4TableMinPart,
    Q2Part,
)
PART_KINDS: dict[str, type[WeightPart]] = {part.kind: part for part in FORMATS}
# those with plain block fields, whose dequantization is ``BlockPart.affine``: every kind but int8
BLOCK_PARTS: dict[str, type[BlockPart]] = {part.kind: part for part in FORMATS if issubclass(part, BlockPart)}
