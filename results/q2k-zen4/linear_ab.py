"""Time q2 against int8 (7 bits, as before) on the Q2_K file's gate+up and q/k shapes, through the runtime's kernels:
best of 40 calls rotating through up to 12 copies of random weights, 2 threads. Run from the repository root:
.venv/bin/python results/q2k-zen4/linear_ab.py"""

import time

import torch

from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.parts import Int8Part
from quickdraft.runtime.native.q2k import Q2Part

torch.set_num_threads(2)
kernels = native_kernels()
generator = torch.Generator().manual_seed(0)
for name, n, width in (("gate+up", 17920, 1536), ("q", 1536, 1536), ("k", 256, 1536)):
    weight = torch.randn(n, width, generator=generator) * 0.02
    copies = min(12, max(1, int(1.5e9 // (n * width))))
    formats = {"q2": [Q2Part.from_float(weight) for _ in range(copies)]}
    formats["int8"] = [Int8Part.from_float(weight) for _ in range(copies)]
    for rows in (1, 4, 8):
        x = torch.randint(-127, 128, (rows, width), dtype=torch.int8, generator=generator)
        out = torch.empty(rows, formats["q2"][0].padded_rows)
        best = dict.fromkeys(formats, float("inf"))
        for _ in range(2):  # the formats take turns
            for label, parts in formats.items():
                for call in range(40):
                    start = time.perf_counter()
                    parts[call % copies].matmul_into(kernels, x, out, 0)
                    best[label] = min(best[label], (time.perf_counter() - start) * 1e3)
        print(f"{name:8s} rows {rows}: q2 {best['q2']:.3f} ms, int8 {best['int8']:.3f} ms")
