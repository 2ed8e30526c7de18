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
def _first_processor() -> tuple[tuple[str, str], ...]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none): it speaks for all."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return tuple(fields.items())


def cpu_description() -> dict[str, Any]:
    """The processor as /proc/cpuinfo names it (model name, family, model), its ISA flags that decide
    our kernels' speed and the core count: what a measured cost is valid for."""
    fields = dict(_first_processor())
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
    """A short stable digest of what a ``-march=native`` build depends on: the processor's model and
    every instruction-set flag it reports (a VM may hide some of a model's flags), not its core count."""
    fields = dict(_first_processor())
    build = {
        "arch": platform.machine(),
        "name": fields.get("model name"),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "flags": sorted(set(fields.get("flags", "").split())),
    }
    return hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()[:12]


def memory_bytes() -> int | None:
    """This machine's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
