"""Do huge pages make the weights faster to stream? In one process, the models' weights as loaded (4 KB pages) and
copied into 2 MB-page memory (an anonymous private map advised MADV_HUGEPAGE), switched back and forth, forwards
timed after each switch. A probe kept beside its output (`output.txt`); not built into the runtime.

    cd /tmp && .venv/bin/python results/xeon-167/hugepages/hugepages.py
"""

from __future__ import annotations

import mmap
import statistics
import time
from typing import Any

import torch

from quickdraft.api import Pipeline

HUGE_PAGE = 2 << 20
SMALLEST = 1 << 16  # tensors under 64 KB stay where they are


def tensors_of(obj: Any, seen: set[int], found: list[torch.Tensor], depth: int = 0) -> None:
    """Every tensor reachable from a model's attributes (lists, dicts, quickdraft objects)."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found.append(obj)
    elif isinstance(obj, list | tuple | dict):
        for item in obj.values() if isinstance(obj, dict) else obj:
            tensors_of(item, seen, found, depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("quickdraft"):
        for item in vars(obj).values():
            tensors_of(item, seen, found, depth + 1)


def copy_to_huge_pages(model: Any) -> tuple[mmap.mmap, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """The map, and (tensor, its 4 KB-page storage, its copy in huge pages) for each large contiguous tensor."""
    found: list[torch.Tensor] = []
    tensors_of(model, set(), found)
    large = [tensor for tensor in found if tensor.nbytes >= SMALLEST and tensor.is_contiguous()]
    total = sum((tensor.nbytes + 63) // 64 * 64 for tensor in large)
    memory = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(mmap.MADV_HUGEPAGE)
    arena = torch.frombuffer(memory, dtype=torch.uint8)
    offset = (-arena.data_ptr()) % HUGE_PAGE
    pairs = []
    for tensor in large:
        copy = arena[offset : offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        copy.copy_(tensor)
        pairs.append((tensor, tensor.view(tensor.shape), copy))
        offset += (tensor.nbytes + 63) // 64 * 64
    return memory, pairs


def anon_huge_pages() -> str:
    with open("/proc/self/smaps_rollup") as rollup:
        return next(line for line in rollup.read().splitlines() if "AnonHuge" in line)


def main() -> None:
    pipeline = Pipeline.load()
    models = {"target": pipeline.target, "draft": pipeline.draft}
    caches = {name: model.new_cache(1) for name, model in models.items()}
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 150000, (1, 300), generator=generator)

    def forward_ms(name: str, k: int) -> float:
        token_ids = torch.randint(0, 150000, (1, k), generator=generator)
        started = time.perf_counter()
        models[name].forward(token_ids, caches[name])
        elapsed = time.perf_counter() - started
        caches[name].truncate(300)
        return 1000 * elapsed

    def measure(label: str) -> torch.Tensor:
        logits = {}
        for name, model in models.items():
            caches[name].truncate(0)
            logits[name] = model.forward(prompt, caches[name], last_only=True)
        times: dict[tuple[str, int], list[float]] = {}
        for _ in range(3):
            for name in models:
                for k in (1, 9):
                    times.setdefault((name, k), []).extend(forward_ms(name, k) for _ in range(5))
        report = [f"{n} k={k} med {statistics.median(v):.1f} min {min(v):.1f}" for (n, k), v in times.items()]
        print(label, anon_huge_pages(), " | ".join(report), flush=True)
        return logits["target"]

    copies = [copy_to_huge_pages(model) for model in models.values()]
    print("moved MB", [round(sum(t.nbytes for t, _, _ in pairs) / 2**20) for _, pairs in copies])
    for _ in range(3):
        for _, pairs in copies:
            for tensor, small_pages, _ in pairs:
                tensor.set_(small_pages)
        before = measure("4K pages ")
        for _, pairs in copies:
            for tensor, _, huge_pages in pairs:
                tensor.set_(huge_pages)
        after = measure("huge pages")
        print("same logits:", torch.equal(before, after))


if __name__ == "__main__":
    main()
