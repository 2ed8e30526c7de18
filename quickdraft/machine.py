"""What processor this is: what a measurement or a native build is only valid for.

Machines of one name differ: "AMD EPYC" has meant an AVX2 core without VNNI on one host and an
AVX-512 core with VNNI, three times the int8 throughput, on another. Cost models, bench results
and kernels compiled with ``-march=native`` are therefore keyed by the processor's model and the
instruction sets that decide our kernels' speed, not by its marketing name alone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from typing import Any

# Instruction sets that change which int8/fp32 kernels fbgemm, oneDNN and our compiler use.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


@functools.cache
def cpu_description() -> dict[str, Any]:
    """The processor as /proc/cpuinfo names it (model name, family, model) and its relevant ISA flags."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if not line.strip():
                    break  # the first processor speaks for all
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {
        "name": fields.get("model name") or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "cpu_count": os.cpu_count(),
    }


def cpu_fingerprint() -> str:
    """A short stable digest of :func:`cpu_description`: equal on processors that run our kernels alike."""
    encoded = json.dumps(cpu_description(), sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()[:12]
