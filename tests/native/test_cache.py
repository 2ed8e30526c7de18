"""The native KV cache's memory: no transparent huge pages, where every (layer, head) span would take 2 MB."""

from __future__ import annotations

import sys

import pytest
from conftest import native_from_hf, tiny_model


def vm_flags(address: int) -> list[str]:
    """The flags of the mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(bound, 16) for bound in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and smaps are Linux's")
def test_cache_memory_takes_no_huge_pages() -> None:
    runtime = native_from_hf(tiny_model(32, seed=0), capacity=4096)
    cache = runtime.new_cache(1)
    for tensor in (cache.static.keys, cache.static.values):
        assert "nh" in vm_flags(tensor.data_ptr())  # MADV_NOHUGEPAGE
