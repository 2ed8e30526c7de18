"""How much memory the running requests' caches may take (``serve --kv-cache-mb``), as positions the scheduler
admits requests against (:class:`~quickdraft.engine.scheduler.SchedulerSettings`, ``max_positions``).

Rules:
- A request reserves a position for every prompt token and every token it may generate (``max_tokens``), in the
  target's cache and, where one is loaded, the draft model's: a position costs the sum of their keys and values.
- ``--kv-cache-mb MB`` sets the memory; 0 sets no bound. Without it, the bound is :data:`AUTO_SHARE` of the memory
  available once the models are loaded (the smaller of the system's ``MemAvailable`` and what a cgroup's limit
  leaves), less the prefix cache's budget, times this server's share of the machine (a replica's: one of N).
- Where the memory available cannot be read, or the runtime does not say what a position costs, there is no bound,
  and the note says so.
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.errors import ConfigError

AUTO_SHARE = 0.75  # of the memory available: the rest for activations, the draft's kept caches, the OS
MB = 2**20


def available_bytes(root: Path = Path("/")) -> int | None:
    """Memory this process may still take: the system's available memory, within its cgroup's limit (v2 or v1);
    None where neither can be read."""
    found = []
    meminfo = root / "proc/meminfo"
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    for limit_file, usage_file in (("memory.max", "memory.current"), ("memory/memory.limit_in_bytes", "memory/"
                                   "memory.usage_in_bytes")):  # fmt: skip
        limit, usage = _number(root / "sys/fs/cgroup" / limit_file), _number(root / "sys/fs/cgroup" / usage_file)
        if limit is not None and usage is not None and limit < 2**60:  # v1 writes a huge number for no limit
            found.append(max(0, limit - usage))
    return min(found) if found else None


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # missing, or "max": no limit
        return None


def position_budget(
    kv_cache_mb: int | None, bytes_per_position: int, prefix_cache_mb: int, share: float = 1.0
) -> tuple[int | None, str]:
    """(the positions the running requests may reserve, None: no bound; a line saying so for the user)."""
    if kv_cache_mb == 0:
        return None, "request caches: no bound (--kv-cache-mb 0)"
    if bytes_per_position <= 0:
        return None, "request caches: no bound (this runtime does not say what a cached position costs)"
    if kv_cache_mb is None:
        available = available_bytes()
        if available is None:
            return None, "request caches: no bound (the memory available cannot be read here; give --kv-cache-mb)"
        budget = int((AUTO_SHARE * available - prefix_cache_mb * MB) * share)
        if budget < bytes_per_position:
            raise ConfigError(
                f"too little memory is left for the requests' caches ({available // MB} MB available, "
                f"--prefix-cache-mb {prefix_cache_mb}): lower --prefix-cache-mb or give --kv-cache-mb",
                "kv_cache_mb",
            )
        how = f"{AUTO_SHARE:.0%} of the {available // MB} MB available" + (f", {share:.2g} of it" if share < 1 else "")
    else:
        budget, how = kv_cache_mb * MB, "--kv-cache-mb"
    positions = budget // bytes_per_position
    per = f"{bytes_per_position / 1024:.0f} KiB each"
    return positions, f"request caches: up to {budget // MB} MB ({how}), {positions:,} positions at {per}"
