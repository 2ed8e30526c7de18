"""Fused layer kernels against the per-operation layer, in one process, steps interleaved.

    .venv/bin/python tools/fused_layer_ab.py [MODEL_DIR ...]   (default: the default pair)

The per-operation side is ``Decoder._layer`` with the compiled attention, quantize and combine kernels: the
native runtime as it was before its layers were fused (``657db46``). Prints the median of 20 steps each.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from quickdraft.models import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, prepare
from quickdraft.runtime.native import NativeRuntime
from quickdraft.runtime.native.kernels import native_kernels


def main(paths: list[Path]) -> None:
    kernels = native_kernels()
    assert kernels is not None, "the kernels did not compile"
    for path in paths:
        runtime = NativeRuntime.load(path)
        decoder = runtime.decoder
        scale = decoder.attention_scale
        decoder._attend = lambda q, keys, values, starts, scale=scale: kernels.attend(q, keys, values, starts, scale)
        cache = runtime.new_cache()
        for context in (128, 512):
            cache.truncate(0)
            runtime.forward(torch.randint(0, 1000, (1, context)), cache, last_only=True)
            for num_new in (1, 4):
                times: dict[bool, list[float]] = {True: [], False: []}
                for repeat in range(24):
                    for fused in (True, False) if repeat % 2 else (False, True):
                        decoder.use_kernel = fused
                        started = time.perf_counter()
                        runtime.forward(torch.randint(0, 1000, (1, num_new)), cache)
                        times[fused].append(time.perf_counter() - started)
                        cache.truncate(context)
                per_op, fused = (1000 * statistics.median(times[key][4:]) for key in (False, True))
                print(
                    f"{path}: {context} cached, {num_new} new: per-op {per_op:.1f} ms, fused {fused:.1f} ms, "
                    f"{per_op / fused:.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main(
        [Path(arg) for arg in sys.argv[1:]] or [prepare(KNOWN_MODELS[name]) for name in (DEFAULT_DRAFT, DEFAULT_TARGET)]
    )
