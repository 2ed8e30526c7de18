"""A/B of attention.h before/after, cold caches: each call reads another of N copies (128 MB in all), as a model's
layers do. One KV head's group of HEADS query heads, D 128. Median over rounds of the mean µs a call.

tests/native/attention_capi.cpp built against each attention.h (old = d8c207d's, g = this change's) with the runtime's
flags, into /tmp/attnab/{old,g}_{avx512,avx2}.so:
    g++ -std=c++17 -O3 -ffp-contract=off -march=native [-mno-avx512f] -shared -fPIC -I<dir> attention_capi.cpp -o ...
    python kernels_ab.py HEADS ISAS VARIANTS LENGTHS      # e.g. 6 avx512,avx2 old,g 4096,16384
"""

import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "native"))
from test_attention_isa import blocked_keys
from test_gemm import pointer

HEAD_DIM = 128
heads, isas, variants = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
contexts = [int(text) for text in sys.argv[4].split(",")]
libraries = {(v, isa): ctypes.CDLL(f"/tmp/attnab/{v}_{isa}.so") for v in variants for isa in isas}
generator = torch.Generator().manual_seed(0)


def int64s(values: list[int]) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


for isa in isas:
    for dtype in (torch.float16, torch.float32):
        function = "attend_together_half" if dtype == torch.float16 else "attend_together"
        for context in contexts:
            copies = max(2, (128 << 20) // (context * HEAD_DIM * dtype.itemsize * 2))
            keys = blocked_keys(torch.randn(context, HEAD_DIM, generator=generator)).to(dtype)
            values = torch.randn(context, HEAD_DIM, generator=generator).to(dtype)
            key_copies = [keys.clone() for _ in range(copies)]
            value_copies = [values.clone() for _ in range(copies)]
            for rows in (1, 8):
                lengths = int64s([context - rows + 1 + i for i in range(rows)])
                skips, owns = int64s([0] * rows), int64s([-1] * rows)
                q = torch.randn(rows, heads, HEAD_DIM, generator=generator)  # [R, H, D]
                seconds: dict[str, list[float]] = {v: [] for v in variants}
                outs = {}
                for round_ in range(6):
                    for v in variants if round_ % 2 == 0 else variants[::-1]:
                        attend = getattr(libraries[(v, isa)], function)
                        out = torch.empty_like(q)
                        start = time.perf_counter()
                        for k, vv in zip(key_copies, value_copies, strict=True):
                            attend(
                                pointer(q),
                                skips,
                                lengths,
                                owns,
                                ctypes.c_int64(rows),
                                ctypes.c_int64(heads),
                                pointer(k),
                                pointer(vv),
                                ctypes.c_int64(HEAD_DIM),
                                ctypes.c_float(HEAD_DIM**-0.5),
                                ctypes.c_float(0.0),
                                pointer(out),
                            )
                        seconds[v].append((time.perf_counter() - start) / copies)
                        outs[v] = out
                same = all(torch.equal(outs[variants[0]], outs[v]) for v in variants)
                base = statistics.median(seconds[variants[0]])
                text = " ".join(
                    f"{v} {statistics.median(seconds[v]) * 1e6:.0f}us ({statistics.median(seconds[v]) / base:.2f})"
                    for v in variants
                )
                print(f"{isa} {str(dtype)[6:]} heads {heads} len {context} rows {rows}: {text} same_bits {same}")
