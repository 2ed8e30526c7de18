"""Time q2 against int8 (7 bits, as before) on the Q2_K file's gate+up and q/k shapes, through the runtime's kernels."""
import time, torch
from quickdraft.runtime.native.kernels import native_kernels
from quickdraft.runtime.native.q2k import Q2Part
from quickdraft.runtime.native.parts import Int8Part
torch.set_num_threads(2)
k = native_kernels()
g = torch.Generator().manual_seed(0)
for name, n, width in (("gate+up", 17920, 1536), ("q", 1536, 1536), ("k", 256, 1536)):
    w = torch.randn(n, width, generator=g) * 0.02
    copies = max(1, int(1.5e9 // (n * width)))
    q2s = [Q2Part.from_float(w) for _ in range(min(copies, 12))]
    i8s = [Int8Part.from_float(w) for _ in range(min(copies, 12))]
    for rows in (1, 4, 8):
        x = torch.randint(-127, 128, (rows, width), dtype=torch.int8, generator=g)
        out = torch.empty(rows, q2s[0].padded_rows)
        res = {}
        for label, parts in (("q2", q2s), ("int8", i8s), ("q2 ", q2s), ("int8 ", i8s)):
            best = 1e9
            for rep in range(40):
                p = parts[rep % len(parts)]
                t = time.perf_counter(); p.matmul_into(k, x, out, 0); best = min(best, time.perf_counter() - t)
            res[label.strip()] = min(res.get(label.strip(), 1e9), best * 1e3)
        print(f"{name:8s} rows {rows}: q2 {res['q2']:.3f} ms, int8 {res['int8']:.3f} ms")
