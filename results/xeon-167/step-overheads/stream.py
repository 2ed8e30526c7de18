"""Does the 480 MiB L3 hold a model's weights for a second pass? One thread sums arrays of 8 MB to 2 GB again and
again (numpy); the median pass's GB/s per size:

    cd /tmp && .venv/bin/python results/xeon-167/step-overheads/stream.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def gb_per_s(megabytes: int, passes: int = 8) -> float:
    values = np.ones(megabytes * 1024 * 1024 // 8)
    values.sum()
    times = []
    for _ in range(passes):
        tick = time.perf_counter()
        values.sum()
        times.append(time.perf_counter() - tick)
    return megabytes / 1024 / statistics.median(times)


if __name__ == "__main__":
    for megabytes in (8, 64, 128, 256, 400, 1024, 2048):
        print(f"{megabytes} MB: {gb_per_s(megabytes):.1f} GB/s")
